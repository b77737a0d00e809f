// The measured step's events written by a trial (TrialOptions::
// step_events_path, `probe --step-events`) on the example GPT at several
// sequence lengths: the same step at every length, whose requests a
// LengthModel fitted at three lengths reproduces to the byte at a fourth it
// did not see, with the T² requests of eager attention found (issue #47).
// The fit is exact only if every request is c0 + c1·T + c2·T²: a byte off
// anywhere in the step at T = 64 fails.

#include <gtest/gtest.h>

#include "allocsim/length_model.h"
#include "allocsim/step_events_json.h"
#include "support/require_file.h"
#include "support/scratch_path.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

// The example GPT (max_len 64) at sequence length `t`, batch 4, one
// micro-batch; its events written to a temporary file and read back.
allocsim::LengthSample gpt_step_at(int64_t t, std::vector<int64_t>* persistent = nullptr,
                                   StaticMemory* static_memory = nullptr) {
  JobSpec job = testing::gpt_job(4);
  for (InputSpec& input : job.inputs) input.shape[1] = t;
  TrialOptions options;
  options.min_timed_steps = 1;
  options.max_timed_steps = 1;
  options.record_events = true;
  options.step_events_path = testing::scratch_path("step-events-" + std::to_string(t) + ".json").string();
  TrainingConfig config;
  config.micro_batch = 4;
  const ProbeReport report = run_trial(job, config, options);
  EXPECT_EQ(report.outcome, TrialOutcome::kOk) << report.message;
  allocsim::LengthSample sample;
  sample.length = t;
  allocsim::StepEvents read = allocsim::read_step_events(options.step_events_path);
  sample.events = std::move(read.events);
  if (persistent) *persistent = std::move(read.persistent_bytes);
  if (static_memory) *static_memory = report.static_memory;
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
  // A steady step: the gradients are set to None after the optimizer step
  // (session/train_step.cpp, clear_gradients, as torch.optim's
  // zero_grad(set_to_none=True)); what it keeps is its last micro-batch,
  // the GPT's input_ids and targets, until the next step's copy frees them
  // (strategies/training_step.cpp, Note [The batch in the optimizer step]).
  EXPECT_EQ(model.carried_out(), 2u);
  EXPECT_EQ(model.carried_in(), 2u);
}

// What a replay of many steps allocates first: everything alive across the
// step, which for this GPT is the weights, the buffers and AdamW's two
// moments and step count per parameter (the gradients live from backward
// to the step's end only), exactly that part of the static split the trial
// measured, and the same at every length.
TEST(StepEvents, ThePersistentAllocationsAreTheStaticSplit) {
  OOMTUNE_REQUIRE_FILE(testing::gpt_job(4).model_path);
  std::vector<int64_t> at16, at48;
  StaticMemory split;
  gpt_step_at(16, &at16, &split);
  gpt_step_at(48, &at48);
  EXPECT_EQ(at16, at48);
  int64_t sum = 0;
  for (int64_t bytes : at16) sum += bytes;
  EXPECT_GT(split.optimizer_state_bytes, 2 * split.parameter_bytes - 1);  // two moments per parameter at least
  EXPECT_EQ(sum, split.parameter_bytes + split.buffer_bytes + split.optimizer_state_bytes);
}

}  // namespace
}  // namespace oomtune
