#pragma once
// How a job's inputs reach a TorchScript model's forward (Note [Forward
// arguments] in forward_arguments.cpp): in order, by name, or packed into
// forward's one container argument (a dict, tuple or list of tensors).

#include <cstddef>
#include <string>
#include <vector>

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <torch/script.h>

#include "job/job_spec.h"
#include "session/batch.h"

namespace oomtune {

/// How the model inputs (every input but the loss target) are passed.
enum class ArgumentPassing {
  kInOrder,  ///< positionally, in the job spec's order
  kByName,   ///< as keyword arguments, each named after its input
  kDict,     ///< packed into forward's one argument, a Dict[str, Tensor], keyed by input name
  kTuple,    ///< packed into forward's one argument, a Tuple[Tensor, ...], in the job spec's order
  kList,     ///< packed into forward's one argument, a List[Tensor], in the job spec's order
};

/// The outcome of checking a job's inputs against forward's schema.
struct ForwardBinding {
  ArgumentPassing passing = ArgumentPassing::kInOrder;
  /// kDict, kTuple, kList: forward's argument the inputs are packed into.
  std::string packed_argument;
  /// kDict, kTuple, kList: the container's types, as forward's schema gives
  /// them (a dict's key and value, a list's element); empty otherwise.
  c10::TypePtr key_type, value_type;
};

/// Checks the job's model inputs against `schema` (forward's, `self`
/// first) and chooses how they are passed. `where` names the job in errors
/// (its spec file, or the model file when there is none).
/// Throws ModelError, one line naming `where` and forward's signature, for:
/// an input named after no argument while others are (a mix; the nearest
/// name is suggested), a required argument no input gives (or the loss
/// target, with the hint for model_returns_loss), a count forward cannot
/// take, a tuple argument of another arity, or an input bound to an
/// argument that takes no tensor (an int, a dict beside other arguments).
ForwardBinding bind_forward_arguments(const c10::FunctionSchema& schema, const JobSpec& job, const std::string& where);

/// One call's arguments, made from a batch by a binding.
struct ForwardCall {
  std::vector<c10::IValue> args;  // positional, after self
  torch::jit::Kwargs kwargs;
  std::vector<std::size_t> inputs;  // indices into the batch of the tensors passed, in order
};

/// The arguments that pass `batch`'s tensors, all but `loss_target`, as
/// `binding` says. The tensors are shared, not copied.
ForwardCall make_forward_call(const ForwardBinding& binding, const Batch& batch, const std::string& loss_target);

/// The passed tensors for an error message, as forward receives them:
/// "input_ids: Long 4x16, attention_mask: Float 4x16" (in order or by
/// name), "batch={input_ids: Long 4x16, ...}" (a dict), "xs=(a: ..., b: ...)"
/// (a tuple), "xs=[...]" (a list).
std::string describe_forward_call(const ForwardBinding& binding, const Batch& batch, const ForwardCall& call);

}  // namespace oomtune
