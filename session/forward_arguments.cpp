#include "session/forward_arguments.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/closest_name.h"
#include "common/error.h"

namespace oomtune {

// Note [Forward arguments]
// Scripted and traced modules keep forward's Python parameter names in its
// schema ("forward(self, Tensor input_ids, Tensor attention_mask)"). When
// every input the job passes (all but the loss target) names one of them,
// they are passed by name: their order in the job spec does not matter and
// arguments with defaults may be left out. When none does ("x" for a
// ResNet's input, whatever its name), they are passed in order. A mix is
// almost always a misspelt name, so it is an error that names it, as is a
// count forward cannot take or a required argument no input gives.
//
// A model that takes its batch as one container -- forward(self, batch:
// Dict[str, Tensor]), a tuple or a list of tensors; torch.jit.trace keeps
// such an example input's type in the schema too -- gets every input packed
// into that argument when it is forward's first and only required one: a
// dict keyed by the inputs' names, a tuple or list in the job spec's order.
// Any other argument an input would reach must take a tensor: a tensor
// passed to an int or a dict fails inside forward with TorchScript's
// "Expected a value of type ..." and nothing on what to write instead.

namespace {

bool is_tensor(const c10::TypePtr& type) { return type->kind() == c10::TypeKind::TensorType; }

/// Tensor or Optional[Tensor]: what one input can be passed as.
bool takes_tensor(const c10::TypePtr& type) {
  if (is_tensor(type)) return true;
  if (const auto optional = type->cast<c10::OptionalType>()) return is_tensor(optional->getElementType());
  return false;
}

/// The binding that packs every input into an argument of this type, if it
/// is a container of tensors.
std::optional<ForwardBinding> container_binding(const c10::Argument& argument) {
  ForwardBinding b;
  b.packed_argument = argument.name();
  const c10::TypePtr& type = argument.type();
  if (const auto dict = type->cast<c10::DictType>()) {
    if (dict->getKeyType()->kind() != c10::TypeKind::StringType || !takes_tensor(dict->getValueType()))
      return std::nullopt;
    b.passing = ArgumentPassing::kDict;
    b.key_type = dict->getKeyType();
    b.value_type = dict->getValueType();
    return b;
  }
  if (const auto tuple = type->cast<c10::TupleType>()) {
    if (tuple->elements().empty()) return std::nullopt;
    for (const c10::TypePtr& element : tuple->elements())
      if (!takes_tensor(element)) return std::nullopt;
    b.passing = ArgumentPassing::kTuple;
    return b;
  }
  if (const auto list = type->cast<c10::ListType>()) {
    if (!takes_tensor(list->getElementType())) return std::nullopt;
    b.passing = ArgumentPassing::kList;
    b.value_type = list->getElementType();
    return b;
  }
  return std::nullopt;
}

std::string besides_target(const JobSpec& job) {
  return job.loss.target.empty() ? "" : fmt::format(" besides the loss target '{}'", job.loss.target);
}

[[noreturn]] void throw_not_a_tensor(const std::string& where, const std::string& signature,
                                     const c10::Argument& argument) {
  throw ModelError(
      fmt::format("{}: {} takes '{}' as {}, not a tensor: oomtune passes each input as one tensor, or "
                  "packs all of them into forward's first argument when it is the only required one "
                  "and a Dict[str, Tensor], a tuple or a list of tensors",
                  where, signature, argument.name(), argument.type()->annotation_str()));
}

}  // namespace

ForwardBinding bind_forward_arguments(const c10::FunctionSchema& schema, const JobSpec& job, const std::string& where) {
  const std::vector<c10::Argument>& arguments = schema.arguments();
  std::vector<const c10::Argument*> forward_args;  // after self
  std::vector<std::string> names;
  std::size_t required = 0;  // arguments up to the last one without a default
  for (std::size_t i = 1; i < arguments.size(); ++i) {
    forward_args.push_back(&arguments[i]);
    names.push_back(arguments[i].name());
    if (!arguments[i].default_value()) required = names.size();
  }
  std::vector<std::string> given, unknown;
  for (const InputSpec* input : job.model_inputs()) {
    given.push_back(input->name);
    if (std::find(names.begin(), names.end(), input->name) == names.end()) unknown.push_back(input->name);
  }
  const std::string signature = fmt::format("forward({}) in {}", fmt::join(names, ", "), job.model_path);

  if (required == 1) {
    if (std::optional<ForwardBinding> packed = container_binding(*forward_args.front())) {
      const auto tuple = forward_args.front()->type()->cast<c10::TupleType>();
      if (tuple && tuple->elements().size() != given.size()) {
        throw ModelError(
            fmt::format("{}: {} takes its inputs packed in '{}', a tuple of {} tensors; the job passes "
                        "{} ({}){}",
                        where, signature, names.front(), tuple->elements().size(), given.size(), fmt::join(given, ", "),
                        besides_target(job)));
      }
      return *packed;
    }
  }

  ForwardBinding binding;
  if (unknown.empty()) {
    for (std::size_t i = 0; i < names.size(); ++i) {
      const bool is_given = std::find(given.begin(), given.end(), names[i]) != given.end();
      if (is_given && !takes_tensor(forward_args[i]->type())) throw_not_a_tensor(where, signature, *forward_args[i]);
      if (forward_args[i]->default_value() || is_given) continue;
      if (!takes_tensor(forward_args[i]->type())) throw_not_a_tensor(where, signature, *forward_args[i]);
      if (names[i] == job.loss.target) {
        throw ModelError(
            fmt::format("{}: {} takes '{}', the loss target, which is not passed to forward; for a model "
                        "that computes its own loss set [loss] kind = \"model_returns_loss\"",
                        where, signature, names[i]));
      }
      throw ModelError(fmt::format("{}: {} needs '{}', which no input gives (inputs passed by name: {})", where,
                                   signature, names[i], fmt::join(given, ", ")));
    }
    binding.passing = ArgumentPassing::kByName;
    return binding;
  }
  if (unknown.size() < given.size()) {
    std::vector<std::string> free_names;  // not taken by another input
    for (const std::string& name : names)
      if (std::find(given.begin(), given.end(), name) == given.end()) free_names.push_back(name);
    const std::string hint = free_names.empty()
                                 ? "every argument is already given"
                                 : fmt::format("did you mean '{}'?", closest_name(unknown.front(), free_names));
    throw ModelError(
        fmt::format("{}: input '{}' is not an argument of {} ({}): inputs named as forward's arguments "
                    "are passed by name, inputs named otherwise in order, not a mix",
                    where, unknown.front(), signature, hint));
  }
  if (given.size() < required || given.size() > names.size()) {
    throw ModelError(fmt::format("{}: {} takes {}{} inputs, the job passes {} ({}){}", where, signature,
                                 required == names.size() ? "" : fmt::format("{} to ", required), names.size(),
                                 given.size(), fmt::join(given, ", "), besides_target(job)));
  }
  for (std::size_t i = 0; i < given.size(); ++i)
    if (!takes_tensor(forward_args[i]->type())) throw_not_a_tensor(where, signature, *forward_args[i]);
  binding.passing = ArgumentPassing::kInOrder;
  return binding;
}

ForwardCall make_forward_call(const ForwardBinding& binding, const Batch& batch, const std::string& loss_target) {
  ForwardCall call;
  for (std::size_t i = 0; i < batch.names.size(); ++i)
    if (batch.names[i] != loss_target) call.inputs.push_back(i);
  switch (binding.passing) {
    case ArgumentPassing::kInOrder:
      for (std::size_t i : call.inputs) call.args.emplace_back(batch.tensors[i]);
      break;
    case ArgumentPassing::kByName:
      for (std::size_t i : call.inputs) call.kwargs.emplace(batch.names[i], batch.tensors[i]);
      break;
    case ArgumentPassing::kDict: {
      c10::impl::GenericDict dict(binding.key_type, binding.value_type);
      for (std::size_t i : call.inputs) dict.insert(c10::IValue(batch.names[i]), c10::IValue(batch.tensors[i]));
      call.args.emplace_back(std::move(dict));
      break;
    }
    case ArgumentPassing::kTuple: {
      std::vector<c10::IValue> elements;
      for (std::size_t i : call.inputs) elements.emplace_back(batch.tensors[i]);
      call.args.emplace_back(c10::ivalue::Tuple::create(std::move(elements)));
      break;
    }
    case ArgumentPassing::kList: {
      c10::impl::GenericList list(binding.value_type);
      for (std::size_t i : call.inputs) list.push_back(c10::IValue(batch.tensors[i]));
      call.args.emplace_back(std::move(list));
      break;
    }
  }
  return call;
}

std::string describe_forward_call(const ForwardBinding& binding, const Batch& batch, const ForwardCall& call) {
  std::vector<std::string> parts;
  for (std::size_t i : call.inputs) {
    const at::Tensor& t = batch.tensors[i];
    parts.push_back(
        fmt::format("{}: {} {}", batch.names[i], c10::toString(t.scalar_type()), fmt::join(t.sizes(), "x")));
  }
  const std::string joined = fmt::format("{}", fmt::join(parts, ", "));
  switch (binding.passing) {
    case ArgumentPassing::kDict:
      return fmt::format("{}={{{}}}", binding.packed_argument, joined);
    case ArgumentPassing::kTuple:
      return fmt::format("{}=({})", binding.packed_argument, joined);
    case ArgumentPassing::kList:
      return fmt::format("{}=[{}]", binding.packed_argument, joined);
    case ArgumentPassing::kInOrder:
    case ArgumentPassing::kByName:
      break;
  }
  return joined;
}

}  // namespace oomtune
