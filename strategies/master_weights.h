#pragma once
// Master weights: an optimizer that keeps its own fp32 copy of the
// parameters, updates that copy and writes the result back into the model.
// One loop serves two strategies, which differ only in where the copy lives:
//
// Optimizer offload (MasterPlacement::kHost; ZeRO-Offload, Ren et al.,
// "ZeRO-Offload: Democratizing Billion-Scale Model Training", USENIX ATC 2021):
// - Saves: all optimizer state (AdamW: 8 bytes/parameter) leaves the device,
//   and so does the update's temporary memory.
// - Costs: host memory for an fp32 master copy of the parameters, their
//   gradients and the state (AdamW: 16 bytes/parameter); two copies per step
//   (gradients to the host, parameters back); the update runs on the CPU.
// - On CUDA the host buffers are pinned so the copies are fast. On a
//   CPU-only machine "host" is the tracker's host pool (HostMemoryScope), so
//   the saving is measured, not assumed.
// - With bf16_params the device keeps bf16 parameters and gradients and the
//   host the fp32 masters: ZeRO-Offload's mixed-precision setup.
//
// bf16_params (MasterPlacement::kDevice; DeepSpeed's bf16 mode, "bf16
// weights + fp32 master" in eager PyTorch; strategies/mixed_precision.h):
// - The model's parameters are bf16 (2 bytes/parameter) and so are its
//   gradients; the fp32 masters (4 bytes/parameter) sit next to them on the
//   device and count as optimizer state, as ZeRO counts them (AdamW: 4 + 8).
// - The fp32 gradient each master needs exists only during step() (4
//   bytes/parameter then): a buffer kept between steps would add 4
//   bytes/parameter to every phase, forward and backward included, and the
//   device's caching allocator makes the per-step allocation cheap. Pinned
//   host buffers are costly to allocate, so on the host they are kept.
//
// Rules of step(), for either placement:
// - Each master's .grad becomes the model gradient converted to fp32; the
//   inner optimizer steps on the masters; each master is copied back into
//   its model parameter (copy_ rounds to the parameter's dtype).
// - Parameters without a gradient are skipped, as torch.optim does.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

namespace oomtune {

/// Makes the inner optimizer over the fp32 master copies of the parameters.
using OptimizerMaker = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

/// Where the fp32 master copies (and the inner optimizer's state) live.
enum class MasterPlacement {
  kDevice,  ///< on the parameters' device (bf16_params)
  kHost,    ///< host memory: pinned on CUDA, the tracker's host pool on CPU (offload)
};

/// An optimizer over fp32 master copies of the model's parameters.
class MasterWeightOptimizer {
 public:
  /// Copies each of `params` (the model's trainable parameters, any device
  /// and floating dtype) into a new fp32 tensor at `placement` and makes the
  /// inner optimizer over the copies. Call it before the parameters are cast
  /// to a lower precision, so the masters start from the exact fp32 values.
  /// The parameters are held by reference (the same TensorImpl): a later
  /// set_data on them is seen by step().
  MasterWeightOptimizer(std::vector<at::Tensor> params, MasterPlacement placement, const OptimizerMaker& make_inner);

  /// One update (see the rules above). `before_update`, when given, is
  /// called with the masters once their fp32 gradients are set and before
  /// the inner optimizer reads them (gradient clipping, which DeepSpeed
  /// applies to the fp32 gradients). With kHost every allocation, the
  /// hook's included, is tagged as host memory.
  void step(const std::function<void(const std::vector<at::Tensor>& masters)>& before_update = nullptr);

  /// Where the masters and the optimizer state live (device or host).
  MasterPlacement placement() const { return placement_; }
  /// The fp32 masters, one per parameter, in the parameters' order.
  const std::vector<at::Tensor>& masters() const { return masters_; }
  /// Bytes of the masters and of the fp32 gradient buffers alive now (SUM).
  int64_t buffer_bytes() const;
  /// The optimizer that updates the fp32 masters; its state lives where placement() says.
  torch::optim::Optimizer& inner() { return *inner_; }

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> masters_;
  MasterPlacement placement_;
  std::unique_ptr<torch::optim::Optimizer> inner_;
};

}  // namespace oomtune
