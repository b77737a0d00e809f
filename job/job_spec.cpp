#include "job/job_spec.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)
#include <toml++/toml.h>

#include "common/byte_size.h"
#include "common/closest_name.h"
#include "common/error.h"
#include "common/text_file.h"
#include "common/toml_table.h"
#include "job/hyper_parameters.h"
#include "job/parameter_selection_toml.h"

namespace oomtune {
namespace {

const std::vector<std::string> kTopKeys = {
    "model",           "inputs",       "output",        "loss",        "global_batch",
    "remainder",       "optimizer",    "precision",     "allow_bf16",  "allow_adafactor",
    "device",          "budget",       "host_budget",   "headroom",    "min_micro_batch",
    "max_micro_batch", "verify_steps", "trial_timeout", "executor",    "seed",
    "trainable",       "frozen",       "frozen_dtype",  "cuda_target", "seq"};
const std::vector<std::string> kInputKeys = {"name", "shape", "dtype", "range"};
const std::vector<std::string> kSeqKeys = {"min", "max", "distribution", "file"};
const std::vector<std::string> kLossKeys = {"kind", "target"};
const std::vector<std::string> kOptimizerKeys = {"kind", "lr",       "weight_decay",   "betas",
                                                 "eps",  "momentum", "implementation", "max_grad_norm"};
const std::vector<std::string> kDtypes = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "bool"};

/// The canonical dtype for PyTorch's own spellings: the torch. prefix and
/// the aliases torch defines (torch.float is float32, half float16, double
/// float64, long int64, int int32; torch/_tensor_docs.py, "torch.dtype").
std::string canonical_dtype(std::string dtype) {
  if (dtype.rfind("torch.", 0) == 0) dtype.erase(0, 6);
  static const std::pair<const char*, const char*> kAliases[] = {
      {"float", "float32"}, {"half", "float16"}, {"double", "float64"}, {"long", "int64"}, {"int", "int32"}};
  for (const auto& [alias, name] : kAliases)
    if (dtype == alias) return name;
  return dtype;
}

/// A job-spec table: TomlTable plus required keys, defaults, choices and
/// ranges, each error saying FILE:LINE:COLUMN: KEY.
class TableReader : public TomlTable {
 public:
  using TomlTable::TomlTable;

  const toml::node* node(const std::string& key) const { return get(key); }
  const toml::table& table() const { return TomlTable::node(); }

  std::string string(const std::string& key) const {
    require(key);
    return *TomlTable::string(key);
  }
  std::string string_or(const std::string& key, const std::string& fallback) const {
    return TomlTable::string(key).value_or(fallback);
  }
  std::string choice_or(const std::string& key, const std::string& fallback,
                        const std::vector<std::string>& choices) const {
    std::string value = string_or(key, fallback);
    if (std::find(choices.begin(), choices.end(), value) == choices.end())
      fail(key, fmt::format("unknown value '{}' ({})", value, suggest(value, choices)));
    return value;
  }
  int64_t integer(const std::string& key, int64_t min_value) const {
    require(key);
    return *TomlTable::integer(key, min_value);
  }
  int64_t integer_or(const std::string& key, int64_t fallback, int64_t min_value) const {
    return TomlTable::integer(key, min_value).value_or(fallback);
  }
  double number_or(const std::string& key, double fallback, double min_value, double max_value) const {
    const auto value = number(key);
    if (!value) return fallback;
    if (*value < min_value || *value > max_value)
      fail(key, fmt::format("must be in [{}, {}], got {}", min_value, max_value, *value));
    return *value;
  }
  bool boolean_or(const std::string& key, bool fallback) const { return boolean(key).value_or(fallback); }
  const toml::table& table_at(const std::string& key) const {
    require(key);
    return *TomlTable::table(key);
  }

