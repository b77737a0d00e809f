#include "strategies/mixed_precision.h"

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

bool DynamicLossScaler::unscale(const std::vector<at::Tensor>& params) const {
  at::NoGradGuard no_grad;
  bool finite = true;
  for (const at::Tensor& p : params) {
    if (!p.grad().defined()) continue;
    at::Tensor grad = p.grad();
    grad.div_(scale_);
    if (finite && !at::isfinite(grad).all().item<bool>()) finite = false;
  }
  return finite;
}

void DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= kBackoffFactor;
    good_steps_ = 0;
  } else if (++good_steps_ >= kGrowthInterval) {
    scale_ *= kGrowthFactor;
    good_steps_ = 0;
  }
}

}  // namespace oomtune
