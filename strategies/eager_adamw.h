#pragma once
// EagerAdamW: torch.optim.AdamW as eager PyTorch 2.x runs it, in each of its
// three implementations (job/optimizer_implementation.h), so that a trial
// allocates what the user's training allocates.
//
// - Same update as torch::optim::AdamW (decoupled weight decay, bias
//   correction; tests/strategies/eager_optimizers_test.cpp holds the three to
//   it within float tolerance), different temporaries:
//   foreach       the square root of every second moment of a (device,
//                 dtype) group at once: 4 bytes per fp32 parameter element;
//   fused         none;
//   single_tensor one parameter's square root and its quotient, while the
//                 previous parameter's denominator is still held.
//   libtorch's own C++ AdamW differs from all three: it creates a
//   parameter's state when it reaches it (so the first step never holds all
//   states and a temporary at once) and frees each denominator at once.
// - State: exp_avg and exp_avg_sq, created for every parameter with a
//   gradient before the first update (Adam._init_group). Step counts: fused
//   keeps them as one-element float32 tensors on the parameter's device (4
//   bytes each, device memory); foreach and single_tensor keep one-element
//   CPU tensors, host memory on a GPU machine, held here as plain counts.
// - fp16: fused takes GradScaler's scale and found_inf (AmpScaledStep in
//   strategies/optimizer_step.h) and unscales in the kernel; a step with
//   found_inf set changes no parameter or moment and leaves the step
//   counts as they were, but a first step has made the state before it.
// - Cannot apply: amsgrad (not offered; ConfigError), sparse gradients
//   (ConfigError).
//
// Note [Eager AdamW]
// Rationale: on CUDA torch.optim.AdamW runs foreach by default, whose
//   whole-list temporaries a one-parameter-at-a-time loop never makes;
//   measured on an H100 (issue #46), a 5.3 M-parameter CNN's optimizer phase
//   held 171.0 MiB in eager CUDA against 90.8 MiB in libtorch's loop.
// Approach: the tensor operations of PyTorch 2.11's torch/optim/adam.py with
//   decoupled_weight_decay=True, capturable=False, differentiable=False,
//   maximize=False, amsgrad=False: _multi_tensor_adam, _fused_adam and
//   _single_tensor_adam, in their order and with their lifetimes (a Python
//   name holds its tensor until it is rebound or the function returns).
//   Parameters are grouped by device and dtype in the order they first
//   appear (Optimizer._group_tensors_by_device_and_dtype).
// Limitations: fused runs aten::_fused_adamw_ where the libtorch has a
//   kernel for the device (2.x: CPU, CUDA); elsewhere (1.13, meta) an
//   in-place emulation that allocates what the kernel does, nothing: it
//   computes each denominator in the parameter's gradient, which the step
//   is the last to read (TrainingStep clears gradients after it). State
//   save/load is not implemented.

#include <cstdint>
#include <vector>

#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include "job/optimizer_implementation.h"
#include "strategies/optimizer_step.h"

namespace oomtune {

/// Per-parameter state of EagerAdamW.
struct EagerAdamWParamState : public torch::optim::OptimizerCloneableParamState<EagerAdamWParamState> {
  TORCH_ARG(int64_t, step) = 0;       ///< COUNT: updates so far
  TORCH_ARG(at::Tensor, exp_avg);     ///< first moment, the parameter's shape and dtype
  TORCH_ARG(at::Tensor, exp_avg_sq);  ///< second moment, likewise
  /// fused: the step count as a 0-dim float32 tensor on the parameter's
  /// device (torch._fused_adamw_ reads it there); undefined otherwise.
  TORCH_ARG(at::Tensor, step_tensor);
};

/// torch.optim.AdamW in one of its implementations. See Note [Eager AdamW].
class EagerAdamW : public torch::optim::Optimizer, public ImplementationStep {
 public:
  /// Takes libtorch's AdamWOptions (lr, betas, eps, weight_decay).
  /// Throws ConfigError for amsgrad, for options outside the ranges
  /// torch.optim.AdamW checks (lr, eps, weight_decay >= 0; betas in [0, 1)),
  /// or a param group whose options are not AdamWOptions.
  EagerAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults,
             OptimizerImplementation implementation);

  /// One update of every parameter that has a gradient; creates the state
  /// on a parameter's first step. Runs `closure` (with grad enabled) first
  /// when given and returns its loss. Throws ConfigError for a sparse
  /// gradient. With fused and no kernel for the device, overwrites each
  /// gradient (Note [Eager AdamW]). With fused and an AmpScaling set,
  /// unscales each gradient in place first and, when its found_inf is set,
  /// updates nothing (reads found_inf once: a device sync on CUDA).
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace oomtune