 private:
  void require(const std::string& key) const {
    if (!has(key)) missing(key);
  }
};

/// What makes `input`'s finite low < high range unusable for its dtype, or "".
/// Integer inputs come from at::randint(low, high) with int64 bounds, so the
/// bounds are whole numbers, exact in a double (|x| <= 2^53) and inside the
/// dtype: [-2^31, 2^31] for int32, [0, 2] for bool. Float inputs come from
/// uniform_ on a float32 tensor (session/batch.cpp), so the bounds and their
/// difference are float32-finite, and within ±65504 for float16.
std::string range_problem(const InputSpec& input) {
  const double low = *input.low, high = *input.high;
  const auto bounds = [&](double floor, double ceiling, const char* why) {
    if (low >= floor && high <= ceiling) return std::string();
    return fmt::format("{} takes bounds in [{}, {}] ({}), got [{}, {}]", input.dtype, floor, ceiling, why, low, high);
  };
  if (input.dtype == "int64" || input.dtype == "int32" || input.dtype == "bool") {
    if (low != std::trunc(low) || high != std::trunc(high))
      return fmt::format("integer inputs take whole-number bounds, got [{}, {}]", low, high);
    if (input.dtype == "bool") return bounds(0, 2, "high is exclusive");
    if (input.dtype == "int32") return bounds(-2147483648.0, 2147483648.0, "high is exclusive");
    return bounds(-9007199254740992.0, 9007199254740992.0, "2^53: exact as the double the range is read as");
  }
  const double largest = std::numeric_limits<float>::max();
  if (high - low > largest) return fmt::format("high - low must be a finite float32, got [{}, {}]", low, high);
  if (input.dtype == "float16") return bounds(-65504.0, 65504.0, "float16's largest finite value");
  return bounds(-largest, largest, "values are drawn as float32");
}

/// Why `batch` cannot be a job's global batch (above kMaxGlobalBatch), or "".
std::string global_batch_problem(int64_t batch) {
  if (batch <= kMaxGlobalBatch) return "";
  return fmt::format("must be at most {} samples per optimizer step on one device, got {}", kMaxGlobalBatch, batch);
}

/// The index of the first input whose tensor at micro-batch `batch` would
/// hold more bytes than int64 counts (torch: "Storage size calculation
/// overflowed"), counting 8 bytes an element, or nullopt.
std::optional<std::size_t> oversized_input(const JobSpec& spec, int64_t batch) {
  for (std::size_t i = 0; i < spec.inputs.size(); ++i) {
    double elements = 1;  // a double: the product itself may not fit int64
    for (int64_t dim : spec.inputs[i].shape)
      elements *= static_cast<double>(dim == kBatchDim ? batch : dim == kSeqDim ? spec.seq_len.value_or(1) : dim);
    if (elements * 8 >= 9223372036854775808.0) return i;
  }
  return std::nullopt;
}

std::string oversized_message(const JobSpec& spec, std::size_t index, int64_t batch) {
  const InputSpec& input = spec.inputs[index];
  std::vector<std::string> dims;
  for (int64_t dim : input.shape)
    dims.push_back(dim == kBatchDim ? "\"batch\"" : dim == kSeqDim ? "\"seq\"" : std::to_string(dim));
  return fmt::format("[{}] at the global batch {} has more bytes than a tensor can hold", fmt::join(dims, ", "), batch);
}

InputSpec read_input(const toml::table& table, const std::string& origin, std::size_t index) {
  TableReader reader(table, origin, fmt::format("inputs[{}]", index));
  reader.reject_unknown(kInputKeys);
  InputSpec input;
  input.name = reader.string("name");
  const std::string dtype = reader.string_or("dtype", "float32");
  input.dtype = canonical_dtype(dtype);
  if (std::find(kDtypes.begin(), kDtypes.end(), input.dtype) == kDtypes.end())
    reader.fail("dtype", fmt::format("unknown value '{}' ({}; PyTorch's names work too: torch.long, half, ...)", dtype,
                                     suggest(input.dtype, kDtypes)));
  const toml::node* shape = reader.node("shape");
  if (!shape) reader.fail("shape", "missing required key");
  if (!shape->is_array() || shape->as_array()->empty())
    reader.fail("shape", "expected a non-empty array such as [\"batch\", 64]");
  int batch_dims = 0;
  int seq_dims = 0;
  for (const toml::node& dim : *shape->as_array()) {
    if (dim.is_string() && *dim.value<std::string>() == "batch") {
      input.shape.push_back(kBatchDim);
      ++batch_dims;
    } else if (dim.is_string() && *dim.value<std::string>() == "seq") {
      if (++seq_dims > 1)
        reader.fail_at(dim.source(), "shape",
                       "at most one dimension may be \"seq\" (one sequence length per input), got a second");
      input.shape.push_back(kSeqDim);
    } else if (dim.is_integer() && *dim.value<int64_t>() >= 1) {
      input.shape.push_back(*dim.value<int64_t>());
    } else {
      reader.fail_at(dim.source(), "shape", "each dimension is an integer >= 1 or the word \"batch\" or \"seq\"");
    }
  }
  if (batch_dims != 1) reader.fail("shape", fmt::format("exactly one dimension must be \"batch\", got {}", batch_dims));
  if (const toml::node* range = reader.node("range")) {
    const toml::array* array = range->as_array();
    if (!array || array->size() != 2 || !(*array)[0].is_number() || !(*array)[1].is_number())
      reader.fail("range", "expected [low, high] numbers");
    input.low = reader.number_of((*array)[0], "range");
    input.high = reader.number_of((*array)[1], "range");
    if (!(*input.low < *input.high))
      reader.fail("range", fmt::format("low must be < high, got [{}, {}]", *input.low, *input.high));
    if (const std::string problem = range_problem(input); !problem.empty()) reader.fail("range", problem);
  } else if (input.dtype == "int64" || input.dtype == "int32") {
    reader.fail_at(table.source(), "range", "integer inputs need a range = [low, high) (token ids, labels)");
  }
  return input;
}

void read_inputs(const TableReader& top, JobSpec& spec) {
  const toml::node* node = top.node("inputs");
  if (!node) top.fail_at(top.table().source(), "inputs", "missing required key (an array of [[inputs]] tables)");
  const toml::array* array = node->as_array();
  if (!array || array->empty()) top.fail("inputs", "expected one or more [[inputs]] tables");
  std::set<std::string> names;
  for (std::size_t i = 0; i < array->size(); ++i) {
    const toml::table* table = (*array)[i].as_table();
    if (!table) top.fail_at((*array)[i].source(), fmt::format("inputs[{}]", i), "expected a table");
    InputSpec input = read_input(*table, top.origin(), i);
    if (!names.insert(input.name).second)
      top.fail_at(table->source(), fmt::format("inputs[{}].name", i), fmt::format("duplicate input '{}'", input.name));
    spec.inputs.push_back(std::move(input));
  }
}

void read_loss(const TableReader& top, JobSpec& spec) {
  if (!top.has("loss"))
    top.fail_at(top.table().source(), "loss",
                "missing required table [loss]: kind = \"cross_entropy\" with target = \"INPUT\" (class indices), "
                "\"mse\" with a target, \"mean\" of the output, or \"model_returns_loss\" (docs/job_spec.md)");
  TableReader loss(top.table_at("loss"), top.origin(), "loss");
  loss.reject_unknown(kLossKeys);
  const std::string kind = loss.choice_or("kind", "", {"cross_entropy", "mse", "mean", "model_returns_loss"});
  if (kind == "cross_entropy")
    spec.loss.kind = LossSpec::Kind::kCrossEntropy;
  else if (kind == "mse")
    spec.loss.kind = LossSpec::Kind::kMse;
  else if (kind == "mean")
    spec.loss.kind = LossSpec::Kind::kMean;
  else
    spec.loss.kind = LossSpec::Kind::kModelReturnsLoss;
  const bool needs_target = kind == "cross_entropy" || kind == "mse";
  if (needs_target) {
    spec.loss.target = loss.string("target");
    const InputSpec* target = nullptr;
    std::vector<std::string> names;
    for (const auto& input : spec.inputs) {
      names.push_back(input.name);
      if (input.name == spec.loss.target) target = &input;
    }
    if (!target)
      loss.fail("target", fmt::format("no input named '{}' ({})", spec.loss.target, suggest(spec.loss.target, names)));
    // Class indices: a float target would be truncated to them silently (session/loss.cpp).
    if (kind == "cross_entropy" && target->dtype != "int64" && target->dtype != "int32")
      loss.fail("target", fmt::format("cross_entropy takes class indices: input '{}' must have dtype int64 or "
                                      "int32, got {}",
                                      spec.loss.target, target->dtype));
    // A language model trained on its own tokens (labels = input_ids) is
    // the case users write here: the target is not passed to forward, so
    // the labels are a second input of the ids' shape, cross entropy over
    // every position as transformers' ForCausalLMLoss takes it (labels
    // shifted by padding, the logits not sliced: loss/loss_utils.py).
    if (spec.inputs.size() < 2)
      loss.fail("target", fmt::format("'{}' is the only input, and the target is not passed to forward: add the "
                                      "model's input beside it (a language model trained on its own tokens: an "
                                      "input of the same shape, as in examples/hf_gpt2.toml)",
                                      spec.loss.target));
  } else if (loss.has("target")) {
    loss.fail("target", fmt::format("loss kind '{}' takes no target", kind));
  }
}

void read_optimizer(const TableReader& top, JobSpec& spec) {
  if (!top.has("optimizer")) return;
  TableReader opt(top.table_at("optimizer"), top.origin(), "optimizer");
  opt.reject_unknown(kOptimizerKeys);
  OptimizerSpec& o = spec.optimizer;
  o.kind = opt.choice_or("kind", "adamw", {"adamw", "sgd"});
  if (o.kind == "sgd") o.weight_decay = 0.0;  // torch.optim.SGD's default; AdamW's is 0.01
  read_hyper_parameters(opt, {&o.lr, &o.weight_decay, &o.beta1, &o.beta2, &o.eps, &o.momentum, &o.max_grad_norm});
  const std::string implementation =
      opt.choice_or("implementation", to_string(kDefaultOptimizerImplementation), optimizer_implementation_names());
  o.implementation = *optimizer_implementation_from_name(implementation);
}

void read_output(const TableReader& top, JobSpec& spec) {
  const toml::node* node = top.node("output");
  if (!node) return;
  if (node->is_string())
    spec.output = std::string(*node->value<std::string>());
  else if (node->is_integer() && *node->value<int64_t>() >= 0)
    spec.output = *node->value<int64_t>();
  else
    top.fail("output", "expected a dict key (\"logits\") or a tuple index (0, 1, ...)");
}

// `trainable = [...]` or `frozen = [...]` and frozen_dtype
// (job/parameter_selection_toml.h); bf16 frozen weights need autocast or
// bf16 parameters, where every operator that reads a weight casts it.
void read_parameter_selection(const TableReader& top, JobSpec& spec) {
  spec.trainable = read_parameter_selection(static_cast<const TomlTable&>(top));
  if (spec.trainable.frozen_bf16 && spec.precision != "bf16" && spec.precision != "bf16_params")
    top.fail("frozen_dtype",
             fmt::format("\"bf16\" needs precision = \"bf16\" or \"bf16_params\", got \"{}\": in {} a bf16 frozen "
                         "weight meets {} activations, which matmul refuses",
                         spec.precision, spec.precision, spec.precision == "fp16" ? "float16" : "float32"));
}

// `seq = N`, `seq = [min, max]` (COUNT, tokens, each in [1, kMaxSeqLen]) or
// a distribution of lengths (read_seq_distribution), required when an input
// names "seq" and refused when none does.
void read_seq(const TableReader& top, JobSpec& spec, const std::string& base_dir) {
  const toml::node* node = top.node("seq");
  std::optional<std::size_t> naming;  // the first input naming "seq"
  for (std::size_t i = 0; i < spec.inputs.size() && !naming; ++i)
    if (spec.inputs[i].has_seq()) naming = i;
  if (!node) {
    if (naming) {
      const toml::node& input = *top.node("inputs")->as_array()->get(*naming);
      top.fail_at(input.as_table()->get("shape")->source(), fmt::format("inputs[{}].shape", *naming),
                  "names \"seq\" but the job gives no length: add seq = N (tokens) or seq = [min, max]");
    }
    return;
  }
  if (!naming)
    top.fail("seq", "no input names \"seq\" in its shape (e.g. shape = [\"batch\", \"seq\"]), so no length to set");
  const auto length = [&](const toml::node& value, const std::string& key) {
    if (!value.is_integer())
      top.fail_at(value.source(), key,
                  key == "seq" ? "expected a whole number of tokens, [min, max] or { min = ..., max = ... }"
                               : "expected a whole number of tokens");
    const int64_t n = *value.value<int64_t>();
    if (n < 1 || n > kMaxSeqLen)
      top.fail_at(value.source(), key, fmt::format("must be in [1, {}] tokens, got {}", kMaxSeqLen, n));
    return n;
  };
  if (const toml::array* range = node->as_array()) {
    if (range->size() != 2) top.fail("seq", fmt::format("expected [min, max], got {} values", range->size()));
    const int64_t min = length((*range)[0], "seq"), max = length((*range)[1], "seq");
    if (min > max) top.fail("seq", fmt::format("[min, max] needs min <= max, got [{}, {}]", min, max));
    spec.seq_min = min;
    spec.seq_len = max;
  } else if (const toml::table* table = node->as_table()) {
    const TableReader seq(*table, top.origin(), "seq");
    seq.reject_unknown(kSeqKeys);
    const std::string distribution = seq.choice_or("distribution", "uniform", {"uniform", "histogram"});
    if (distribution == "uniform") {
      if (seq.has("file")) seq.fail("file", "a uniform distribution reads no file; use distribution = \"histogram\"");
      for (const char* key : {"min", "max"})
        if (!seq.has(key))
          seq.fail(key, "missing: a uniform distribution needs min and max (tokens), e.g. { min = 256, max = 1024 }");
      const int64_t min = length(*seq.get("min"), "seq.min"), max = length(*seq.get("max"), "seq.max");
      if (min > max) seq.fail("min", fmt::format("needs min <= max, got min = {}, max = {}", min, max));
      spec.seq_lengths = LengthDistribution::uniform(min, max);
    } else {
      for (const char* key : {"min", "max"})
        if (seq.has(key))
          seq.fail(key, "a histogram's lengths come from its file; leave out min and max (or trim the file)");
      if (!seq.has("file"))
        seq.fail("file", "missing: a histogram reads its lengths from a file of one integer per line");
      std::filesystem::path file(seq.string("file"));
      if (file.is_relative() && !base_dir.empty()) file = std::filesystem::path(base_dir) / file;
      spec.seq_lengths_file = file.lexically_normal().string();
      spec.seq_lengths = LengthDistribution::histogram(read_length_histogram(spec.seq_lengths_file));
      if (spec.seq_lengths->max > kMaxSeqLen)
        throw InputError(fmt::format("{}: holds length {}, above the longest a job may ask for ({} tokens)",
                                     spec.seq_lengths_file, spec.seq_lengths->max, kMaxSeqLen));
    }
    spec.seq_min = spec.seq_lengths->min;
    spec.seq_len = spec.seq_lengths->max;
  } else {
    spec.seq_len = length(*node, "seq");
  }
}

}  // namespace

