#include "strategies/optimizer_offload.h"

#include <ATen/core/grad_mode.h>

#include "probes/memory_tracker.h"

namespace oomtune {
namespace {

at::Tensor host_like(const at::Tensor& device_tensor) {
  // Pinned memory only exists with CUDA; on CPU a plain host tensor.
  const bool pin = device_tensor.is_cuda();
  return at::empty(device_tensor.sizes(),
                   at::TensorOptions().dtype(at::kFloat).device(at::kCPU).pinned_memory(pin));
}

}  // namespace

OffloadedOptimizer::OffloadedOptimizer(std::vector<at::Tensor> device_params, const OptimizerMaker& make_inner)
    : device_params_(std::move(device_params)) {
  HostMemoryScope host;
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : device_params_) {
    at::Tensor master = host_like(p);
    master.copy_(p);
    master.set_requires_grad(true);
    host_params_.push_back(master);
  }
  inner_ = make_inner(host_params_);
}

void OffloadedOptimizer::step() {
  HostMemoryScope host;
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < device_params_.size(); ++i) {
    const at::Tensor& grad = device_params_[i].grad();
    at::Tensor& master = host_params_[i];
    if (!grad.defined()) {
      master.mutable_grad() = at::Tensor();
      continue;
    }
    if (!master.grad().defined()) master.mutable_grad() = host_like(master);
    master.mutable_grad().copy_(grad, /*non_blocking=*/true);
  }
  inner_->step();
  for (std::size_t i = 0; i < device_params_.size(); ++i)
    if (device_params_[i].grad().defined()) device_params_[i].copy_(host_params_[i], /*non_blocking=*/true);
}

int64_t OffloadedOptimizer::host_buffer_bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor& p : host_params_) {
    bytes += p.nbytes();
    if (p.grad().defined()) bytes += p.grad().nbytes();
  }
  return bytes;
}

}  // namespace oomtune
