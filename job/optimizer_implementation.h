#pragma once
// Which implementation of torch.optim's AdamW or SGD the user's eager
// training runs: the three that PyTorch 2.x ships differ in the temporaries
// an optimizer step allocates, not in the update (torch/optim/adam.py,
// sgd.py). oomtune's answers are for eager CUDA training, so the default is
// PyTorch's default on CUDA. No libtorch here: strategies/eager_adamw.h and
// strategies/eager_sgd.h run them.

#include <optional>
#include <string>
#include <vector>

namespace oomtune {

/// torch.optim's implementations of one optimizer step.
enum class OptimizerImplementation {
  /// torch._foreach_* over the whole parameter list (`foreach=True`):
  /// out-of-place foreach calls allocate one temporary per parameter at
  /// once (AdamW: the square root of every second moment). PyTorch's default
  /// when every parameter is on CUDA (torch/optim/optimizer.py,
  /// _default_to_fused_or_foreach).
  kForeach,
  /// One fused kernel per step (`fused=True`: torch._fused_adamw_,
  /// torch._fused_sgd_), updating in place: no temporaries; AdamW keeps its
  /// step counts as one-element float32 tensors on the parameters' device.
  kFused,
  /// A Python loop, one parameter at a time (`foreach=False`): the
  /// temporaries of one parameter at a time (_single_tensor_adam,
  /// _single_tensor_sgd). PyTorch's default on the CPU.
  kSingleTensor,
};

/// PyTorch's default for optimizers whose parameters are on CUDA: foreach
/// (torch/optim/optimizer.py, _default_to_fused_or_foreach: fused only
/// when asked, foreach where every parameter is on a foreach device).
constexpr OptimizerImplementation kDefaultOptimizerImplementation = OptimizerImplementation::kForeach;

/// "foreach", "fused", "single_tensor": the job spec's and plan.toml's
/// spelling of `optimizer.implementation`.
std::string to_string(OptimizerImplementation implementation);

/// The three names above, in that order.
const std::vector<std::string>& optimizer_implementation_names();

/// The implementation named `name`, or nullopt when it is none of the three.
std::optional<OptimizerImplementation> optimizer_implementation_from_name(const std::string& name);

}  // namespace oomtune
