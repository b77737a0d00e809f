// Trials of a job whose steps vary in length (issue #47 item 2; trial/
// trial_runner.cpp, Note [Variable-length steps]): the warm-up and the
// measured step at the distribution's longest, every later step at its drawn
// length, which each step's own peak confirms against a trial at that length
// alone; the timing rule; and a fixed-length job's report without any of it.

#include <gtest/gtest.h>
#include <algorithm>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "job/length_distribution.h"
#include "strategies/job_config.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

// COUNT: tokens, the distribution's min and max (gpt_seq's position table
// holds 1024): long enough that a step's activations, which grow with its
// length, pass the optimizer step's peak.
constexpr int64_t kShortest = 160;
constexpr int64_t kLongest = 320;
constexpr uint64_t kSeed = 7;

// The example GPT with a "seq" dimension (examples/export_models.py --only
// gpt_seq): input_ids and targets [batch, seq] in [0, 1000), next-token
// cross-entropy, every step at `seq` tokens; plain SGD (no state, one
// parameter's temporaries), so the optimizer step's peak stays below the
// activations'.
JobSpec gpt_seq_job(int64_t global_batch, int64_t seq) {
  JobSpec job = testing::gpt_job(global_batch);
  job.model_path = testing::example_model("gpt_seq");
  for (InputSpec& input : job.inputs) input.shape = {kBatchDim, kSeqDim};
  job.seq_len = seq;
  job.seed = kSeed;
  job.optimizer.kind = "sgd";
  return job;
}

// The same job with lengths drawn uniformly from [kShortest, kLongest], as
// `seq = { min = 16, max = 64, distribution = "uniform" }` reads.
JobSpec variable_job(int64_t global_batch) {
  JobSpec job = gpt_seq_job(global_batch, kLongest);
  job.seq_min = kShortest;
  job.seq_lengths = LengthDistribution::uniform(kShortest, kLongest);
  return job;
}

// `steps` steps, events recorded (the step peaks come from them).
TrialOptions steps_with_events(int64_t steps) {
  TrialOptions options;
  options.total_steps = steps;
  options.record_events = true;
  return options;
}

TrainingConfig config_of(const JobSpec& job, int64_t micro_batch, int64_t accumulation_steps) {
  TrainingConfig config = baseline_config(job);
  config.micro_batch = micro_batch;
  config.accumulation_steps = accumulation_steps;
  return config;
}

// Steps 1 and 2 at the longest, step k >= 3 at the (k - 3)'th draw: each
// later step's peak is that of a trial whose steps all run at that step's
// length, and the reference's bytes are those of the unmodified
// fixed-length trial. Checked for one micro-batch per step and for two
// micro-batches sharing the step's length.
class VariableLengthTrial : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(VariableLengthTrial, RunsEachLaterStepAtItsDrawnLength) {
  const auto [micro_batch, accumulation] = GetParam();
  const JobSpec job = variable_job(2);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const TrainingConfig config = config_of(job, micro_batch, accumulation);
  constexpr int64_t kSteps = 5;
  const ProbeReport r = run_trial(job, config, steps_with_events(kSteps));
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  ASSERT_EQ(r.steps_run, kSteps);

  const std::vector<int64_t> drawn = draw_lengths(*job.seq_lengths, kSteps - 2, kSeed);
  std::vector<int64_t> expected = {kLongest, kLongest};
  expected.insert(expected.end(), drawn.begin(), drawn.end());
  EXPECT_EQ(r.step_lengths, expected);
  // The seed draws lengths below the longest and not all one: a trial that
  // ran every step at the longest would fail below.
  ASSERT_GT(std::set<int64_t>(drawn.begin(), drawn.end()).size(), 1u);
  ASSERT_LT(*std::min_element(drawn.begin(), drawn.end()), kLongest);

  ASSERT_EQ(r.step_peak_bytes.size(), static_cast<std::size_t>(kSteps - 1));
  // Each length has a peak of its own (activations, not the optimizer's
  // state, make the peak at these lengths): else the checks below could not
  // tell the lengths apart.
  EXPECT_EQ(std::set<int64_t>(r.step_peak_bytes.begin() + 1, r.step_peak_bytes.end()).size(),
            std::set<int64_t>(drawn.begin(), drawn.end()).size());
  // The tracker's own peak over steps 2.. is the largest step peak.
  EXPECT_EQ(*std::max_element(r.step_peak_bytes.begin(), r.step_peak_bytes.end()), r.peak_bytes);
  // The measured step holds the longest batch: no later step peaks higher.
  for (int64_t peak : r.step_peak_bytes) EXPECT_LE(peak, r.step_peak_bytes[0]);