bool InputSpec::has_seq() const { return std::find(shape.begin(), shape.end(), kSeqDim) != shape.end(); }

void JobSpec::fix_seq_len(int64_t length) {
  seq_len = length;
  seq_min.reset();
  seq_lengths.reset();
  seq_lengths_file.clear();
}

bool JobSpec::has_seq() const {
  return std::any_of(inputs.begin(), inputs.end(), [](const InputSpec& input) { return input.has_seq(); });
}

std::size_t InputSpec::batch_axis() const {
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == kBatchDim) return i;
  return 0;
}

std::vector<const InputSpec*> JobSpec::model_inputs() const {
  std::vector<const InputSpec*> out;
  for (const auto& input : inputs)
    if (input.name != loss.target) out.push_back(&input);
  return out;
}

namespace {
std::optional<int64_t> less_headroom(std::optional<int64_t> bytes, double headroom) {
  if (!bytes) return std::nullopt;
  return static_cast<int64_t>(static_cast<double>(*bytes) * (1.0 - headroom));
}
}  // namespace

std::optional<int64_t> JobSpec::usable_budget_bytes() const { return less_headroom(budget_bytes, headroom); }

std::optional<int64_t> JobSpec::usable_host_budget_bytes() const { return less_headroom(host_budget_bytes, headroom); }

