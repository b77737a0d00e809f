// Trials in child processes: a crash, a hang or an OOM costs one trial.

#include "trial/child_trial.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include "quick_trial.h"
#include "strategies/training_step.h"
#include "support/require_file.h"
#include "test_jobs.h"

namespace oomtune {
namespace {

class ChildTrial : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("OOMTUNE_TEST_FAULT"); }

  static ProbeReport run(const JobSpec& job, double timeout = 120) {
    const TrialOptions options = testing::one_timed_step();
    ChildTrialOptions child;
    child.executable = OOMTUNE_BINARY;
    child.timeout_seconds = timeout;
    return run_trial_in_child(job, baseline_config(job), options, child);
  }
};

TEST_F(ChildTrial, AnOrdinaryTrialReportsWhatAnInProcessOneDoes) {
  const JobSpec job = testing::mlp_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport child = run(job);
  ASSERT_EQ(child.outcome, TrialOutcome::kOk) << child.message;
  const TrialOptions options = testing::one_timed_step();
  const ProbeReport here = run_trial(job, baseline_config(job), options);
  EXPECT_EQ(child.static_memory.parameter_bytes, here.static_memory.parameter_bytes);
  EXPECT_EQ(child.static_memory.optimizer_state_bytes, here.static_memory.optimizer_state_bytes);
  EXPECT_EQ(child.peak_bytes, here.peak_bytes);
  EXPECT_GT(child.kernel_scratch.allocations, 0);
  EXPECT_EQ(child.kernel_scratch.peak_bytes, here.kernel_scratch.peak_bytes);
  EXPECT_EQ(child.kernel_scratch.op, here.kernel_scratch.op);
}

TEST_F(ChildTrial, ASegfaultIsACrashNamingSignalAndPhase) {
  const JobSpec job = testing::mlp_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  setenv("OOMTUNE_TEST_FAULT", "segv:forward", 1);
  const ProbeReport r = run(job);
  EXPECT_EQ(r.outcome, TrialOutcome::kCrashed);
  EXPECT_EQ(r.message, "crashed: SIGSEGV during forward");
  EXPECT_EQ(r.phase_at_failure, Phase::kForward);
}

TEST_F(ChildTrial, AnAbortInBackwardIsACrashToo) {
  const JobSpec job = testing::mlp_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  setenv("OOMTUNE_TEST_FAULT", "abort:backward", 1);
  const ProbeReport r = run(job);
  EXPECT_EQ(r.outcome, TrialOutcome::kCrashed);
  EXPECT_EQ(r.message, "crashed: SIGABRT during backward");
}

TEST_F(ChildTrial, AHangIsATimeout) {
  const JobSpec job = testing::mlp_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  setenv("OOMTUNE_TEST_FAULT", "hang:optimizer", 1);
  const ProbeReport r = run(job, 3);
  EXPECT_EQ(r.outcome, TrialOutcome::kTimeout);
  EXPECT_NE(r.message.find("timeout"), std::string::npos);
}

TEST_F(ChildTrial, OutOfMemoryAndBadModelsAreOutcomes) {
  JobSpec job = testing::mlp_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  job.budget_bytes = 1 << 20;  // below the MLP's parameters + state
  job.headroom = 0;
  EXPECT_EQ(run(job).outcome, TrialOutcome::kOutOfMemory);
  job.budget_bytes.reset();
  job.model_path = "/nonexistent.pt";
  const ProbeReport r = run(job);
  EXPECT_EQ(r.outcome, TrialOutcome::kError);
  EXPECT_EQ(r.message, "/nonexistent.pt: no such model file");
}

}  // namespace
}  // namespace oomtune