  for (int64_t length : std::set<int64_t>(drawn.begin(), drawn.end())) {
    // Every step at `length`: a distribution of one length.
    JobSpec at_length = gpt_seq_job(2, length);
    at_length.seq_min = length;
    at_length.seq_lengths = LengthDistribution::fixed(length);
    const ProbeReport reference = run_trial(at_length, config, steps_with_events(3));
    ASSERT_EQ(reference.outcome, TrialOutcome::kOk) << reference.message;
    ASSERT_EQ(reference.step_lengths, std::vector<int64_t>({length, length, length}));
    ASSERT_EQ(reference.step_peak_bytes.size(), 2u);
    // And the plain fixed-length trial, no distribution, peaks the same.
    const ProbeReport plain = run_trial(gpt_seq_job(2, length), config, steps_with_events(3));
    ASSERT_EQ(plain.outcome, TrialOutcome::kOk) << plain.message;
    EXPECT_EQ(plain.peak_bytes, std::max(reference.step_peak_bytes[0], reference.step_peak_bytes[1]));
    for (std::size_t k = 3; k <= static_cast<std::size_t>(kSteps); ++k) {
      if (r.step_lengths[k - 1] != length) continue;
      EXPECT_EQ(r.step_peak_bytes[k - 2], reference.step_peak_bytes[1]) << "step " << k << " at " << length;
    }
  }

  // The lengths and peaks travel to the parent in the child's JSON.
  const ProbeReport carried = probe_report_from_json(to_json(r));
  EXPECT_EQ(carried.step_lengths, r.step_lengths);
  EXPECT_EQ(carried.step_peak_bytes, r.step_peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(MicroBatches, VariableLengthTrial,
                         ::testing::Values(std::pair<int64_t, int64_t>{2, 1}, std::pair<int64_t, int64_t>{1, 2}));

// The timing rule: no early stop (consecutive steps at other lengths cannot
// agree), 2 + max_timed_steps steps, the step and optimizer seconds the
// means of the drawn steps (3 on), samples/s the global batch over that,
// and `steady` not judged.
TEST(VariableLengthTiming, TimesEveryDrawnStepAndReportsTheMean) {
  const JobSpec job = variable_job(2);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrialOptions options;
  options.min_timed_steps = 1;
  options.max_timed_steps = 4;
  options.timing_tolerance = 1e9;  // any two times agree: a fixed-length trial would stop at step 3
  const ProbeReport r = run_trial(job, baseline_config(job), options);
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_EQ(r.steps_run, 6);
  ASSERT_EQ(r.timing.step_seconds.size(), 5u);
  ASSERT_EQ(r.timing.optimizer_seconds.size(), 5u);
  EXPECT_EQ(r.step_lengths.size(), 6u);
  double steps = 0, optimizer = 0;
  for (std::size_t i = 1; i < 5; ++i) {
    steps += r.timing.step_seconds[i];
    optimizer += r.timing.optimizer_seconds[i];
  }
  EXPECT_DOUBLE_EQ(r.timing.steady_step_seconds, steps / 4);
  EXPECT_DOUBLE_EQ(r.timing.steady_optimizer_seconds, optimizer / 4);
  EXPECT_DOUBLE_EQ(r.samples_per_second, 2 / r.timing.steady_step_seconds);
  EXPECT_FALSE(r.timing.steady);
  // Without events, no step peaks.
  EXPECT_TRUE(r.step_peak_bytes.empty());

  // The same options on the fixed-length job stop at the first agreement.
  const JobSpec fixed = gpt_seq_job(2, kLongest);
  const ProbeReport f = run_trial(fixed, baseline_config(fixed), options);
  ASSERT_EQ(f.outcome, TrialOutcome::kOk) << f.message;
  EXPECT_EQ(f.steps_run, 3);
  EXPECT_TRUE(f.timing.steady);
}

// Without a distribution nothing is added: no lengths, no step peaks, in
// the report or its JSON, and the step time is the median as before.
TEST(VariableLengthTiming, AFixedLengthJobsReportHasNoneOfIt) {
  const JobSpec job = gpt_seq_job(2, kLongest);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = run_trial(job, baseline_config(job), steps_with_events(4));
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_TRUE(r.step_lengths.empty());
  EXPECT_TRUE(r.step_peak_bytes.empty());
  const nlohmann::json j = to_json(r);
  EXPECT_FALSE(j.contains("step_lengths"));
  EXPECT_FALSE(j.contains("step_peak_bytes"));
  std::vector<double> sorted = r.timing.step_seconds;
  ASSERT_EQ(sorted.size(), 3u);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_DOUBLE_EQ(r.timing.steady_step_seconds, sorted[1]);
}

}  // namespace
}  // namespace oomtune
