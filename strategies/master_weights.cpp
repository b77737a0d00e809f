#include "strategies/master_weights.h"

#include <optional>

#include <ATen/core/grad_mode.h>

#include "probes/memory_tracker.h"

namespace oomtune {
namespace {

/// An uninitialised fp32 tensor shaped like `param`, at `placement`.
at::Tensor fp32_like(const at::Tensor& param, MasterPlacement placement) {
  if (placement == MasterPlacement::kDevice) return at::empty(param.sizes(), param.options().dtype(at::kFloat));
  // A meta parameter's host copy stays on meta: it has no data to copy, and
  // the tracker counts it as host memory inside the HostMemoryScope
  // (probes/memory_tracker.h).
  if (param.is_meta()) return at::empty(param.sizes(), param.options().dtype(at::kFloat));
  // Pinned memory only exists with CUDA; on CPU a plain host tensor.
  const bool pin = param.is_cuda();
  return at::empty(param.sizes(), at::TensorOptions().dtype(at::kFloat).device(at::kCPU).pinned_memory(pin));
}

}  // namespace

MasterWeightOptimizer::MasterWeightOptimizer(std::vector<at::Tensor> params, MasterPlacement placement,
                                             const OptimizerMaker& make_inner)
    : params_(std::move(params)), placement_(placement) {
  std::optional<HostMemoryScope> host;
  if (placement_ == MasterPlacement::kHost) host.emplace();
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : params_) {
    at::Tensor master = fp32_like(p, placement_);
    master.copy_(p);
    master.set_requires_grad(true);
    masters_.push_back(master);
  }
  inner_ = make_inner(masters_);
}

void MasterWeightOptimizer::step(const std::function<void(const std::vector<at::Tensor>& masters)>& before_update) {
  std::optional<HostMemoryScope> host;
  if (placement_ == MasterPlacement::kHost) host.emplace();
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& grad = params_[i].grad();
    at::Tensor& master = masters_[i];
    if (!grad.defined()) {
      master.mutable_grad() = at::Tensor();
      continue;
    }
    if (placement_ == MasterPlacement::kDevice) {
      // Released again below (see the header); an fp32 gradient is shared, not copied.
      master.mutable_grad() = grad.to(at::kFloat);
      continue;
    }
    if (!master.grad().defined()) master.mutable_grad() = fp32_like(master, placement_);
    // Blocking: the CPU update below reads the buffer at once, and a
    // non-blocking device-to-host copy may still be in flight then.
    master.mutable_grad().copy_(grad);
  }
  if (before_update) before_update(masters_);
  inner_->step();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& param = params_[i];
    if (!param.grad().defined()) continue;
    // Host to device may overlap when no conversion is needed; a converting
    // non-blocking copy would first stage the fp32 master on the device.
    const bool same_dtype = param.scalar_type() == masters_[i].scalar_type();
    param.copy_(masters_[i], /*non_blocking=*/same_dtype && placement_ == MasterPlacement::kHost);
    if (placement_ == MasterPlacement::kDevice) masters_[i].mutable_grad() = at::Tensor();
  }
}

int64_t MasterWeightOptimizer::buffer_bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor& m : masters_) {
    bytes += static_cast<int64_t>(m.nbytes());
    if (m.grad().defined()) bytes += static_cast<int64_t>(m.grad().nbytes());
  }
  return bytes;
}

}  // namespace oomtune
