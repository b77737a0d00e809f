// The search's memory and time models on their own: lines given by hand, so
// every expectation below is arithmetic on those lines (written out in the
// comments), independent of the code under test.

#include "search/memory_model.h"
#include "search/model_fit.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>

#include "strategies/accumulation.h"

namespace oomtune {
namespace {

constexpr auto kForward = static_cast<std::size_t>(Phase::kForward);
constexpr auto kLoss = static_cast<std::size_t>(Phase::kLoss);
constexpr auto kBackward = static_cast<std::size_t>(Phase::kBackward);
constexpr auto kOptimizer = static_cast<std::size_t>(Phase::kOptimizer);

// Base lines (bytes = intercept + slope * b): forward 1000 + 100 b, loss
// 1200 + 50 b, backward 900 + 150 b, optimizer 2000 (flat). A micro-batch
// takes 0.1 + 0.01 b s, the optimizer step 0.5 s; gradients are 400 bytes.
StepModels base_models() {
  StepModels m;
  m.phases[kForward] = {1000, 100};
  m.phases[kLoss] = {1200, 50};
  m.phases[kBackward] = {900, 150};
  m.phases[kOptimizer] = {2000, 0};
  m.seconds = {0.1, 0.01};
  m.optimizer_seconds = 0.5;
  m.gradient_bytes = 400;
  return m;
}

TrainingConfig at(int64_t micro_batch) {
  TrainingConfig c;
  c.micro_batch = micro_batch;
  return c;
}

TEST(MicroBatchCount, IsTheNumberOfSlicesOfTheSplit) {
  for (int64_t g = 1; g <= 40; ++g)
    for (int64_t b = 1; b <= g; ++b)
      EXPECT_EQ(micro_batch_count(g, b), static_cast<int64_t>(split_global_batch(g, b, true).size()))
          << g << " / " << b;
}

TEST(MicroBatchCount, DoesNotOverflowNearInt64Max) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();  // 2^63 - 1
  EXPECT_EQ(micro_batch_count(kMax, 1), kMax);
  EXPECT_EQ(micro_batch_count(kMax, 2), int64_t{1} << 62);  // (2^63 - 1) / 2 rounded up
  EXPECT_EQ(micro_batch_count(kMax, kMax), 1);
}

TEST(FitPhaseLines, TwoProbesGiveEachPhaseItsOwnLine) {
  // Probes at 4 and 8: forward 1400 -> 1800 (1000 + 100 b), backward
  // 1500 -> 2100 (900 + 150 b), loss 1400 -> 1600, optimizer 2000 twice.
  const PhaseLines lines = fit_phase_lines({4, 8}, {{0, 1400, 1400, 1500, 2000}, {0, 1800, 1600, 2100, 2000}}, nullptr);
  EXPECT_NEAR(lines[kForward].intercept, 1000, 1e-9);
  EXPECT_NEAR(lines[kForward].slope, 100, 1e-9);
  EXPECT_NEAR(lines[kLoss].intercept, 1200, 1e-9);
  EXPECT_NEAR(lines[kLoss].slope, 50, 1e-9);
  EXPECT_NEAR(lines[kBackward].intercept, 900, 1e-9);
  EXPECT_NEAR(lines[kBackward].slope, 150, 1e-9);
  EXPECT_NEAR(lines[kOptimizer].intercept, 2000, 1e-9);
  EXPECT_NEAR(lines[kOptimizer].slope, 0, 1e-9);
  // Loading is not a step phase: its line stays zero.
  const auto load = static_cast<std::size_t>(Phase::kLoad);
  EXPECT_EQ(lines[load].intercept, 0);
  EXPECT_EQ(lines[load].slope, 0);
}

TEST(FitPhaseLines, OneProbeTakesTheFallbackSlopes) {
  PhaseLines fallback{};
  fallback[kForward].slope = 100;
  fallback[kBackward].slope = 150;
  // One probe at 8: forward 1800 - 100 * 8 = 1000, backward 2100 - 1200 = 900,
  // loss and optimizer flat (fallback slope 0) through their value.
  const PhaseLines lines = fit_phase_lines({8}, {{0, 1800, 1600, 2100, 2000}}, &fallback);
  EXPECT_NEAR(lines[kForward].intercept, 1000, 1e-9);
  EXPECT_NEAR(lines[kForward].slope, 100, 1e-9);
  EXPECT_NEAR(lines[kBackward].intercept, 900, 1e-9);
  EXPECT_NEAR(lines[kLoss].intercept, 1600, 1e-9);
  EXPECT_NEAR(lines[kLoss].slope, 0, 1e-9);
  // Without fallback lines, flat too.
  EXPECT_NEAR(fit_phase_lines({8}, {{0, 1800, 1600, 2100, 2000}}, nullptr)[kForward].slope, 0, 1e-9);
}

TEST(FitPhaseLines, NoProbesOrMismatchedSizesThrow) {
  EXPECT_THROW(fit_phase_lines({}, {}, nullptr), std::invalid_argument);
  EXPECT_THROW(fit_phase_lines({4, 8}, {{0, 1400, 1400, 1500, 2000}}, nullptr), std::invalid_argument);
}

TEST(Predict, OneMicroBatchPeaksInItsLargestPhase) {
  const StepModels m = base_models();
  // b = 8: forward 1800, loss 1600, backward 2100, optimizer 2000.
  StepPrediction p = predict(m, at(8), 8);
  EXPECT_DOUBLE_EQ(p.peak_bytes, 2100);
  EXPECT_DOUBLE_EQ(p.seconds_per_global_batch, 0.1 + 0.08 + 0.5);
  // b = 4: forward 1400, loss 1400, backward 1500, optimizer 2000 (flat
  // AdamW state and temporaries outweigh the activations).
  p = predict(m, at(4), 4);
  EXPECT_DOUBLE_EQ(p.peak_bytes, 2000);
  EXPECT_DOUBLE_EQ(p.seconds_per_global_batch, 0.1 + 0.04 + 0.5);
}

TEST(Predict, LaterMicroBatchesCarryTheGradientsAndTheOptimizerRunsOnce) {
  const StepModels m = base_models();
  // 16 = 8 + 8: the second 8 runs with 400 gradient bytes alive: backward
  // 2100 + 400. Two micro-batches' seconds and one optimizer step.
  StepPrediction p = predict(m, at(8), 16);
  EXPECT_DOUBLE_EQ(p.peak_bytes, 2500);
  EXPECT_DOUBLE_EQ(p.seconds_per_global_batch, 2 * (0.1 + 0.08) + 0.5);
  // 12 = 8 + 4: the remainder 4 carries the gradients: backward 1500 + 400
  // stays below the first micro-batch's 2100; its seconds are of size 4.
  p = predict(m, at(8), 12);
  EXPECT_DOUBLE_EQ(p.peak_bytes, 2100);
  EXPECT_DOUBLE_EQ(p.seconds_per_global_batch, (0.1 + 0.08) + (0.1 + 0.04) + 0.5);
  // 20 = 8 + 8 + 4.
  p = predict(m, at(8), 20);
  EXPECT_DOUBLE_EQ(p.peak_bytes, 2500);
  EXPECT_DOUBLE_EQ(p.seconds_per_global_batch, 2 * (0.1 + 0.08) + (0.1 + 0.04) + 0.5);
  // The optimizer phase never adds the gradients (they are its input, already
  // in its measured line): flat 2000 beats every other phase at b = 1, and
  // accumulation over 4 micro-batches leaves it at 2000, backward at 1050 + 400.
  p = predict(m, at(1), 4);
  EXPECT_DOUBLE_EQ(p.peak_bytes, 2000);
}

// Note [Backward activation peak]: backward's activation line 300 + 200 b
// (a step's first micro-batch, 100 gradient bytes made by then) and
// accumulating line 900 + 120 b (a later one, less the 400 stored gradient
// bytes: a large gradient pending at small b), measured.
TEST(Predict, BackwardPeaksAtTheLargerOfItsPhaseLineAndItsActivationLines) {
  StepModels m = base_models();
  m.backward_activation_measured = true;
  m.backward_activation = {300, 200};
  m.backward_activation_gradient_bytes = 100;
  m.accumulating_backward = {900, 120};
  // b = 4: forward 1400, loss 1400, backward 1500, optimizer 2000;
  // activation 300 + 800 = 1100.
  EXPECT_DOUBLE_EQ(predict(m, at(4), 4).peak_bytes, 2000);
  // b = 16: forward 2600, loss 2000, backward 3300; activation 300 + 3200.
  EXPECT_DOUBLE_EQ(predict(m, at(16), 16).peak_bytes, 3500);
  // 16 = 8 + 8: the second 8 peaks on its accumulating line, 900 + 960,
  // above its activation line less its gradients, 1900 - 100: + 400 = 2260
  // (forward 1800 + 400; backward's phase line, which holds this backward's
  // own gradients, 2100 without the stored ones).
  EXPECT_DOUBLE_EQ(predict(m, at(8), 16).peak_bytes, 2260);
  // 32 = 16 + 16: the activations have passed it: max(900 + 1920,
  // 3500 - 100) + 400 = 3800 (forward 2600 + 400).
  EXPECT_DOUBLE_EQ(predict(m, at(16), 32).peak_bytes, 3800);
  // Unmeasured, the lines are not read: backward 3300 + 400.
  StepModels unmeasured = m;
  unmeasured.backward_activation_measured = false;
  EXPECT_DOUBLE_EQ(predict(unmeasured, at(16), 16).peak_bytes, 3300);
  EXPECT_DOUBLE_EQ(predict(unmeasured, at(16), 32).peak_bytes, 3700);
  // 8-bit AdamW moves both lines by its shift: 2900 at 16 (forward 2000,
  // backward 2700, optimizer 800); with a second 16, max(2820 - 600,
  // 2900 - 100) + 400 (forward 2400).
  StepModels eight = m;
  StrategyEffect& eight_bit = eight.effect(Strategy::kAdamW8bit);
  eight_bit.available = true;
  eight_bit.shift_bytes[kForward] = eight_bit.shift_bytes[kLoss] = -600;
  eight_bit.shift_bytes[kBackward] = -600;
  eight_bit.shift_bytes[kOptimizer] = -1200;
  eight_bit.backward_activation = eight_bit.accumulating_backward = {-600, 1};
  TrainingConfig c = at(16);
  c.optimizer = OptimizerKind::kAdamW8bit;
  EXPECT_DOUBLE_EQ(predict(eight, c, 16).peak_bytes, 2900);
  EXPECT_DOUBLE_EQ(predict(eight, c, 32).peak_bytes, 3200);
  // Checkpointing the first 2 of 4 blocks applies half its activation
  // effect (+100, slope x 0.25 when whole): 350 + 200 * 0.625 * 32 = 4350
  // at b = 32, above backward's 950 + 93.75 * 32 = 3950 and forward's 3050.
  StepModels ckpt = m;
  ckpt.checkpoint_blocks = 4;
  StrategyEffect& checkpointing = ckpt.effect(Strategy::kCheckpointing);
  checkpointing.available = true;
  checkpointing.slope_ratio = {1, 0.25, 0.25, 0.25, 0.25};
  checkpointing.shift_bytes[kForward] = checkpointing.shift_bytes[kLoss] = 100;
  checkpointing.shift_bytes[kBackward] = 100;
  checkpointing.backward_activation = {100, 0.25};
  c = at(32);
  c.checkpoint.mode = CheckpointPlan::Mode::kFirstN;
  c.checkpoint.first_n = 2;
  EXPECT_DOUBLE_EQ(predict(ckpt, c, 32).peak_bytes, 4350);
}

TEST(Predict, StrategiesAddShiftsAndMultiplyRatios) {
  StepModels m = base_models();
  // 8-bit AdamW: state 600 bytes smaller in every phase, 1200 in the
  // optimizer's (its temporaries too); the optimizer step 1.4x slower.
  StrategyEffect& eight_bit = m.effect(Strategy::kAdamW8bit);
  eight_bit.available = true;
  eight_bit.shift_bytes[kForward] = eight_bit.shift_bytes[kLoss] = eight_bit.shift_bytes[kBackward] = -600;
  eight_bit.shift_bytes[kOptimizer] = -1200;
  eight_bit.optimizer_time_ratio = 1.4;
  // bf16: half the activation bytes per sample; 0.8x a micro-batch's fixed
  // seconds, 0.5x its per-sample seconds.
  StrategyEffect& bf16 = m.effect(Strategy::kBf16);
  bf16.available = true;
  bf16.slope_ratio = {1, 0.5, 0.5, 0.5, 0.5};
  bf16.time_ratio = 0.8;
  bf16.time_slope_ratio = 0.5;
  TrainingConfig c = at(8);
  c.optimizer = OptimizerKind::kAdamW8bit;
  c.precision = Precision::kBf16;
  // forward 400 + 50 * 8 = 800, loss 600 + 25 * 8 = 800, backward
  // 300 + 75 * 8 = 900, optimizer 800. Seconds 0.08 + 0.005 * 8 + 0.5 * 1.4.
  StepPrediction p = predict(m, c, 8);
  EXPECT_DOUBLE_EQ(p.peak_bytes, 900);
  EXPECT_NEAR(p.seconds_per_global_batch, 0.08 + 0.04 + 0.7, 1e-12);
  // Probed in bf16 already: bf16 is the base's, not a strategy.
  m.base_precision = Precision::kBf16;
  p = predict(m, c, 8);
  // forward 400 + 800 = 1200, loss 600 + 400, backward 300 + 1200 = 1500,
  // optimizer 800. Seconds 0.1 + 0.08 + 0.7.
  EXPECT_DOUBLE_EQ(p.peak_bytes, 1500);
  EXPECT_NEAR(p.seconds_per_global_batch, 0.1 + 0.08 + 0.7, 1e-12);
}

TEST(Predict, CheckpointingAppliesInProportionToTheBlocksItCheckpoints) {
  StepModels m = base_models();
  m.checkpoint_blocks = 4;
  // All 4 blocks: a quarter of the activation bytes per sample, 100 bytes
  // of recompute buffers in forward, loss and backward; 1.2x a
  // micro-batch's fixed seconds, 1.4x its per-sample seconds.
  m.effect(Strategy::kCheckpointing).available = true;
  m.effect(Strategy::kCheckpointing).slope_ratio = {1, 0.25, 0.25, 0.25, 0.25};
  m.effect(Strategy::kCheckpointing).shift_bytes[kForward] = m.effect(Strategy::kCheckpointing).shift_bytes[kLoss] =
      m.effect(Strategy::kCheckpointing).shift_bytes[kBackward] = 100;
  m.effect(Strategy::kCheckpointing).time_ratio = 1.2;
  m.effect(Strategy::kCheckpointing).time_slope_ratio = 1.4;
  TrainingConfig c = at(16);
  c.checkpoint.mode = CheckpointPlan::Mode::kAll;
  // Fraction 1: forward 1100 + 25 * 16 = 1500, loss 1300 + 12.5 * 16 =
  // 1500, backward 1000 + 37.5 * 16 = 1600, optimizer 2000.
  // Seconds 0.12 + 0.014 * 16 + 0.5.
  StepPrediction all = predict(m, c, 16);
  EXPECT_DOUBLE_EQ(all.peak_bytes, 2000);
  EXPECT_NEAR(all.seconds_per_global_batch, 0.12 + 0.224 + 0.5, 1e-12);

  // The first 2 of 4: fraction 0.5, slope x (1 - 0.5 * 0.75) = 0.625,
  // shift 50: backward 950 + 93.75 * 16 = 2450 (forward 1050 + 1000).
  // Seconds: intercept x 1.1, slope x 1.2: 0.11 + 0.012 * 16 + 0.5.
  c.checkpoint.mode = CheckpointPlan::Mode::kFirstN;
  c.checkpoint.first_n = 2;
  const StepPrediction half = predict(m, c, 16);
  EXPECT_DOUBLE_EQ(half.peak_bytes, 2450);
  EXPECT_NEAR(half.seconds_per_global_batch, 0.11 + 0.192 + 0.5, 1e-12);
  // Every 2nd block (0 and 2) and two named paths are the same half.
  c.checkpoint.mode = CheckpointPlan::Mode::kEveryK;
  c.checkpoint.every_k = 2;
  EXPECT_DOUBLE_EQ(predict(m, c, 16).peak_bytes, 2450);
  c.checkpoint.mode = CheckpointPlan::Mode::kPaths;
  c.checkpoint.paths = {"blocks.1", "blocks.3"};
  EXPECT_DOUBLE_EQ(predict(m, c, 16).peak_bytes, 2450);
  // Every 3rd: blocks 0 and 3, half again (ceil(4 / 3) = 2).
  c.checkpoint.mode = CheckpointPlan::Mode::kEveryK;
  c.checkpoint.every_k = 3;
  EXPECT_DOUBLE_EQ(predict(m, c, 16).peak_bytes, 2450);
  // More blocks than there are: all of them, no more.
  c.checkpoint.mode = CheckpointPlan::Mode::kFirstN;
  c.checkpoint.first_n = 9;
  EXPECT_DOUBLE_EQ(predict(m, c, 16).peak_bytes, all.peak_bytes);
  EXPECT_DOUBLE_EQ(predict(m, c, 16).seconds_per_global_batch, all.seconds_per_global_batch);
  // Block count unknown (0): the plan is taken as all.
  m.checkpoint_blocks = 0;
  EXPECT_DOUBLE_EQ(predict(m, c, 16).peak_bytes, all.peak_bytes);
}

}  // namespace
}  // namespace oomtune

namespace oomtune {
namespace {

// Against a GPU budget a probe's allocated bytes count as what its
// allocator reserves: measured on the GPU where the trial ran there, else
// predicted from its events; on the CPU and meta they count as they are.
TEST(BudgetScale, OnCudaMeasuredReservedBeatsPredictedAndElsewhereIsOne) {
  JobSpec job;
  job.device = Device::kCuda;
  ProbeReport r;
  r.peak_bytes = 1000;
  EXPECT_EQ(budget_scale(r, job), 1.0);
  r.reserved = ReservedPrediction{};
  r.reserved->peak_reserved_bytes = 1500;
  EXPECT_EQ(budget_scale(r, job), 1.5);
  r.measured_reserved = MeasuredReserved{};
  r.measured_reserved->peak_reserved_bytes = 1200;
  EXPECT_EQ(budget_scale(r, job), 1.2);
  job.device = Device::kCpu;
  EXPECT_EQ(budget_scale(r, job), 1.0);
}

}  // namespace
}  // namespace oomtune
