#include "session/loss.h"

#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/error.h"
#include "session/model_session.h"

namespace oomtune {
namespace {

/// "Float scalar", "Float 3-d", or the kind of a value that is no tensor.
/// No sizes: they change with the micro-batch, and the search compares the
/// errors of two sizes (search::same_failure).
std::string describe_value(const c10::IValue& value) {
  if (!value.isTensor()) return value.tagKind();
  const at::Tensor& t = value.toTensor();
  return fmt::format("{} {}", c10::toString(t.scalar_type()),
                     t.dim() == 0 ? std::string("scalar") : fmt::format("{}-d", t.dim()));
}

/// "logits: Float 3-d, hidden: Float 3-d": what each key holds.
std::string dict_keys(const c10::impl::GenericDict& dict) {
  std::vector<std::string> keys;
  for (const auto& entry : dict)
    keys.push_back(
        fmt::format("{}: {}", entry.key().isString() ? entry.key().toStringRef() : "?", describe_value(entry.value())));
  return fmt::format("{}", fmt::join(keys, ", "));
}

/// The index of the only 0-d tensor among `items`, the loss of a model
/// that returns (loss, logits, ...): a Hugging Face model given labels and
/// return_dict=False (transformers 5.17, checked).
std::optional<std::size_t> only_scalar(const std::vector<c10::IValue>& items) {
  std::optional<std::size_t> found;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!items[i].isTensor() || items[i].toTensor().dim() != 0) continue;
    if (found) return std::nullopt;
    found = i;
  }
  return found;
}

at::Tensor expect_tensor(const c10::IValue& value, const std::string& what, const std::string& model_path) {
  if (!value.isTensor())
    throw ModelError(fmt::format("{}: {} is a {}, not a tensor", model_path, what, value.tagKind()));
  return value.toTensor();
}

// ": its range in the job spec is [0, 5000)" for an input with a range.
std::string spec_range(const JobSpec& job, const std::string& input) {
  for (const InputSpec& spec : job.inputs)
    if (spec.name == input && spec.low && spec.high)
      return fmt::format(": its range in the job spec is [{}, {})", *spec.low, *spec.high);
  return "";
}

}  // namespace

at::Tensor select_output(const c10::IValue& output, const OutputSelector& selector, bool want_loss,
                         const std::string& model_path) {
  if (output.isTensor()) {
    if (!std::holds_alternative<std::monostate>(selector))
      throw ModelError(fmt::format("{}: the model returns one tensor; remove `output` from the job spec", model_path));
    return output.toTensor();
  }
  if (output.isGenericDict()) {
    const auto dict = output.toGenericDict();
    std::string key;
    if (const auto* name = std::get_if<std::string>(&selector))
      key = *name;
    else if (want_loss && std::holds_alternative<std::monostate>(selector))
      key = "loss";
    else
      throw ModelError(fmt::format("{}: the model returns a dict; set output = \"KEY\" in the job spec (keys: {})",
                                   model_path, dict_keys(dict)));
    auto it = dict.find(c10::IValue(key));
    if (it == dict.end())
      throw ModelError(
          fmt::format("{}: the model's output has no key '{}' (keys: {})", model_path, key, dict_keys(dict)));
    return expect_tensor(it->value(), fmt::format("output['{}']", key), model_path);
  }
  if (output.isTuple() || output.isList()) {
    const std::vector<c10::IValue> items =
        output.isTuple() ? output.toTupleRef().elements().vec() : output.toList().vec();
    const auto* index = std::get_if<int64_t>(&selector);
    if (!index) {
      std::vector<std::string> described;
      for (std::size_t i = 0; i < items.size(); ++i)
        described.push_back(fmt::format("{}: {}", i, describe_value(items[i])));
      const std::optional<std::size_t> loss = want_loss ? only_scalar(items) : std::nullopt;
      throw ModelError(fmt::format("{}: the model returns a tuple of {} ({}); set output = {} in the job spec{}",
                                   model_path, items.size(), fmt::join(described, ", "),
                                   loss ? std::to_string(*loss) : fmt::format("INDEX (0..{})", items.size() - 1),
                                   loss ? fmt::format(" (element {} is its only scalar: the loss)", *loss) : ""));
    }
    if (*index >= static_cast<int64_t>(items.size()))
      throw ModelError(
          fmt::format("{}: output = {} but the model returns a tuple of {}", model_path, *index, items.size()));
    return expect_tensor(items[static_cast<std::size_t>(*index)], fmt::format("output[{}]", *index), model_path);
  }
  throw ModelError(
      fmt::format("{}: the model returns a {}; expected a tensor, a dict or a tuple", model_path, output.tagKind()));
}

at::Tensor compute_loss(const JobSpec& job, const at::Tensor& output, const Batch& batch) {
  const std::string& path = job.model_path;
  try {
    switch (job.loss.kind) {
      case LossSpec::Kind::kCrossEntropy: {
        const at::Tensor& target = batch.get(job.loss.target);
        if (output.dim() < 2)
          throw ModelError(fmt::format("{}: cross_entropy needs logits [..., classes], got shape [{}]", path,
                                       fmt::join(output.sizes(), ", ")));
        const int64_t classes = output.size(-1);
        if (target.numel() * classes != output.numel())
          throw ModelError(fmt::format("{}: cross_entropy: output [{}] does not match target '{}' [{}]", path,
                                       fmt::join(output.sizes(), ", "), job.loss.target,
                                       fmt::join(target.sizes(), ", ")));
        try {
          return at::cross_entropy_loss(output.reshape({-1, classes}).to(at::kFloat),
                                        target.reshape({-1}).to(at::kLong));
        } catch (const c10::Error& e) {
          // "Target 3757 is out of bounds." alone does not say what bounds.
          const std::string message = one_line(e.what_without_backtrace());
          if (message.find("out of bounds") == std::string::npos) throw;
          throw ModelError(
              fmt::format("{}: loss failed: {} The model's output has {} classes, so target '{}' must "
                          "lie in [0, {}){}",
                          path, message, classes, job.loss.target, classes, spec_range(job, job.loss.target)));
        }
      }
      case LossSpec::Kind::kMse: {
        const at::Tensor& target = batch.get(job.loss.target);
        if (!output.sizes().equals(target.sizes()))
          throw ModelError(fmt::format("{}: mse: output [{}] and target '{}' [{}] differ in shape", path,
                                       fmt::join(output.sizes(), ", "), job.loss.target,
                                       fmt::join(target.sizes(), ", ")));
        return at::mse_loss(output.to(at::kFloat), target.to(at::kFloat));
      }
      case LossSpec::Kind::kMean:
        return output.to(at::kFloat).mean();
      case LossSpec::Kind::kModelReturnsLoss:
        if (output.numel() != 1)
          throw ModelError(fmt::format("{}: model_returns_loss: the loss has shape [{}], expected a scalar", path,
                                       fmt::join(output.sizes(), ", ")));
        return output.reshape({}).to(at::kFloat);
    }
  } catch (const c10::Error& e) {
    if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) throw;
    throw ModelError(fmt::format("{}: loss failed: {}", path, one_line(e.what_without_backtrace())));
  }
  return {};
}

}  // namespace oomtune
