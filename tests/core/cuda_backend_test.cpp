// The CUDA backend's parts against a real GPU (CUDA builds only; built in
// CI by the PyPI configuration, run where a GPU is lent). Without a GPU
// each test but the last skips with the reason; the last says why no GPU
// answers here.

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "probes/cuda_budget.h"
#include "probes/cuda_device.h"
#include "probes/cuda_stats_source.h"
#include "probes/device_phase_meter.h"

namespace oomtune {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

at::Tensor cuda_floats(int64_t bytes) { return at::empty({bytes / 4}, at::device(at::kCUDA).dtype(at::kFloat)); }

// 4 MiB blocks are multiples of the allocator's 512 B rounding: the
// allocated-bytes counters see exactly what was asked for.
TEST(CudaBackend, ThePhaseMeterReadsTheAllocatorsCounters) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Tensor weights = cuda_floats(8 * kMiB);
  CudaStatsSource source(0);
  DevicePhaseMeter meter(source);
  const int64_t base = meter.live_bytes();
  meter.begin_phase(Phase::kForward);
  at::Tensor kept = cuda_floats(4 * kMiB);
  { const at::Tensor temporary = cuda_floats(4 * kMiB); }
  meter.begin_phase(Phase::kBackward);
  kept = at::Tensor();
  const at::Tensor gradient = cuda_floats(8 * kMiB);
  meter.end_phase();
  const PhaseMemory forward = meter.phase(Phase::kForward);
  EXPECT_EQ(forward.start_bytes, base);
  EXPECT_EQ(forward.peak_bytes - base, 8 * kMiB);
  EXPECT_EQ(forward.end_bytes - base, 4 * kMiB);
  EXPECT_EQ(forward.allocations, 2);
  EXPECT_EQ(forward.allocated_bytes, 8 * kMiB);
  EXPECT_GE(forward.reserved_peak_bytes, forward.peak_bytes);
  const PhaseMemory backward = meter.phase(Phase::kBackward);
  EXPECT_EQ(backward.peak_bytes - base, 12 * kMiB) << "its own peak: 4 MiB kept while the gradient is made";
  EXPECT_EQ(backward.end_bytes - base, 8 * kMiB);
  EXPECT_EQ(meter.peak_bytes() - base, 12 * kMiB);
}

// The budget is the allocator's limit on reserved bytes: within it the
// tensors come; past it c10::OutOfMemoryError, as on a full GPU.
TEST(CudaBackend, TheFractionCapsTheAllocatorAtTheBudget) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  namespace allocator = c10::cuda::CUDACachingAllocator;
  allocator::emptyCache();
  const int64_t total = static_cast<int64_t>(allocator::get()->getMemoryInfo(0).second);
  const int64_t budget = 256 * kMiB;
  allocator::setMemoryFraction(allocator_fraction(budget, total), 0);
  {
    const at::Tensor fits = cuda_floats(200 * kMiB);
    EXPECT_THROW(cuda_floats(100 * kMiB), c10::OutOfMemoryError);
  }
  allocator::setMemoryFraction(1.0, 0);
  allocator::emptyCache();
}

TEST(CudaBackend, TheDeviceFactsSeeTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const CudaDeviceFacts facts = read_cuda_device_facts();
  EXPECT_EQ(cuda_device_problem(facts), "");
  EXPECT_GE(facts.device_count, 1);
}

TEST(CudaBackend, WithoutAGpuTheFactsSayWhy) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible";
  EXPECT_NE(cuda_device_problem(read_cuda_device_facts()), "");
}

}  // namespace
}  // namespace oomtune
