#include "session/embedding_tables.h"

#include <algorithm>
#include <charconv>
#include <regex>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

namespace oomtune {
namespace {

constexpr std::size_t kTablesNamed = 8;  // a recommender's dozens of tables: the first ones, then a count

bool is_embedding_class(const std::string& qualified_name) {
  static const std::string kPackage = "__torch__.torch.nn.modules.sparse.";
  static const std::string kClass = ".Embedding";
  return qualified_name.rfind(kPackage, 0) == 0 && qualified_name.size() >= kClass.size() &&
         qualified_name.compare(qualified_name.size() - kClass.size(), kClass.size(), kClass) == 0;
}

// An integer input passed to forward, as the job makes it.
struct IndexInput {
  std::string name;
  int64_t low = 0, high = 2;    // values in [low, high) (batch.cpp's default [0, 2))
  std::vector<int64_t> sample;  // its shape without the batch dimension
};

std::vector<IndexInput> index_inputs(const JobSpec& job, const Batch& batch, const std::vector<std::size_t>& which) {
  std::vector<IndexInput> inputs;
  for (std::size_t i : which) {
    const at::Tensor& t = batch.tensors[i];
    if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) continue;
    IndexInput in;
    in.name = batch.names[i];
    for (int64_t d = 0; d < t.dim(); ++d)
      if (static_cast<std::size_t>(d) != batch.batch_axes[i]) in.sample.push_back(t.size(d));
    for (const InputSpec& spec : job.inputs) {
      if (spec.name != in.name) continue;
      in.low = static_cast<int64_t>(spec.low.value_or(0));
      in.high = static_cast<int64_t>(spec.high.value_or(2));
    }
    inputs.push_back(std::move(in));
  }
  return inputs;
}

// "input_ids (values in [0, 1000), 200 long)"
std::string describe(const IndexInput& in) {
  const std::string size = in.sample.size() == 1 ? fmt::format("{} long", in.sample[0])
                           : in.sample.empty()   ? std::string("one per sample")
                                                 : fmt::format("{} per sample", fmt::join(in.sample, "x"));
  return fmt::format("{} (values in [{}, {}), {})", in.name, in.low, in.high, size);
}

int64_t longest(const IndexInput& in) {
  return in.sample.empty() ? 1 : *std::max_element(in.sample.begin(), in.sample.end());
}

std::string tables_list(const std::vector<EmbeddingTable>& tables) {
  std::vector<std::string> named;
  for (std::size_t i = 0; i < tables.size() && i < kTablesNamed; ++i)
    named.push_back(fmt::format("{} ({} rows)", tables[i].name, tables[i].rows));
  if (tables.size() > kTablesNamed) named.push_back(fmt::format("{} more", tables.size() - kTablesNamed));
  return fmt::format("{}", fmt::join(named, ", "));
}

std::string inputs_list(const std::vector<IndexInput>& inputs) {
  std::vector<std::string> described;
  for (const IndexInput& in : inputs) described.push_back(describe(in));
  return fmt::format("{}", fmt::join(described, ", "));
}

}  // namespace

std::vector<EmbeddingTable> embedding_tables(const torch::jit::Module& module) {
  std::vector<EmbeddingTable> tables;
  try {
    for (const torch::jit::NameModule& child : module.named_modules()) {
      const auto type_name = child.value.type()->name();
      if (!type_name || !is_embedding_class(type_name->qualifiedName()) || !child.value.hasattr("weight")) continue;
      const c10::IValue weight = child.value.attr("weight");
      if (!weight.isTensor() || weight.toTensor().dim() != 2) continue;
      tables.push_back({child.name, weight.toTensor().size(0)});
    }
  } catch (const std::exception&) {
    // A module whose attributes cannot be read names no tables.
  }
  return tables;
}

std::string embedding_hint(const std::vector<EmbeddingTable>& tables, const JobSpec& job, const Batch& batch,
                           const std::vector<std::size_t>& which, const std::string& cause) {
  if (tables.empty()) return "";
  const std::vector<IndexInput> inputs = index_inputs(job, batch, which);
  if (inputs.empty()) return "";
  if (cause.find("index out of range in self") != std::string::npos ||
      cause.find("device-side assert") != std::string::npos) {
    return fmt::format(
        "; an index ran past the rows of an embedding table (a sequence longer than the model's positions, or "
        "token ids past its vocabulary); nn.Embedding tables: {}; integer inputs: {}",
        tables_list(tables), inputs_list(inputs));
  }
  // "The size of tensor a (4096) must match the size of tensor b (1024)":
  // the positions a model slices to the input's length stop at 1024.
  static const std::regex kNumber(R"(\((\d+)\))");
  for (auto it = std::sregex_iterator(cause.begin(), cause.end(), kNumber); it != std::sregex_iterator(); ++it) {
    const std::string digits = (*it)[1].str();
    int64_t number = 0;
    if (std::from_chars(digits.data(), digits.data() + digits.size(), number).ec != std::errc()) continue;
    for (const EmbeddingTable& table : tables) {
      if (table.rows != number) continue;
      for (const IndexInput& in : inputs) {
        if (longest(in) <= table.rows) continue;
        return fmt::format(
            "; {} is the number of rows of the model's nn.Embedding {} and {} is {} long: the sequence may be "
            "longer than the model's positions",
            number, table.name, in.name, longest(in));
      }
    }
  }
  return "";
}

}  // namespace oomtune
