// Gradient clipping (strategies/gradient_clipping.h) against the norm
// worked out by hand, against libtorch's own C++ clip_grad_norm_ (a
// separate implementation: one norm() per gradient, then mul_), and its
// allocations against the count of eager PyTorch's (tests/scripts/
// clip_grad_reference_test.py holds Python's to the same sequence) plus
// CUDA's foreach-norm scratch.

#include "strategies/gradient_clipping.h"

#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>  // before clip_grad.h, which libtorch 1.13 does not make self-contained

#include <torch/nn/utils/clip_grad.h>

#include "compat/torch_compat.h"
#include "probes/memory_tracker.h"

namespace oomtune {
namespace {

at::Tensor with_grad(const at::Tensor& grad) {
  at::Tensor p = at::zeros_like(grad).requires_grad_(true);
  p.mutable_grad() = grad.clone();
  return p;
}

TEST(GradientClipping, ScalesEveryGradientByMaxNormOverTheTotalNorm) {
  // Norms 5 and 12: the total is 13.
  const at::Tensor a = with_grad(at::tensor({3.0f, 4.0f}));
  const at::Tensor b = with_grad(at::tensor({12.0f}).reshape({1, 1}));
  const at::Tensor frozen = at::zeros({4}).requires_grad_(true);  // no gradient: left out
  const at::Tensor total = clip_grad_norm_({a, frozen, b}, 6.5);
  ASSERT_TRUE(total.defined());
  EXPECT_FLOAT_EQ(total.item<float>(), 13.0f);
  const double coef = 6.5 / (13.0 + 1e-6);
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), static_cast<float>(3.0 * coef));
  EXPECT_FLOAT_EQ(a.grad()[1].item<float>(), static_cast<float>(4.0 * coef));
  EXPECT_FLOAT_EQ(b.grad()[0][0].item<float>(), static_cast<float>(12.0 * coef));
  EXPECT_FALSE(frozen.grad().defined());
}

TEST(GradientClipping, LeavesGradientsBelowMaxNormAsTheyAre) {
  at::manual_seed(1);
  const at::Tensor a = with_grad(at::randn({7, 5}));
  const at::Tensor before = a.grad().clone();
  const at::Tensor total = clip_grad_norm_({a}, 1e3);
  EXPECT_FLOAT_EQ(total.item<float>(), before.norm().item<float>());
  EXPECT_TRUE(at::equal(a.grad(), before));  // times a clamped coefficient of exactly 1
}

TEST(GradientClipping, NoGradientsNoNorm) {
  const at::Tensor p = at::zeros({3}).requires_grad_(true);
  EXPECT_FALSE(clip_grad_norm_({p}, 1.0).defined());
  EXPECT_FALSE(clip_grad_norm_({}, 1.0).defined());
}

TEST(GradientClipping, MatchesLibtorchsClipGradNormAcrossDtypes) {
  at::manual_seed(2);
  std::vector<at::Tensor> ours, theirs;
  for (const auto& [shape, dtype] : std::vector<std::pair<std::vector<int64_t>, at::ScalarType>>{
           {{64, 33}, at::kFloat}, {{33}, at::kFloat}, {{200000}, at::kFloat}, {{17, 3}, at::kBFloat16}}) {
    const at::Tensor grad = at::randn(shape).to(dtype);
    ours.push_back(with_grad(grad));
    theirs.push_back(with_grad(grad));
  }
  const at::Tensor total = clip_grad_norm_(ours, 0.25);
  const double expected = torch::nn::utils::clip_grad_norm_(theirs, 0.25);
  EXPECT_NEAR(total.item<double>(), expected, 1e-5 * expected);
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const at::Tensor x = ours[i].grad().to(at::kFloat), y = theirs[i].grad().to(at::kFloat);
    // bf16 gradients: one rounding of the product (2^-8 relative).
    const double rtol = ours[i].scalar_type() == at::kBFloat16 ? std::ldexp(1.0, -8) : 1e-5;
    EXPECT_TRUE(at::allclose(x, y, rtol, 1e-7)) << "gradient " << i;
  }
}