JobSpec parse_job_spec(const std::string& text, const std::string& origin, const std::string& base_dir) {
  const toml::table root = parse_toml(text, origin);
  // A plan.toml (recipes/plan_toml.h) holds [config] and [job], never a model.
  if (!root.contains("model") && root.contains("config")) {
    const std::optional<std::string> spec = root["job"]["spec"].value<std::string>();
    throw InputError(
        fmt::format("{}: is a plan (autotune --emit writes one), not a job spec; run its configuration "
                    "with oomtune probe --plan {}{}",
                    origin, origin, spec ? fmt::format(", or tune again from the job spec it names: {}", *spec) : ""));
  }
  TableReader top(root, origin, "");
  top.reject_unknown(kTopKeys);
  JobSpec spec;
  spec.spec_path = origin;
  const std::string model = top.string("model");
  std::filesystem::path model_path(model);
  if (model_path.is_relative() && !base_dir.empty()) model_path = std::filesystem::path(base_dir) / model_path;
  spec.model_path = model_path.lexically_normal().string();
  read_inputs(top, spec);
  read_output(top, spec);
  read_loss(top, spec);
  read_optimizer(top, spec);
  read_seq(top, spec, base_dir);
  spec.global_batch = top.integer("global_batch", 1);
  if (const std::string problem = global_batch_problem(spec.global_batch); !problem.empty())
    top.fail("global_batch", problem);
  if (const auto index = oversized_input(spec, spec.global_batch)) {
    const toml::node& input = *top.node("inputs")->as_array()->get(*index);
    top.fail_at(input.as_table()->get("shape")->source(), fmt::format("inputs[{}].shape", *index),
                oversized_message(spec, *index, spec.global_batch));
  }
  spec.allow_remainder = top.choice_or("remainder", "error", {"error", "last_smaller"}) == "last_smaller";
  spec.precision = top.choice_or("precision", "fp32", {"fp32", "bf16", "fp16", "bf16_params"});
  spec.allow_bf16 = top.boolean_or("allow_bf16", false);
  spec.allow_adafactor = top.boolean_or("allow_adafactor", false);
  read_parameter_selection(top, spec);
  spec.device =
      *device_from_name(top.choice_or("device", "cpu", device_names({Device::kCpu, Device::kCuda, Device::kMeta})));
  for (const char* key : {"budget", "host_budget"}) {
    if (!top.has(key)) continue;
    const std::string text = top.string(key);
    const std::optional<int64_t> bytes = parse_byte_size(text);
    if (!bytes || *bytes <= 0)
      top.fail(key, fmt::format("expected a size such as \"8GiB\", \"7.5 GB\" or \"512MiB\", got '{}'", text));
    (std::string_view(key) == "budget" ? spec.budget_bytes : spec.host_budget_bytes) = *bytes;
  }
  spec.headroom = top.number_or("headroom", spec.headroom, 0.0, 0.9);
  spec.min_micro_batch = top.integer_or("min_micro_batch", 1, 1);
  if (top.has("max_micro_batch")) spec.max_micro_batch = top.integer("max_micro_batch", 1);
  if (spec.max_micro_batch && *spec.max_micro_batch < spec.min_micro_batch)
    top.fail("max_micro_batch",
             fmt::format("must be >= min_micro_batch ({}), got {}", spec.min_micro_batch, *spec.max_micro_batch));
  spec.verify_steps = top.integer_or("verify_steps", spec.verify_steps, 3);
  spec.trial_timeout_seconds = top.number_or("trial_timeout", spec.trial_timeout_seconds, 1.0, 86400.0);
  spec.optimizing_executor = top.choice_or("executor", "eager", {"eager", "optimizing"}) == "optimizing";
  spec.seed = static_cast<uint64_t>(top.integer_or("seed", 0, 0));
  spec.cuda_target = top.choice_or("cuda_target", kDefaultCudaTargetName, kCudaTargetNames);
  return spec;
}

