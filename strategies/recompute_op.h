#pragma once
// The recompute operator `oomtune::checkpoint`: the node that activation
// checkpointing (strategies/activation_checkpointing.h) puts in a TorchScript
// graph in place of `prim::CallMethod[name="forward"](%block, %x, ...)`.
//
// Rules:
// - Schema: `oomtune::checkpoint(Any block, str method, Any[] inputs) ->
//   Tensor[]`: `method` is the forward the call site called (`forward`, or an
//   overload such as `forward__0`), `inputs` the call's arguments after self,
//   in order. Tensors among them, and the Tensors of a List[Tensor] or of a
//   tuple of Tensors, are the autograd Function's inputs (saved, given
//   gradients); the others (None for an Optional[Tensor], bools, ints,
//   floats, strings) are passed to every run of the method unchanged.
// - The first run gets the arguments as passed (a List[Tensor] is the
//   caller's list); a recomputation gets a new list (or tuple) of the Tensors
//   it held at the call. A checkpointed forward that changes such a list
//   throws: a Tensor it added would have no gradient path. So does one that
//   modifies a Tensor argument in place (its version counter moved): the
//   recomputation would start from the modified values.
// - A boxed kernel, conservative alias analysis (it writes module state such
//   as BatchNorm running stats and draws from the RNG, so the JIT must
//   neither reorder, merge nor drop it).
// - When grad mode is on and the block object's `_oomtune_checkpoint`
//   attribute is true, the block's `forward` runs under no-grad inside a
//   torch::autograd::Function that keeps only the inputs; its backward runs
//   `forward` again with grad enabled and calls torch::autograd::backward
//   (re-entrant), which also accumulates the block's parameter gradients.
//   The recomputation runs with the forward's RNG state, autocast settings
//   and graph-executor optimization, whichever thread runs backward (on
//   CUDA, autograd's device thread).
// - Otherwise (flag false or missing, or grad mode off) the op just calls
//   `forward`: no memory saved, nothing recomputed.
// - The block's outputs are flattened: a Tensor gives one element, a tuple of
//   Tensors one element per tuple entry.
// See Note [Recompute RNG], Note [Recompute on autograd's threads] and
// Note [Checkpoint anchor] in recompute_op.cpp.

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

namespace oomtune {

/// Qualified name of the recompute operator.
constexpr const char* kCheckpointOpName = "oomtune::checkpoint";

/// Name of the bool attribute that switches recomputation on for one block
/// object. Attributes live on the TorchScript class, so every object of the
/// class gets it; the value is per object.
constexpr const char* kCheckpointFlag = "_oomtune_checkpoint";

/// Registers `oomtune::checkpoint` with the dispatcher if it is not yet (the
/// registration is a static initializer in recompute_op.cpp; calling this
/// keeps the linker from dropping it out of a static library). Idempotent.
void ensure_recompute_op_registered();

/// Whether an argument of this type hands its Tensors to the operator's
/// autograd Function (see Rules): Tensor, Optional[Tensor], List[Tensor], or
/// a non-empty Tuple of Tensors. Throws nothing.
bool is_tensor_argument_type(const c10::TypePtr& type);

/// Whether `block` has its checkpoint flag set (false when the class has no
/// such attribute or the object predates it).
bool checkpoint_flag(const c10::ivalue::Object& block);

/// The class (unmangled, "__torch__.Decoder") of the last block whose
/// checkpointed forward the operator refused because it changed its
/// List[Tensor] argument or modified a Tensor argument in place, and forgets
/// it; nullopt when none was refused since the last call. The refusal itself
/// is a c10::Error that the TorchScript interpreter rethrows with its own
/// text, so a trial reads the class here to retry without those blocks.
std::optional<std::string> take_refused_block_class();

}  // namespace oomtune
