#include "strategies/gradient_clipping.h"

#include <algorithm>
#include <optional>

#include <ATen/core/grad_mode.h>

#include "compat/torch_compat.h"
#include "strategies/optimizer_step.h"

namespace oomtune {
namespace {

constexpr int64_t kChunkSize = 65536;  // aten/src/ATen/native/cuda/MultiTensorApply.cuh

// The type CUDA kernels accumulate `dtype` in (at::opmath_type): fp32 for
// the half types, else the type itself.
at::ScalarType opmath_type(at::ScalarType dtype) {
  return dtype == at::kHalf || dtype == at::kBFloat16 ? at::kFloat : dtype;
}

// Elements of CUDA's scratch: one partial norm per chunk of the largest
// tensor, for every tensor (foreach_tensor_norm_cuda's ntensors *
// max_chunks_per_tensor).
int64_t scratch_elements(const std::vector<int64_t>& numels) {
  int64_t chunks = 0;
  for (const int64_t n : numels) chunks = std::max(chunks, (n + kChunkSize - 1) / kChunkSize);
  return static_cast<int64_t>(numels.size()) * chunks;
}

// torch._foreach_norm(grads, 2) over one device's and dtype's gradients,
// with the scratch CUDA's kernel makes before its outputs and frees after
// them where the real kernel does not run.
std::vector<at::Tensor> foreach_norm(const std::vector<at::Tensor>& grads, ClipPlacement placement) {
  const at::Tensor& first = grads.front();
  std::optional<at::Tensor> scratch;
  if (placement == ClipPlacement::kDevice && !first.is_cuda()) {
    std::vector<int64_t> numels;
    for (const at::Tensor& g : grads) numels.push_back(g.numel());
    scratch = at::zeros({scratch_elements(numels)}, first.options().dtype(opmath_type(first.scalar_type())));
  }
  return at::_foreach_norm(grads, 2);
}

}  // namespace

int64_t cuda_foreach_norm_scratch_bytes(const std::vector<int64_t>& numels, at::ScalarType dtype) {
  return scratch_elements(numels) * static_cast<int64_t>(c10::elementSize(opmath_type(dtype)));
}

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm, ClipPlacement placement) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return {};
  const auto groups = group_by_device_and_dtype(grads);
  std::vector<std::vector<at::Tensor>> grouped;
  for (const auto& indices : groups) {
    grouped.emplace_back();
    for (const std::size_t i : indices) grouped.back().push_back(grads[i]);
  }
  at::Tensor total_norm;
  {  // _get_total_norm: the norms and their stack go with it
    std::vector<at::Tensor> norms;
    for (const auto& group : grouped) {
      std::vector<at::Tensor> group_norms = foreach_norm(group, placement);
      norms.insert(norms.end(), group_norms.begin(), group_norms.end());
    }
    total_norm = at::linalg_vector_norm(at::stack(norms), 2);
  }
  // _clip_grads_with_norm_: `max_norm / (total_norm + 1e-6)` in Python's
  // operators, then the clamp.
  const at::Tensor clip_coef = at::reciprocal(total_norm + 1e-6) * max_norm;
  const at::Tensor clip_coef_clamped = at::clamp(clip_coef, c10::optional<at::Scalar>(), at::Scalar(1.0));
  for (const auto& group : grouped) compat::foreach_mul_(group, clip_coef_clamped);
  return total_norm;
}

}  // namespace oomtune
