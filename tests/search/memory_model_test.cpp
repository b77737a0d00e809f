// The search's memory and time models on their own: lines given by hand, so
// every expectation below is arithmetic on those lines (written out in the
// comments), independent of the code under test.

#include "search/memory_model.h"
#include "search/model_fit.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

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

// `m` with 8-bit AdamW's effect as on base_models: state 600 bytes smaller
// in every phase, 1200 in the optimizer's (its temporaries too), backward's
// activation lines moved as its phase line.
StepModels with_eight_bit(StepModels m) {
  StrategyEffect& e = m.effect(Strategy::kAdamW8bit);
  e.available = true;
  e.shift_bytes[kForward] = e.shift_bytes[kLoss] = e.shift_bytes[kBackward] = -600;
  e.shift_bytes[kOptimizer] = -1200;
  e.backward_activation = e.accumulating_backward = {-600, 1};
  return m;
}

// bf16 halves the activation bytes per sample; a micro-batch takes 0.8x
// its fixed seconds and 0.5x its per-sample seconds.
StrategyEffect half_bf16() {
  StrategyEffect e;
  e.available = true;
  e.slope_ratio = {1, 0.5, 0.5, 0.5, 0.5};
  e.time_ratio = 0.8;
  e.time_slope_ratio = 0.5;
  return e;
}

// `m` with backward's activation lines measured (Note [Backward activation
// peak]): `first`, `gradient_bytes` of gradients made by its moment, and
// `accumulating`.
StepModels with_activation_lines(StepModels m, BatchLine first, double gradient_bytes, BatchLine accumulating) {
  m.backward_activation_measured = true;
  m.backward_activation = first;
  m.backward_activation_gradient_bytes = gradient_bytes;
  m.accumulating_backward = accumulating;
  return m;
}

// A micro-batch of `micro_batch` with 8-bit AdamW.
TrainingConfig eight_bit_at(int64_t micro_batch) {
  TrainingConfig c = at(micro_batch);
  c.optimizer = OptimizerKind::kAdamW8bit;
  return c;
}

// `m` with 4 blocks to checkpoint, all of which keep a quarter of the
// activation bytes per sample in forward, loss and backward.
StepModels with_quarter_checkpointing(StepModels m) {
  m.checkpoint_blocks = 4;
  StrategyEffect& e = m.effect(Strategy::kCheckpointing);
  e.available = true;
  e.slope_ratio = {1, 0.25, 0.25, 0.25, 0.25};
  return m;
}