TEST(GradientClipping, ScratchIsOnePartialNormPerChunkOfTheLargestTensorForEveryTensor) {
  // 65536 elements a chunk: the largest tensor has 4 chunks, so 3 x 4
  // partial norms in fp32, for fp32 and bf16 lists alike.
  EXPECT_EQ(cuda_foreach_norm_scratch_bytes({10, 200000, 65536}, at::kFloat), 3 * 4 * 4);
  EXPECT_EQ(cuda_foreach_norm_scratch_bytes({10, 200000, 65536}, at::kBFloat16), 3 * 4 * 4);
  EXPECT_EQ(cuda_foreach_norm_scratch_bytes({65536}, at::kDouble), 8);
  EXPECT_EQ(cuda_foreach_norm_scratch_bytes({}, at::kFloat), 0);
}

struct ClipBytes {
  int64_t allocated = 0, allocations = 0, peak_above_start = 0, left = 0;
};

ClipBytes measure_clip(const c10::Device& device, ClipPlacement placement) {
  TrackerOptions options;
  options.count_meta = device.is_meta();
  MemoryTracker tracker(options);
  std::vector<at::Tensor> params;
  for (const int64_t n : {10, 200000, 300}) {
    at::Tensor p = at::zeros({n}, at::TensorOptions(device)).requires_grad_(true);
    p.mutable_grad() = at::ones({n}, at::TensorOptions(device));
    params.push_back(p);
  }
  tracker.reset_statistics();
  tracker.begin_phase(Phase::kOptimizer);
  clip_grad_norm_(params, 1.0, placement);  // the total norm dropped, as a loop that does not log it
  tracker.end_phase();
  const PhaseMemory phase = tracker.phase(Phase::kOptimizer);
  return {phase.allocated_bytes, phase.allocations, phase.peak_bytes - phase.start_bytes,
          phase.end_bytes - phase.start_bytes};
}

// Three fp32 gradients, the largest of 200000 elements (4 chunks): CUDA's
// scratch of 3 x 4 fp32 partial norms (48 B) with the 3 norms (12 B) made
// beside it; then the stack (12 B) and the total (4 B) while the norms are
// alive; then `total + 1e-6`, its reciprocal, that times max_norm and the
// clamp (4 B each). Eager PyTorch's sequence without the scratch, on the
// CPU: tests/scripts/clip_grad_reference_test.py.
void expect_clip_bytes(const c10::Device& device) {
  constexpr int64_t kScratch = 3 * 4 * 4, kNorms = 3 * 4;
  const ClipBytes on_device = measure_clip(device, ClipPlacement::kDevice);
  EXPECT_EQ(on_device.allocated, kScratch + kNorms + kNorms + 4 + 4 * 4);
  EXPECT_EQ(on_device.allocations, 1 + 3 + 1 + 1 + 4);
  EXPECT_EQ(on_device.peak_above_start, kScratch + kNorms);
  EXPECT_EQ(on_device.left, 0);
  // Offload's host masters: the CPU's foreach norm, no scratch.
  const ClipBytes on_host = measure_clip(device, ClipPlacement::kHost);
  EXPECT_EQ(on_host.allocated, kNorms + kNorms + 4 + 4 * 4);
  EXPECT_EQ(on_host.allocations, 3 + 1 + 1 + 4);
  EXPECT_EQ(on_host.peak_above_start, kNorms + kNorms + 4);
  EXPECT_EQ(on_host.left, 0);
}

TEST(GradientClipping, AllocatesEagerPyTorchsScalarsPlusCudasScratchOnTheCpu) { expect_clip_bytes(at::kCPU); }

TEST(GradientClipping, AllocatesTheSameOnMeta) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << "libtorch 1.13 makes meta tensors without the registered allocator";
  expect_clip_bytes(c10::Device(c10::kMeta));
}

}  // namespace
}  // namespace oomtune
