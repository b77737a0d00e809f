// The measured step's events written by a trial (TrialOptions::
// step_events_path, `probe --step-events`) on the example GPT at several
// sequence lengths: the same step at every length, whose requests a
// LengthModel fitted at three lengths reproduces to the byte at a fourth it
// did not see, with the T² requests of eager attention found (issue #47).
// The fit is exact only if every request is c0 + c1·T + c2·T²: a byte off
// anywhere in the step at T = 64 fails.

#include <filesystem>

#include <gtest/gtest.h>

#include "allocsim/length_model.h"
#include "allocsim/step_events_json.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

// The example GPT (max_len 64) at sequence length `t`, batch 4, one
// micro-batch; its events written to a temporary file and read back.
allocsim::LengthSample gpt_step_at(int64_t t) {
  JobSpec job = testing::gpt_job(4);
  for (InputSpec& input : job.inputs) input.shape[1] = t;
  TrialOptions options;
  options.min_timed_steps = 1;
  options.max_timed_steps = 1;
  options.record_events = true;
  options.step_events_path =
      (std::filesystem::temp_directory_path() / ("oomtune-step-events-" + std::to_string(t) + ".json")).string();
  TrainingConfig config;
  config.micro_batch = 4;
  const ProbeReport report = run_trial(job, config, options);
  EXPECT_EQ(report.outcome, TrialOutcome::kOk) << report.message;
  allocsim::LengthSample sample;
  sample.length = t;
  sample.events = allocsim::read_step_events(options.step_events_path);
  std::filesystem::remove(options.step_events_path);
  return sample;
}

TEST(StepEvents, TheGptsStepIsAPolynomialInTheSequenceLength) {
  OOMTUNE_REQUIRE_FILE(testing::gpt_job(4).model_path);
  const allocsim::LengthModel model = allocsim::LengthModel::fit({gpt_step_at(16), gpt_step_at(32), gpt_step_at(48)});
  const allocsim::LengthSample unseen = gpt_step_at(64);
  const std::vector<allocsim::AllocEvent> predicted = model.at(64);
  ASSERT_EQ(predicted.size(), unseen.events.size());
  for (std::size_t i = 0; i < predicted.size(); ++i)
    ASSERT_EQ(predicted[i].bytes, unseen.events[i].bytes) << "event " << i << " (" << unseen.events[i].op << ")";
  // Eager attention: the scores and their softmax are B·heads·T², one pair
  // or more per block (4 blocks).
  const auto quadratic = model.quadratic_requests();
  EXPECT_GE(quadratic.size(), 8u);
  bool softmax = false;
  for (const auto& [index, op] : quadratic) softmax = softmax || op.find("softmax") != std::string::npos;
  EXPECT_TRUE(softmax) << "no softmax among the T² requests";
  // A steady step: libtorch's zero_grad zeroes the gradients in place, so
  // the step neither keeps what it makes nor frees what an earlier one made.
  EXPECT_EQ(model.carried_out(), 0u);
  EXPECT_EQ(model.carried_in(), 0u);
}

}  // namespace
}  // namespace oomtune