// Step seconds by least squares with the slope at least 0; the expected
// lines are worked out by hand from the points.
TEST(FitTimeLine, NeverFalls) {
  const auto expect_line = [](const BatchLine& line, double intercept, double slope) {
    EXPECT_NEAR(line.intercept, intercept, 1e-12);
    EXPECT_NEAR(line.slope, slope, 1e-12);
  };
  // Rising: the least-squares line itself, 0.5 + 0.25 b.
  expect_line(fit_time_line({2, 4}, {1.0, 1.5}), 0.5, 0.25);
  // Falling (the PyPI build's example GPT on a loaded CPU): flat at the
  // mean, 0.83.
  expect_line(fit_time_line({2, 4, 8}, {1.03, 0.63, 0.83}), 0.83, 0);
  // Below the origin at 0 and rising (a spill): kept, -0.3 + 0.2 b.
  expect_line(fit_time_line({2, 4, 8}, {0.1, 0.5, 1.3}), -0.3, 0.2);
  // One point: flat.
  expect_line(fit_time_line({4}, {2.0}), 2.0, 0);
  EXPECT_THROW(fit_time_line({}, {}), std::invalid_argument);
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

TEST(DivisibleGlobalBatches, AreTheMultiplesBelowAndAboveOrTheGlobalBatchItself) {
  EXPECT_EQ(divisible_global_batches(31, 8), "24 or 32");
  EXPECT_EQ(divisible_global_batches(31, 7), "28 or 35");
  EXPECT_EQ(divisible_global_batches(32, 8), "32");
  EXPECT_EQ(divisible_global_batches(15, 15), "15");
  EXPECT_EQ(divisible_global_batches(15, 4), "12 or 16");
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
  StepModels m = with_activation_lines(base_models(), {300, 200}, 100, {900, 120});
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
  const StepModels eight = with_eight_bit(m);
  EXPECT_DOUBLE_EQ(predict(eight, eight_bit_at(16), 16).peak_bytes, 2900);
  EXPECT_DOUBLE_EQ(predict(eight, eight_bit_at(16), 32).peak_bytes, 3200);
  // Checkpointing the first 2 of 4 blocks applies half its activation
  // effect (+100, slope x 0.25 when whole): 350 + 200 * 0.625 * 32 = 4350
  // at b = 32, above backward's 950 + 93.75 * 32 = 3950 and forward's 3050.
  StepModels ckpt = with_quarter_checkpointing(m);
  StrategyEffect& checkpointing = ckpt.effect(Strategy::kCheckpointing);
  checkpointing.shift_bytes[kForward] = checkpointing.shift_bytes[kLoss] = 100;
  checkpointing.shift_bytes[kBackward] = 100;
  checkpointing.backward_activation = {100, 0.25};
  TrainingConfig c = at(32);
  c.checkpoint.mode = CheckpointPlan::Mode::kFirstN;
  c.checkpoint.first_n = 2;
  EXPECT_DOUBLE_EQ(predict(ckpt, c, 32).peak_bytes, 4350);
}

// Note [Backward by gradients]: lines per level of gradients made,
// measured; gradients are 400 bytes (base_models), made 0, 200 and 400 by
// the levels. Live bytes: level 0 (the activations at their height)
// 600 + 200 b, level 1 (recomputing the first block, half the gradients
// made) 1100 + 175 b, level 2 (the end) 1500, flat. As a later micro-batch
// runs them, less the stored gradients: level 0 the same, level 1
// 1300 + 175 b (a large gradient pending), level 2 1100.
TEST(Predict, BackwardPeaksAtTheLargestOfItsLinesByGradientsMade) {
  StepModels m = base_models();
  m.backward_levels = {{{600, 200}, {600, 200}, 0}, {{1100, 175}, {1300, 175}, 200}, {{1500, 0}, {1100, 0}, 400}};
  // b = 4: levels 1400, 1800, 1500; phase lines forward 1400, loss 1400,
  // backward 1500, optimizer 2000.
  EXPECT_DOUBLE_EQ(predict(m, at(4), 4).peak_bytes, 2000);
  // b = 16: levels 3800, 3900, 1500: level 1, above backward's phase line
  // (3300) and level 0.
  EXPECT_DOUBLE_EQ(predict(m, at(16), 16).peak_bytes, 3900);
  // 32 = 16 + 16: the second 16 holds all 400 gradient bytes: its levels
  // 3800, 4100 and 1100 (each at least its live bytes less the gradients
  // made by then: 3800, 3700, 1100), + 400 = 4500 (backward's phase line
  // 3300 + 400, forward 2600 + 400).
  EXPECT_DOUBLE_EQ(predict(m, at(16), 32).peak_bytes, 4500);
  // With backward's activation lines measured too, the levels replace them
  // for a later micro-batch: not the accumulating line 2000 + 175 b nor the
  // activation line (level 1's moment, 200 gradient bytes made by then)
  // less the base's 0 at its own moment, 4800 and 3900 + 400.
  StepModels activation = with_activation_lines(m, {1100, 175}, 0, {2000, 175});
  EXPECT_DOUBLE_EQ(predict(activation, at(16), 16).peak_bytes, 3900);
  EXPECT_DOUBLE_EQ(predict(activation, at(16), 32).peak_bytes, 4500);
  activation.backward_levels.clear();
  EXPECT_DOUBLE_EQ(predict(activation, at(16), 32).peak_bytes, 5200) << "unmeasured levels: the lines' bound";
  // 8-bit AdamW has no effect by level: its activation lines', -600, move
  // each: level 1 3300 at 16 (backward 2700, forward 2000, optimizer 800),
  // 3500 + 400 with a second 16.
  const StepModels eight = with_eight_bit(m);
  EXPECT_DOUBLE_EQ(predict(eight, eight_bit_at(16), 16).peak_bytes, 3300);
  EXPECT_DOUBLE_EQ(predict(eight, eight_bit_at(16), 32).peak_bytes, 3900);
  // Checkpointing by level: level 0 x 0.25, level 1 + 100 and x 0.5, level 2
  // unchanged; its phase lines x 0.25. All 4 blocks at 16: levels 1400,
  // 1200 + 87.5 * 16 = 2600, 1500; forward 1400, loss 1400, backward
  // 1500, optimizer 2000.
  StepModels ckpt = with_quarter_checkpointing(m);
  ckpt.effect(Strategy::kCheckpointing).backward_levels = {
      {{0, 0.25}, {0, 0.25}}, {{100, 0.5}, {100, 0.5}}, {{0, 1}, {0, 1}}};
  TrainingConfig c = at(16);
  c.checkpoint.mode = CheckpointPlan::Mode::kAll;
  EXPECT_DOUBLE_EQ(predict(ckpt, c, 16).peak_bytes, 2600);
  // The first 2 of 4, half of each: level 1 1150 + 175 * 0.75 * 16 = 3250;
  // level 0 600 + 200 * 0.625 * 16 = 2600 (backward's phase line is not
  // read for part of the blocks: Note [Part of the blocks checkpointed]).
  c.checkpoint.mode = CheckpointPlan::Mode::kFirstN;
  c.checkpoint.first_n = 2;
  EXPECT_DOUBLE_EQ(predict(ckpt, c, 16).peak_bytes, 3250);
}

// Note [Part of the blocks checkpointed]: plain's backward peaks at level 0
// (every activation held, none of the 400 gradient bytes made), 600 + 250 b;
// level 1 (where checkpointing recomputes a block) 1000 + 100 b; level 2
// 1500. Checkpointing all 4 blocks keeps a fifth of level 0's bytes per
// sample and leaves the others: its backward peak, and its activation
// moment, move to level 1, so its effect on backward's phase line and
// activation line is +400 bytes and x 0.4 per sample.
TEST(Predict, PartOfTheBlocksCheckpointedPeaksOnItsLevelsAlone) {
  StepModels m = with_quarter_checkpointing(base_models());
  m.phases[kBackward] = {600, 250};
  m = with_activation_lines(m, {600, 250}, 0, {600, 250});
  m.backward_levels = {{{600, 250}, {600, 250}, 0}, {{1000, 100}, {1000, 100}, 200}, {{1500, 0}, {1500, 0}, 400}};
  StrategyEffect& e = m.effect(Strategy::kCheckpointing);
  e.shift_bytes[kBackward] = 400;
  e.slope_ratio[kBackward] = 0.4;
  e.backward_activation = e.accumulating_backward = {400, 0.4};
  e.backward_levels = {{{0, 0.2}, {0, 0.2}}, {{0, 1}, {0, 1}}, {{0, 1}, {0, 1}}};
  TrainingConfig c = at(16);
  c.checkpoint.mode = CheckpointPlan::Mode::kAll;
  // All blocks at 16: level 1 2600 (level 0 1400), as backward's lines.
  EXPECT_DOUBLE_EQ(predict(m, c, 16).peak_bytes, 2600);
  // The first 2 of 4, half of the effect: level 0 600 + 250 * 0.6 * 16 =
  // 3000, level 1 2600, forward 1000 + 100 * 0.625 * 16 = 2000, optimizer
  // 2000. Half of the effect on backward's phase and activation lines,
  // 800 + 250 * 0.7 * 16 = 3600, would be halfway between two moments,
  // neither of which holds that.
  c.checkpoint.mode = CheckpointPlan::Mode::kFirstN;
  c.checkpoint.first_n = 2;
  EXPECT_DOUBLE_EQ(predict(m, c, 16).peak_bytes, 3000);
  // 32 = 16 + 16: a later 16 holds the 400 gradient bytes: level 0 3000 +
  // 400 (level 1 max(2600, 2600 - 200) + 400).
  EXPECT_DOUBLE_EQ(predict(m, c, 32).peak_bytes, 3400);
  // Without levels, the lines are all there is.
  m.backward_levels.clear();
  EXPECT_DOUBLE_EQ(predict(m, c, 16).peak_bytes, 3600);
}

// Note [bf16 with checkpointing]: checkpointing all 4 blocks keeps a
// quarter of the activations per sample (1.2x and 1.4x the seconds); bf16
// alone halves them (0.8x, 0.5x); bf16 measured on checkpointing's lines
// shrinks what it keeps by a fifth only (0.9x, 0.7x the seconds).
TEST(Predict, Bf16WithCheckpointingTakesThePairsEffectForTheCheckpointedShare) {
  StepModels m = with_quarter_checkpointing(base_models());
  StrategyEffect& checkpointing = m.effect(Strategy::kCheckpointing);
  checkpointing.time_ratio = 1.2;
  checkpointing.time_slope_ratio = 1.4;
  m.effect(Strategy::kBf16) = half_bf16();
  TrainingConfig c = at(64);
  c.precision = Precision::kBf16;
  c.checkpoint.mode = CheckpointPlan::Mode::kAll;
  // Without the pair, the product: backward 900 + 150 * 0.125 * 64 = 2100
  // (forward 1800, optimizer 2000).
  EXPECT_DOUBLE_EQ(predict(m, c, 64).peak_bytes, 2100);
  StrategyEffect& pair = m.bf16_on_checkpointing;
  pair.available = true;
  pair.slope_ratio = {1, 0.8, 0.8, 0.8, 0.8};
  pair.time_ratio = 0.9;
  pair.time_slope_ratio = 0.7;
  // With it: backward 900 + 150 * 0.25 * 0.8 * 64 = 2820 (forward 2280).
  // Seconds 0.1 * 1.2 * 0.9 + 0.01 * 1.4 * 0.7 * 64 + 0.5.
  StepPrediction p = predict(m, c, 64);
  EXPECT_DOUBLE_EQ(p.peak_bytes, 2820);
  EXPECT_NEAR(p.seconds_per_global_batch, 0.108 + 0.6272 + 0.5, 1e-12);
  // It is the pair measured on checkpointing's lines: the same as bf16's
  // effect with the pair's taken as bf16's, on those lines.
  StepModels checkpointed = with_effect(m, checkpointing);
  checkpointed.effect(Strategy::kCheckpointing) = {};
  checkpointed.bf16_on_checkpointing = {};
  checkpointed.effect(Strategy::kBf16) = pair;
  TrainingConfig bf16_alone = at(64);
  bf16_alone.precision = Precision::kBf16;
  EXPECT_DOUBLE_EQ(predict(checkpointed, bf16_alone, 64).peak_bytes, 2820);
  EXPECT_NEAR(predict(checkpointed, bf16_alone, 64).seconds_per_global_batch, 0.108 + 0.6272 + 0.5, 1e-12);
  // The first 2 of 4 blocks: checkpointing's half (slope x 0.625), bf16's
  // for the other half (x 0.75), the pair's for this one (x 0.9): backward
  // 900 + 150 * 0.421875 * 64 = 4950 (forward 1000 + 2700).
  c.checkpoint.mode = CheckpointPlan::Mode::kFirstN;
  c.checkpoint.first_n = 2;
  EXPECT_DOUBLE_EQ(predict(m, c, 64).peak_bytes, 4950);
  // bf16 without checkpointing: bf16's alone, 900 + 75 * 64 = 5700.
  EXPECT_DOUBLE_EQ(predict(m, bf16_alone, 64).peak_bytes, 5700);
}

// Two probes' levels (probes/memory_records.h, GradientLevel) at
// micro-batches 2 and 4 on the CPU (bytes as measured): two lines per level
// through them, and the gradient bytes of each level.
TEST(FitBackwardActivation, FitsLinesPerLevelOfGradientsMade) {
  JobSpec job;
  job.device = Device::kCpu;
  auto probe = [](int64_t micro_batch, std::vector<GradientLevel> levels) {
    ProbeReport r;
    r.micro_batch = micro_batch;
    r.backward_activation_peak.live_bytes = levels.front().live_bytes;
    r.backward_activation_peak.accumulating_bytes = levels.front().live_bytes;
    r.backward_activation_peak.by_gradients = std::move(levels);
    return r;
  };
  const ProbeReport two = probe(2, {{0, 1000, 1000}, {300, 1500, 1400}, {500, 1600, 1100}});
  const ProbeReport four = probe(4, {{0, 1400, 1400}, {300, 1800, 1900}, {500, 1600, 1100}});
  StepModels m;
  fit_backward_activation(m, {&two, &four}, job, 0, 0);
  ASSERT_EQ(m.backward_levels.size(), 3u);
  // Live: (1400 - 1000) / 2 = 200 per sample from 600; 150 from 1200; flat
  // 1600. As a later micro-batch: 200 from 600; 250 from 900; flat 1100.
  const auto line = [](const BatchLine& l) { return std::make_pair(l.intercept, l.slope); };
  using Line = std::pair<double, double>;
  EXPECT_EQ(line(m.backward_levels[0].live), Line(600, 200));
  EXPECT_EQ(line(m.backward_levels[1].live), Line(1200, 150));
  EXPECT_EQ(line(m.backward_levels[2].live), Line(1600, 0));
  EXPECT_EQ(line(m.backward_levels[0].accumulating), Line(600, 200));
  EXPECT_EQ(line(m.backward_levels[1].accumulating), Line(900, 250));
  EXPECT_EQ(line(m.backward_levels[2].accumulating), Line(1100, 0));
  EXPECT_EQ(m.backward_levels[1].gradient_bytes, 300);
  EXPECT_EQ(m.backward_levels[2].gradient_bytes, 500);
  // One probe: each level takes its fallback level's slopes.
  StepModels one;
  fit_backward_activation(one, {&four}, job, 0, 0, &m.backward_levels);
  ASSERT_EQ(one.backward_levels.size(), 3u);
  EXPECT_EQ(line(one.backward_levels[1].live), Line(1800 - 150 * 4, 150));
  EXPECT_EQ(line(one.backward_levels[1].accumulating), Line(1900 - 250 * 4, 250));
  // A fallback of another count: every level the given slopes.
  const std::vector<LevelLines> other = {{{0, 10}, {0, 10}, 0}};
  fit_backward_activation(one, {&four}, job, 50, 70, &other);
  ASSERT_EQ(one.backward_levels.size(), 3u);
  EXPECT_EQ(one.backward_levels[2].live.slope, 50);
  EXPECT_EQ(one.backward_levels[2].accumulating.slope, 70);
  // Probes that measured different counts: no levels.
  const ProbeReport fewer = probe(8, {{0, 2200, 2200}, {500, 2400, 1900}});
  fit_backward_activation(m, {&two, &fewer}, job, 0, 0);
  EXPECT_TRUE(m.backward_levels.empty());
  EXPECT_TRUE(m.backward_activation_measured);
}

TEST(Predict, StrategiesAddShiftsAndMultiplyRatios) {
  StepModels m = base_models();
  // 8-bit AdamW: state 600 bytes smaller in every phase, 1200 in the
  // optimizer's (its temporaries too); the optimizer step 1.4x slower.
  m = with_eight_bit(m);
  m.effect(Strategy::kAdamW8bit).optimizer_time_ratio = 1.4;
  // bf16: half the activation bytes per sample; 0.8x a micro-batch's fixed
  // seconds, 0.5x its per-sample seconds.
  m.effect(Strategy::kBf16) = half_bf16();
  TrainingConfig c = eight_bit_at(8);
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
