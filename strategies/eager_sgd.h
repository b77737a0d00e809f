#pragma once
// EagerSgd: torch.optim.SGD as eager PyTorch 2.x runs it, in each of its
// three implementations (job/optimizer_implementation.h), so that a trial
// allocates what the user's training allocates.
//
// - Same update as torch::optim::SGD (L2 weight decay added to the
//   gradient, momentum with dampening, Nesterov), different temporaries:
//   foreach       with weight_decay, the decayed gradients of a (device,
//                 dtype) group at once (_foreach_add): 4 bytes per fp32
//                 parameter element;
//   fused         none;
//   single_tensor with weight_decay, one parameter's decayed gradient at a
//                 time.
//   Without weight decay none of the three holds a temporary: plain SGD and
//   SGD with momentum allocate only the momentum buffers (the first step
//   clones the gradients into them).
// - State: one momentum buffer per parameter when momentum != 0, created on
//   the first step (foreach and single_tensor: a clone of the (decayed)
//   gradient; fused: empty_like, then written by the kernel).
// - fp16: fused takes GradScaler's scale and found_inf (AmpScaledStep in
//   strategies/optimizer_step.h) and unscales in place; a step with
//   found_inf set updates nothing, but a first step has made the momentum
//   buffers (empty_like: uninitialised, as PyTorch's kernel leaves them).
// - Cannot apply: sparse gradients (ConfigError).
//
// Note [Eager SGD]
// Rationale and approach as Note [Eager AdamW] (strategies/eager_adamw.h):
//   the tensor operations of PyTorch 2.11's torch/optim/sgd.py
//   _multi_tensor_sgd, _single_tensor_sgd and _fused_sgd (maximize=False),
//   in their order and with their lifetimes.
// Limitations: fused runs aten::_fused_sgd_ where the libtorch has a kernel
//   for the device (2.x: CPU, CUDA); elsewhere (1.13, meta) an in-place
//   emulation that allocates what the kernel does, nothing beyond the
//   momentum buffers.

#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "job/optimizer_implementation.h"
#include "strategies/optimizer_step.h"

namespace oomtune {

/// Per-parameter state of EagerSgd.
struct EagerSgdParamState : public torch::optim::OptimizerCloneableParamState<EagerSgdParamState> {
  TORCH_ARG(at::Tensor, momentum_buffer);  ///< the parameter's shape; undefined without momentum
};

/// torch.optim.SGD in one of its implementations. See Note [Eager SGD].
class EagerSgd : public torch::optim::Optimizer, public ImplementationStep {
 public:
  /// Takes libtorch's SGDOptions (lr, momentum, dampening, weight_decay,
  /// nesterov). Throws ConfigError for options torch.optim.SGD refuses (lr,
  /// momentum, weight_decay < 0; nesterov without momentum or with
  /// dampening) or a param group whose options are not SGDOptions.
  EagerSgd(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults, OptimizerImplementation implementation);

  /// One update of every parameter that has a gradient. Runs `closure`
  /// (with grad enabled) first when given and returns its loss. Throws
  /// ConfigError for a sparse gradient. foreach with Nesterov momentum and
  /// no weight decay adds the momentum into the gradients in place, as
  /// PyTorch does. With fused and an AmpScaling set, unscales each gradient
  /// in place first and, when its found_inf is set, updates nothing (the
  /// kernel reads found_inf on the device; the emulation of meta and 1.13
  /// reads it on the host).
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace oomtune
