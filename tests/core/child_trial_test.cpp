// Trials in child processes: a crash, a hang or an OOM costs one trial.

#include "trial/child_trial.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/remove_tree.h"
#include "compat/torch_compat.h"
#include "quick_trial.h"
#include "strategies/job_config.h"
#include "strategies/training_step.h"
#include "support/build_values.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_module.h"
#include "trial/trial_request.h"

namespace oomtune {
namespace {

class ChildTrial : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("OOMTUNE_TEST_FAULT"); }

  static ProbeReport run(const JobSpec& job, double timeout = 120) {
    const TrialOptions options = testing::one_timed_step();
    ChildTrialOptions child;
    child.executable = testing::kOomtuneBinary;
    child.timeout_seconds = timeout;
    return run_trial_in_child(job, baseline_config(job), options, child);
  }
};

// What the child is asked travels whole: each option the parent sets comes
// back from the request file as it was set.
// /proc/self/exe of a binary rebuilt while it ran reads "PATH (deleted)":
// its folder is gone from under it, so the trial module is not looked for
// at "/proc/self/liboomtune_trial_module.so" (what a failed canonical()
// left) but the executable is named with what happened.
TEST(TrialModule, AnExecutableReplacedWhileItRanIsNamed) {
  const auto dir = std::filesystem::temp_directory_path() / ("oomtune_replaced_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto link = dir / "exe";
  std::filesystem::remove(link);
  std::filesystem::create_symlink("/opt/build/oomtune (deleted)", link);
  try {
    require_trial_module(link.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "/opt/build/oomtune: the oomtune executable was replaced or removed while it ran (rebuilt?); run it "
              "again");
  }
  remove_tree(dir.string());  // not std::filesystem::remove_all: libtorch's copy of it crashes (remove_tree.h)
}

TEST(TrialRequestFile, TheOptionsTravelWhole) {
  TrialOptions options;
  options.min_timed_steps = 3;
  options.max_timed_steps = 5;
  options.total_steps = 20;
  options.enforce_budget = false;
  options.record_events = true;
  options.step_events_path = "/tmp/events.json";
  options.snapshot_path = "oomtune-snapshots/gpt-2-8x1.pickle";
  options.timing_tolerance = 0.25;
  options.device_check_only = true;
  const JobSpec job = testing::gpt_job(8);
  const std::string path =
      testing::write_temp_file("request.json", trial_request_json(job, baseline_config(job), options).dump());
  const TrialOptions back = read_trial_request(path).options;
  EXPECT_EQ(back.min_timed_steps, 3);
  EXPECT_EQ(back.max_timed_steps, 5);
  EXPECT_EQ(back.total_steps, 20);
  EXPECT_FALSE(back.enforce_budget);
  EXPECT_TRUE(back.record_events);
  EXPECT_EQ(back.step_events_path, "/tmp/events.json");
  EXPECT_EQ(back.snapshot_path, "oomtune-snapshots/gpt-2-8x1.pickle");
  EXPECT_DOUBLE_EQ(back.timing_tolerance, 0.25);
  EXPECT_TRUE(back.device_check_only);
}

// The device check autotune asks a child for first: the job's device is
// checked and nothing else, not even the model file, which here is missing.
TEST(TrialDeviceCheck, ChecksTheDeviceAndLoadsNothing) {
  JobSpec job = testing::gpt_job(8);
  job.model_path = "no_such_model.pt";
  TrialOptions check;
  check.device_check_only = true;
  const ProbeReport r = run_trial(job, TrainingConfig{}, check);
  EXPECT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_EQ(r.steps_run, 0);
  EXPECT_ANY_THROW(run_trial(job, TrainingConfig{}, testing::one_timed_step()));  // the model is looked for
  // From a child, as autotune asks it: the empty report comes back whole.
  ChildTrialOptions child;
  child.executable = testing::kOomtuneBinary;
  const ProbeReport from_child = run_trial_in_child(job, TrainingConfig{}, check, child);
  EXPECT_EQ(from_child.outcome, TrialOutcome::kOk) << from_child.message;
  job.device = Device::kMeta;
  if (compat::kMetaDeviceCounted)
    EXPECT_EQ(run_trial(job, TrainingConfig{}, check).outcome, TrialOutcome::kOk);
  else
    EXPECT_THROW(run_trial(job, TrainingConfig{}, check), InputError);  // libtorch 1.13 cannot count meta
}

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

// TrialServer: the search's meta runs in one child. On the meta device a
// trial holds no data and no cache, so trials served one after another
// report what fresh children do, byte for byte: the GPT at three
// micro-batches (accumulating below the global batch 8), checkpointed and
// with 8-bit AdamW, in any order.
TEST_F(ChildTrial, MetaTrialsInOneChildReportWhatFreshChildrenDo) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  JobSpec job = testing::gpt_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  job.device = Device::kMeta;
  ChildTrialOptions child;
  child.executable = testing::kOomtuneBinary;
  child.timeout_seconds = 120;
  TrialOptions options;
  options.enforce_budget = false;
  options.record_events = true;
  std::vector<TrainingConfig> configs;
  for (int64_t micro_batch : {8, 2, 4}) {
    TrainingConfig c = baseline_config(job);
    c.micro_batch = micro_batch;
    c.accumulation_steps = 8 / micro_batch;
    configs.push_back(c);
  }
  configs.push_back(configs[1]);
  configs.back().checkpoint.mode = CheckpointPlan::Mode::kAll;
  configs.push_back(configs[0]);
  configs.back().optimizer = OptimizerKind::kAdamW8bit;
  TrialServer server(child);
  for (const TrainingConfig& c : configs) {
    SCOPED_TRACE(to_string(c));
    const ProbeReport served = server.run(job, c, options);
    const ProbeReport fresh = run_trial_in_child(job, c, options, child);
    ASSERT_EQ(served.outcome, TrialOutcome::kOk) << served.message;
    ASSERT_EQ(fresh.outcome, TrialOutcome::kOk) << fresh.message;
    EXPECT_GT(served.peak_bytes, 0);
    EXPECT_EQ(served.peak_bytes, fresh.peak_bytes);
    for (std::size_t p = 0; p < kNumPhases; ++p) EXPECT_EQ(served.phases[p].peak_bytes, fresh.phases[p].peak_bytes);
    EXPECT_EQ(served.static_memory.optimizer_state_bytes, fresh.static_memory.optimizer_state_bytes);
    ASSERT_EQ(served.reserved.has_value(), fresh.reserved.has_value());
    if (served.reserved) {
      EXPECT_EQ(served.reserved->peak_reserved_bytes, fresh.reserved->peak_reserved_bytes);
    }
  }
  EXPECT_EQ(server.children_started(), 1);
}

