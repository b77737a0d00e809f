#include "strategies/mixed_precision.h"

#include <cmath>
#include <map>
#include <stdexcept>
#include <unordered_set>

#include <ATen/core/grad_mode.h>

namespace oomtune {
namespace {

void cast_in_place(at::Tensor tensor, at::ScalarType dtype, std::unordered_set<const c10::TensorImpl*>& seen) {
  if (!tensor.is_floating_point() || !seen.insert(tensor.unsafeGetTensorImpl()).second) return;
  // set_data keeps the TensorImpl the module's slot holds (and requires_grad),
  // so the graph and autograd see the new data; `to` makes the bf16 copy and
  // the old storage is freed when nothing else holds it.
  tensor.set_data(tensor.to(dtype));
}

}  // namespace

std::optional<at::ScalarType> autocast_dtype(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return std::nullopt;
    case Precision::kBf16:
      return at::kBFloat16;
    case Precision::kFp16:
      return at::kHalf;
    case Precision::kBf16Params:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<at::ScalarType> parameter_dtype(Precision precision) {
  if (precision == Precision::kBf16Params) return at::kBFloat16;
  return std::nullopt;
}

PrecisionForm precision_form(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return PrecisionForm::kFp32;
    case Precision::kBf16:
    case Precision::kFp16:
      return PrecisionForm::kAutocast;
    case Precision::kBf16Params:
      return PrecisionForm::kHalfParameters;
  }
  return PrecisionForm::kUnknown;
}

void cast_floating_point(torch::jit::Module& module, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& p : module.parameters(/*recurse=*/true)) cast_in_place(p, dtype, seen);
  for (const at::Tensor& b : module.buffers(/*recurse=*/true)) cast_in_place(b, dtype, seen);
}

Batch cast_model_inputs(const Batch& batch, const std::string& target, at::ScalarType dtype) {
  Batch out = batch;
  for (std::size_t i = 0; i < out.tensors.size(); ++i)
    if (out.names[i] != target && out.tensors[i].is_floating_point()) out.tensors[i] = out.tensors[i].to(dtype);
  return out;
}

at::Tensor DynamicLossScaler::scale(const at::Tensor& loss) {
  if (!scale_.defined()) {  // GradScaler._lazy_init_scale_growth_tracker
    scale_ = at::full({}, kInitScale, loss.options().dtype(at::kFloat));
    growth_tracker_ = at::zeros({}, loss.options().dtype(at::kInt));
  }
  return loss * scale_;
}

namespace {
// _MultiDeviceReplicator.get: `master.to(device, non_blocking=True,
// copy=True)`, a copy also on the master's own device.
at::Tensor replicate(const at::Tensor& master) {
  return master.to(master.device(), master.scalar_type(), /*non_blocking=*/true, /*copy=*/true);
}
}  // namespace

void DynamicLossScaler::unscale_grads(const std::vector<at::Tensor>& params, const at::Tensor& inv_scale,
                                      const at::Tensor& found_inf) {
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) by_dtype[p.grad().scalar_type()].push_back(p.grad());
  if (by_dtype.empty()) {  // GradScaler would find no inf check to read
    found_inf_ = found_inf;
    return;
  }
  // The call's arguments in Python's order: found_inf's copy, then inv_scale's.
  found_inf_ = replicate(found_inf);
  const at::Tensor device_inv_scale = replicate(inv_scale);
  for (const auto& [dtype, grads] : by_dtype)
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, device_inv_scale);
}

void DynamicLossScaler::unscale_(const std::vector<at::Tensor>& params) {
  if (!scale_.defined()) throw std::logic_error("DynamicLossScaler::unscale_ before scale");
  if (unscaled_) throw std::logic_error("DynamicLossScaler::unscale_ twice before update");
  at::NoGradGuard no_grad;
  // The reciprocal in fp64, as GradScaler.unscale_ computes it.
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  unscale_grads(params, inv_scale, at::zeros({}, scale_.options()));
  unscaled_ = true;
}

bool DynamicLossScaler::step(const std::vector<at::Tensor>& params, AmpScaledStep* fused,
                             const std::function<void()>& optimizer_step) {
  if (!scale_.defined()) throw std::logic_error("DynamicLossScaler::step before scale");
  if (fused == nullptr || !fused->supports_amp_scaling()) {
    if (!unscaled_) unscale_(params);
    if (amp_step_skipped(found_inf_)) return true;
    optimizer_step();
    return false;
  }
  at::NoGradGuard no_grad;
  if (!unscaled_) {  // _check_inf_per_device: the check alone, with an inverse scale of 1
    const at::Tensor dummy_inv_scale = at::full({}, 1.0, scale_.options());
    unscale_grads(params, dummy_inv_scale, at::zeros({}, scale_.options()));
  }
  // Python's sum() of the per-device found_infs starts at 0: a new tensor.
  const at::Tensor found_inf = found_inf_ + 0;
  // `scaler * getattr(optimizer, "grad_scale", 1)`, or after unscale_ the
  // optimizer's own grad_scale: none.
  fused->set_amp_scaling({unscaled_ ? at::Tensor() : scale_ * 1, found_inf});
  optimizer_step();
  fused->set_amp_scaling({});  // del optimizer.grad_scale, optimizer.found_inf
  return amp_step_skipped(found_inf);
}

void DynamicLossScaler::update() {
  if (!found_inf_.defined()) throw std::logic_error("DynamicLossScaler::update before step");
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, kGrowthFactor, kBackoffFactor, kGrowthInterval);
  found_inf_ = at::Tensor();
  unscaled_ = false;
}

double DynamicLossScaler::scale_value() const {
  if (!scale_.defined()) return kInitScale;
  return scale_.is_meta() ? std::nan("") : scale_.item<double>();
}

}  // namespace oomtune
