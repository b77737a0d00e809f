// The CUDA backend's parts against a real GPU (CUDA builds only; built in
// CI by the PyPI configuration, run where a GPU is lent). Without a GPU
// each test but the last skips with the reason; the last says why no GPU
// answers here.

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "common/byte_size.h"
#include "probes/cuda_allocator_trace.h"
#include "probes/cuda_budget.h"
#include "probes/cuda_device.h"
#include "probes/cuda_stats_source.h"
#include "probes/device_phase_meter.h"
#include "probes/memory_tracker.h"
#include "strategies/job_config.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

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
  const at::Tensor gradient = cuda_floats(8 * kMiB);
  kept = at::Tensor();
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
  at::globalContext().lazyInitDevice(at::kCUDA);  // setMemoryFraction refuses a device not yet initialised
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

// The allocator's trace reaches the tracker at the sizes asked for (its
// 512 B rounding is the simulator's to apply), and every CPU block is host.
TEST(CudaBackend, TheTraceFeedGivesTheTrackerEveryBlock) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TrackerOptions options;
  options.device_feed = true;
  options.record_events = true;
  MemoryTracker tracker(options);
  CudaTraceFeed feed(tracker, 0);
  tracker.begin_phase(Phase::kForward);
  at::Tensor big = cuda_floats(4 * kMiB);
  {
    const at::Tensor odd = at::empty({250}, at::device(at::kCUDA).dtype(at::kFloat));  // 1000 B, 1024 B reserved
    EXPECT_EQ(tracker.block_bytes(odd.data_ptr()), 1000);
    EXPECT_EQ(tracker.live_bytes(), 4 * kMiB + 1000);
  }
  const at::Tensor host = at::empty({1000}, at::kFloat);
  tracker.end_phase();
  EXPECT_EQ(tracker.live_bytes(), 4 * kMiB);
  EXPECT_EQ(tracker.live_bytes(MemoryPool::kHost), 4000);
  EXPECT_EQ(tracker.phase(Phase::kForward).peak_bytes, 4 * kMiB + 1000);
  EXPECT_EQ(tracker.events().size(), 3u + 1u);  // big, odd, odd freed; the host block
}

// A whole trial on the GPU (issue #44 items 2 and 3): the static split is
// the CPU trial's to the byte (the tracker holds requested sizes from the
// trace), the phases and the peak are the allocator's (rounded: at least
// the tracker's), measured reserved comes with the predicted, and a budget
// under the step's peak is an out-of-memory result with the allocator's
// state.
TEST(CudaTrial, TheExampleGptTrainsOnTheGpuWithTheAllocatorsFigures) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  JobSpec job = testing::gpt_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrialOptions options = testing::quick_trial();
  options.enforce_budget = false;
  options.record_events = true;  // the predicted reserved bytes replay them
  const ProbeReport cpu = run_trial(job, baseline_config(job), options);
  ASSERT_EQ(cpu.outcome, TrialOutcome::kOk) << cpu.message;
  job.device = Device::kCuda;
  const ProbeReport gpu = run_trial(job, baseline_config(job), options);
  ASSERT_EQ(gpu.outcome, TrialOutcome::kOk) << gpu.message;
  EXPECT_EQ(gpu.static_memory.parameter_bytes, cpu.static_memory.parameter_bytes);
  EXPECT_EQ(gpu.static_memory.gradient_bytes, cpu.static_memory.gradient_bytes);
  EXPECT_EQ(gpu.static_memory.optimizer_state_bytes, cpu.static_memory.optimizer_state_bytes);
  ASSERT_TRUE(gpu.measured_reserved.has_value());
  ASSERT_TRUE(gpu.reserved.has_value());
  EXPECT_GE(gpu.measured_reserved->peak_reserved_bytes, gpu.peak_bytes);
  for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kOptimizer})
    EXPECT_GT(gpu.phases[static_cast<std::size_t>(p)].peak_bytes, 0) << phase_name(p);
  RecordProperty("cpu_peak_bytes", std::to_string(cpu.peak_bytes));
  RecordProperty("gpu_peak_bytes", std::to_string(gpu.peak_bytes));
  RecordProperty("gpu_measured_reserved_bytes", std::to_string(gpu.measured_reserved->peak_reserved_bytes));
  RecordProperty("gpu_predicted_reserved_bytes", std::to_string(gpu.reserved->peak_reserved_bytes));

  job.budget_bytes = gpu.peak_bytes / 2;
  job.headroom = 0;
  options.enforce_budget = true;
  const ProbeReport over = run_trial(job, baseline_config(job), options);
  EXPECT_EQ(over.outcome, TrialOutcome::kOutOfMemory) << over.message;
  EXPECT_NE(over.message.find("allocator: allocated "), std::string::npos) << over.message;
}

// Issue #44 item 7: the precisions and offload that ran on the CPU only so
// far, on the GPU. fp16 (dynamic loss scaling: CUDA only), bf16 autocast,
// and offload, whose fp32 masters, their gradients and AdamW's state (16
// bytes a parameter) sit in pinned host memory, which CUDA's host
// allocator rounds up to a power of two per block (so between 16 P and
// 32 P), with no optimizer state on the device.
TEST(CudaTrial, Fp16Bf16AndPinnedOffloadTrainOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  JobSpec job = testing::gpt_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  job.device = Device::kCuda;
  TrialOptions options = testing::quick_trial();
  options.enforce_budget = false;
  for (const char* overrides : {"precision=fp16", "precision=bf16", "offload=on", "offload=on,precision=bf16"}) {
    const TrainingConfig config = parse_config_overrides(overrides, baseline_config(job));
    const ProbeReport r = run_trial(job, config, options);
    ASSERT_EQ(r.outcome, TrialOutcome::kOk) << overrides << ": " << r.message;
    EXPECT_GE(r.steps_run, 2) << overrides;
    if (!config.offload_optimizer) continue;
    const int64_t p = r.parameter_count;
    EXPECT_EQ(r.static_memory.optimizer_state_bytes, 0) << overrides;
    EXPECT_GE(r.static_memory.optimizer_host_bytes, 16 * p) << overrides;
    EXPECT_LE(r.static_memory.optimizer_host_bytes, 32 * p) << overrides;
    // Pinned, from CUDA's host allocator: in the host peak a host budget is held to.
    EXPECT_GE(r.host_peak_bytes, r.static_memory.optimizer_host_bytes) << overrides;
  }
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
