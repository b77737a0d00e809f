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
//   compiled at the first run: apply checkpointing right after loading); to
//   a block whose forward modifies a Tensor argument in place or changes its
//   List[Tensor] argument (found in the graph, strategies/argument_writes.h,
//   before anything runs; the recompute operator refuses the cases the graph
//   check cannot be sure of at their first call).
// - Dropout masks repeat exactly in the recomputation: Note [Recompute RNG]
//   (strategies/recompute_op.cpp).
// - Works with the graph executor's optimization on or off: see
//   Note [Rewrite at the call site] in activation_checkpointing.cpp.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/csrc/jit/api/module.h>

#include "common/error.h"
#include "strategies/block_detection.h"
#include "strategies/training_config.h"

namespace oomtune {

/// One checkpointed block: where it sits in the model and its class.
struct CheckpointedBlock {
  std::string path;        // dotted submodule path: "blocks.0"
  std::string class_name;  // unmangled class: "__torch__.Block"
};

/// The paths of `blocks`, in their order.
std::vector<std::string> paths_of(const std::vector<CheckpointedBlock>& blocks);

/// A chosen block's forward writes to its argument (strategies/argument_writes.h),
/// so no block of its class can be checkpointed; the chosen blocks of other
/// classes can. Exit code 2, like every ConfigError.
class CheckpointRefused : public ConfigError {
 public:
  CheckpointRefused(const std::string& message, std::string block_class, std::vector<std::string> chosen_blocks,
                    std::vector<std::string> other_blocks)
      : ConfigError(message),
        block_class_(std::move(block_class)),
        chosen_blocks_(std::move(chosen_blocks)),
        other_blocks_(std::move(other_blocks)) {}
  /// The refused class, unmangled: "__torch__.Halving".
  const std::string& block_class() const { return block_class_; }
  /// The blocks the plan chose (dotted paths, forward order).
  const std::vector<std::string>& chosen_blocks() const { return chosen_blocks_; }
  /// The chosen blocks of the other classes (dotted paths, forward order); empty when none.
  const std::vector<std::string>& other_blocks() const { return other_blocks_; }

 private:
  std::string block_class_;
  std::vector<std::string> chosen_blocks_;
  std::vector<std::string> other_blocks_;
};

/// What apply_checkpointing did.
struct CheckpointReport {
  std::vector<CheckpointedBlock> checkpointed;  // the blocks now recomputed, forward order
  std::vector<BlockInfo> blocks;                // the detected blocks (detect_blocks)
  int64_t rewritten_calls = 0;                  // COUNT: prim::CallMethod nodes replaced by this call
  int64_t checkpointed_parameters = 0;          // COUNT: parameter elements inside checkpointed blocks
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

/// The paths of `blocks` whose class is not `refused_class` (unmangled), in
/// their order: the blocks a retry can still checkpoint once
/// `refused_class` is refused.
std::vector<std::string> blocks_of_other_classes(const std::vector<CheckpointedBlock>& blocks,
                                                 const std::string& refused_class);

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
/// Throws what select_checkpoint_paths throws; ConfigError when a chosen
/// submodule is never called through prim::CallMethod forward or its forward
/// takes no Tensor (or Optional[Tensor]), takes an argument holding Tensors
/// (a list, tuple, dict or object of them), or returns anything but a Tensor
/// or a tuple of Tensors; CheckpointRefused when a chosen block's forward
/// certainly writes to its argument (the first such block in forward order;
/// the message names the argument, the operator and the line). Nothing is
/// rewritten when it throws.
CheckpointReport apply_checkpointing(torch::jit::Module& module, const CheckpointPlan& plan,
                                     const std::string& model_name = "");

}  // namespace oomtune