// A served trial that crashes, or hangs past the timeout, is that trial's
// outcome, as in a child of its own; the next trial runs in a fresh child
// (the faults name micro-batch 4 only: "micro_batch=4,"). The timeout is
// five times what a trial of its own took (at least 3 s): a loaded machine
// stretches every trial, the hang's outcome stays a timeout.
TEST_F(ChildTrial, AServedTrialThatCrashesOrHangsCostsThatTrialOnly) {
  const JobSpec job = testing::mlp_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  ChildTrialOptions child;
  child.executable = testing::kOomtuneBinary;
  child.timeout_seconds = 120;
  TrainingConfig small = baseline_config(job);
  small.micro_batch = 4;
  small.accumulation_steps = 2;
  const TrialOptions options = testing::one_timed_step();
  const auto start = std::chrono::steady_clock::now();
  const ProbeReport alone = run_trial_in_child(job, baseline_config(job), options, child);
  ASSERT_EQ(alone.outcome, TrialOutcome::kOk) << alone.message;
  child.timeout_seconds =
      std::ceil(std::max(3.0, 5 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
  for (const std::string fault : {"segv:backward:micro_batch=4,", "hang:optimizer:micro_batch=4,"}) {
    SCOPED_TRACE(fault);
    setenv("OOMTUNE_TEST_FAULT", fault.c_str(), 1);
    TrialServer server(child);  // its children take the environment as they start
    EXPECT_EQ(server.run(job, baseline_config(job), options).peak_bytes, alone.peak_bytes);
    const ProbeReport failed = server.run(job, small, options);
    if (fault[0] == 's') {
      EXPECT_EQ(failed.outcome, TrialOutcome::kCrashed) << failed.message;
      EXPECT_EQ(failed.message, "crashed: SIGSEGV during backward");
    } else {
      EXPECT_EQ(failed.outcome, TrialOutcome::kTimeout);
      EXPECT_EQ(failed.message, fmt::format("timeout: no result after {:.0f} s", child.timeout_seconds));
    }
    const ProbeReport after = server.run(job, baseline_config(job), options);
    ASSERT_EQ(after.outcome, TrialOutcome::kOk) << after.message;
    EXPECT_EQ(after.peak_bytes, alone.peak_bytes);
    EXPECT_EQ(server.children_started(), 2) << "one before the fault, a fresh one after";
  }
}

}  // namespace
}  // namespace oomtune
