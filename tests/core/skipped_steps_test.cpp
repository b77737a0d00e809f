// fp16's skipped steps (trial/trial_runner.cpp, Note [Skipped fp16 steps]):
// GradScaler skips the update of a step whose gradients overflowed, so the
// warm-up repeats until a step updates and makes the optimizer state, and a
// model whose gradients never fit is named. On the CPU with PyTorch 2
// (GradScaler's CPU kernels) and on meta, which never skips.

#include <string>

#include <gtest/gtest.h>

#include "common/error.h"
#include "compat/torch_compat.h"
#include "strategies/job_config.h"
#include "strategies/training_config.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

constexpr const char* kNoCpuGradScaler = "this libtorch has GradScaler's kernels for CUDA only";

ProbeReport fp16_trial(JobSpec job, Device device) {
  job.device = device;
  return run_trial(job, parse_config_overrides("precision=fp16", baseline_config(job)), testing::quick_trial());
}

TEST(SkippedSteps, TheWarmUpRunsUntilAStepUpdatesAndMakesTheOptimizerState) {
  if (!compat::has_cpu_grad_scaler_kernels()) GTEST_SKIP() << kNoCpuGradScaler;
  const JobSpec job = testing::amplified_job("amplified_1e3", 2);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = fp16_trial(job, Device::kCpu);
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  // 2^16 x 1e3 / 32 overflows fp16's 65504 in the first steps' gradients.
  // The mean's gradient is the same for every output, so fc's gradients
  // depend on the batch and the scale, not on the weights: once a scale
  // fits, every later step (the same batch) fits too, on any CPU. How many
  // scales were tried depends on the inputs' rounding and is not asserted.
  EXPECT_GE(r.skipped_steps, 1);
  EXPECT_EQ(r.timing.warmup_steps, r.skipped_steps + 1);
  EXPECT_FALSE(r.measured_step_skipped);
  // AdamW's two states, made by the first update after the skipped steps:
  // fc's 64 x 16 weights and 16 biases, fp32.
  EXPECT_EQ(r.parameter_count, 64 * 16 + 16);
  EXPECT_EQ(r.static_memory.optimizer_state_bytes, 2 * 4 * r.parameter_count);
  EXPECT_GT(r.steps_run, r.timing.warmup_steps);

  if (!compat::kMetaDeviceCounted) return;
  const ProbeReport meta = fp16_trial(job, Device::kMeta);  // no values, nothing overflows
  ASSERT_EQ(meta.outcome, TrialOutcome::kOk) << meta.message;
  EXPECT_EQ(meta.skipped_steps, 0);
  EXPECT_EQ(meta.timing.warmup_steps, 0);  // meta reports no timing
  EXPECT_EQ(meta.static_memory.optimizer_state_bytes, r.static_memory.optimizer_state_bytes);
}

TEST(SkippedSteps, AModelWhoseGradientsNeverFitFp16IsNamed) {
  if (!compat::has_cpu_grad_scaler_kernels()) GTEST_SKIP() << kNoCpuGradScaler;
  const JobSpec job = testing::amplified_job("amplified_inf", 2);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  try {
    const ProbeReport r = fp16_trial(job, Device::kCpu);
    FAIL() << "ran: " << to_string(r.outcome) << " " << r.message;
  } catch (const ModelError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the gradients of the first 24 steps held an inf or a NaN"), std::string::npos) << what;
    EXPECT_NE(what.find("does not train in fp16"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace oomtune
