#pragma once
// Activation checkpointing (recompute) on a TorchScript model.
//
// Rules:
// - Saves: the activations inside each checkpointed block. Between forward
//   and backward only the block's inputs stay alive (and its outputs, which
//   the next layer keeps anyway). On the example 4-block GPT at batch 8 the
//   retained activations fall to about a fifth (bench/checkpointing/).
// - Costs: one more forward of each checkpointed block during backward
//   (about +1/3 of a step's compute when every block is checkpointed).
//   Module state that forward updates is updated twice: in train mode,
//   BatchNorm running_mean/running_var see each batch twice, and
//   num_batches_tracked counts it twice (PyTorch's torch.utils.checkpoint does
//   the same). Gradients are unaffected.
// - Cannot apply: to a model without repeated blocks unless submodule paths
//   are named; to a block whose forward takes no Tensor, Optional[Tensor],
//   List[Tensor] or Tuple[Tensor, ...], or takes a dict, an object or a
//   mixed tuple holding Tensors, or returns anything but a Tensor or a tuple
//   of Tensors (other arguments, such as nn.TransformerEncoderLayer's masks
//   left None or a bool, pass through unchanged to every run); to a submodule that no TorchScript method calls
//   as `prim::CallMethod[name="forward"]` (or an overload, "forward__N"); to a
//   module whose methods already ran (the graph executor keeps the graph it
//   compiled at the first run: apply checkpointing right after loading).
// - Dropout masks repeat exactly in the recomputation: Note [Recompute RNG]
//   (strategies/recompute_op.cpp).
// - Works with the graph executor's optimization on or off: see
//   Note [Rewrite at the call site] in activation_checkpointing.cpp.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/csrc/jit/api/module.h>

#include "strategies/block_detection.h"
#include "strategies/training_config.h"

namespace oomtune {

/// What apply_checkpointing did.
struct CheckpointReport {
  std::vector<std::string> checkpointed;  // dotted paths now recomputed, forward order
  std::vector<std::string> checkpointed_classes;  // unmangled class of each, same order: "__torch__.Block"
  std::vector<BlockInfo> blocks;          // the detected blocks (detect_blocks)
  int64_t rewritten_calls = 0;            // COUNT: prim::CallMethod nodes replaced by this call
  int64_t checkpointed_parameters = 0;    // COUNT: parameter elements inside checkpointed blocks
};

/// The dotted submodule paths that `plan` selects, in forward order, without
/// changing the model. `model_name` (e.g. the model file) is used in errors.
///
/// Throws ConfigError when the plan needs detected blocks (all, every:k,
/// first:n) and the model has none (the message lists its top-level
/// children), when every:k has k < 1, when first:n has n < 1 or n larger than
/// the number of blocks, when paths: is empty or names a path that is not a
/// submodule (the message lists the detected blocks and the closest path).
std::vector<std::string> select_checkpoint_paths(const torch::jit::Module& module, const CheckpointPlan& plan,
                                                 const std::string& model_name = "");

/// Rewrites the TorchScript methods of `module` so that the submodules chosen
/// by `plan` run through the recompute operator `oomtune::checkpoint`
/// (strategies/recompute_op.h). Call right after loading, before the module
/// first runs. Calling it again with another plan re-selects the blocks
/// (kNone turns checkpointing off); the rewritten call sites stay and behave as
/// plain calls when their block is not selected.
///
/// Submodules of one TorchScript class share compiled methods, so a call
/// site in a shared method may serve several blocks (ResNet's Sequential
/// `layerN` calls `N.0`, `N.1`): the choice is made per block object at run
/// time through its `_oomtune_checkpoint` attribute, so every plan works on
/// every layout.
///
/// Throws what select_checkpoint_paths throws, and ConfigError when a chosen
/// submodule is never called through prim::CallMethod forward or its forward
/// takes no Tensor (or Optional[Tensor]), takes an argument holding Tensors
/// (a list, tuple, dict or object of them), or returns anything but a Tensor
/// or a tuple of Tensors.
CheckpointReport apply_checkpointing(torch::jit::Module& module, const CheckpointPlan& plan,
                                     const std::string& model_name = "");

}  // namespace oomtune