JobSpec load_job_spec(const std::string& path) {
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  return parse_job_spec(read_text_file(path, "job spec",
                                       "autotune and probe read a TOML job spec that names the model file, its "
                                       "inputs, loss and optimizer (examples/gpt.toml; README \"Your own model\")"),
                        path, base_dir);
}

void default_host_budget(JobSpec& spec, std::optional<int64_t> machine_bytes) {
  if (spec.device != Device::kCuda || spec.host_budget_bytes || !machine_bytes || *machine_bytes <= 0) return;
  spec.host_budget_bytes = machine_bytes;
  spec.host_budget_is_machines = true;
}

void apply_overrides(JobSpec& spec, const JobOverrides& overrides) {
  const auto size = [](const char* flag, const std::optional<std::string>& text) -> std::optional<int64_t> {
    if (!text) return std::nullopt;
    const std::optional<int64_t> bytes = parse_byte_size(*text);
    if (!bytes || *bytes <= 0)
      throw InputError(fmt::format("{}: expected a size such as 8GiB, 7.5GB or 512MiB, got '{}'", flag, *text));
    return bytes;
  };
  if (const auto bytes = size("--budget", overrides.budget)) spec.budget_bytes = *bytes;
  if (const auto bytes = size("--host-budget", overrides.host_budget)) spec.host_budget_bytes = *bytes;
  if (overrides.device) {
    const std::optional<Device> device = device_from_name(*overrides.device);
    if (!device) throw InputError(fmt::format("--device: expected cpu, cuda or meta, got '{}'", *overrides.device));
    spec.device = *device;
  }
  const auto count = [](const char* flag, const std::optional<int64_t>& value) {
    if (value && *value < 1) throw InputError(fmt::format("{}: must be >= 1, got {}", flag, *value));
    return value;
  };
  if (const auto n = count("--seq", overrides.seq_len)) {
    if (!spec.has_seq())
      throw InputError(fmt::format("--seq: no input of {} names \"seq\" in its shape", spec.spec_path));
    if (*n > kMaxSeqLen) throw InputError(fmt::format("--seq: must be at most {} tokens, got {}", kMaxSeqLen, *n));
    spec.fix_seq_len(*n);
    if (const auto index = oversized_input(spec, spec.global_batch))
      throw InputError(fmt::format("--seq: inputs[{}] '{}': {}", *index, spec.inputs[*index].name,
                                   oversized_message(spec, *index, spec.global_batch)));
  }
  if (const auto n = count("--batch", overrides.global_batch)) {
    if (const std::string problem = global_batch_problem(*n); !problem.empty()) throw InputError("--batch: " + problem);
    if (const auto index = oversized_input(spec, *n))
      throw InputError(fmt::format("--batch: inputs[{}] '{}': {}", *index, spec.inputs[*index].name,
                                   oversized_message(spec, *index, *n)));
    spec.global_batch = *n;
  }
  if (const auto n = count("--min-micro-batch", overrides.min_micro_batch)) spec.min_micro_batch = *n;
  if (const auto n = count("--max-micro-batch", overrides.max_micro_batch)) spec.max_micro_batch = *n;
  if (spec.max_micro_batch && *spec.max_micro_batch < spec.min_micro_batch)
    throw InputError(fmt::format("{}: max_micro_batch {} is below min_micro_batch {}",
                                 overrides.max_micro_batch ? "--max-micro-batch" : "--min-micro-batch",
                                 *spec.max_micro_batch, spec.min_micro_batch));
}

}  // namespace oomtune
