#pragma once
// Optimizer CPU offload (ZeRO-Offload style, Ren et al., "ZeRO-Offload:
// Democratizing Billion-Scale Model Training", USENIX ATC 2021).
//
// Rules:
// - Saves: all optimizer state (AdamW: 8 bytes/parameter) leaves the device,
//   and so does the update's temporary memory.
// - Costs: host memory for an fp32 master copy of the parameters, their
//   gradients and the state (AdamW: 16 bytes/parameter); two copies per step
//   (gradients to the host, parameters back); the update runs on the CPU.
// - On CUDA the host buffers are pinned so the copies can overlap.
// - On a CPU-only machine "host" is the tracker's host pool
//   (HostMemoryScope), so the saving is measured, not assumed.

#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

namespace oomtune {

/// Makes the inner optimizer over the host copies of the parameters.
using OptimizerMaker = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

/// Wraps an optimizer so that its state and update live on the host.
/// step(): copy each device gradient into a persistent host gradient buffer,
/// run the inner optimizer on the host master parameters, copy the result
/// back into the device parameters. Parameters without a gradient are
/// skipped, as torch.optim does.
class OffloadedOptimizer {
 public:
  /// `device_params` are the model's trainable parameters (any device).
  OffloadedOptimizer(std::vector<at::Tensor> device_params, const OptimizerMaker& make_inner);

  /// One update. Allocations are tagged as host memory.
  void step();
  /// Bytes of the host master parameters and gradient buffers (SUM).
  int64_t host_buffer_bytes() const;
  torch::optim::Optimizer& inner() { return *inner_; }

 private:
  std::vector<at::Tensor> device_params_;
  std::vector<at::Tensor> host_params_;
  std::unique_ptr<torch::optim::Optimizer> inner_;
};

}  // namespace oomtune
