// The search against a fake device whose memory and time curves are known
// exactly, so every expectation below is computed by hand from the curve.

#include "search/search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "fake_runner.h"

namespace oomtune {
namespace {

const TrailNode& chosen(const SearchResult& r) {
  EXPECT_TRUE(r.chosen.has_value());
  return r.trail.at(*r.chosen);
}

// A probe's configuration: plain at `micro_batch` (one micro-batch per
// step), or with the given precision, offload and all blocks checkpointed.
TrainingConfig with_micro_batch_of(int64_t micro_batch, Precision precision = Precision::kFp32, bool offload = false,
                                   bool checkpoint_all = false) {
  TrainingConfig c;
  c.micro_batch = micro_batch;
  c.precision = precision;
  c.offload_optimizer = offload;
  if (checkpoint_all) c.checkpoint.mode = CheckpointPlan::Mode::kAll;
  return c;
}

// The trail's node named `name`, or nullptr.
const TrailNode* node_named(const SearchResult& r, const std::string& name) {
  for (const TrailNode& node : r.trail)
    if (node.node == name) return &node;
  return nullptr;
}

// The search under a budget where plain 32 x 1 fits with 1 MiB to spare,
// with `verifications` verification slots.
SearchResult search_with_room_for_plain(FakeRunner& fake, int64_t verifications) {
  SearchOptions options;
  options.max_verifications = verifications;
  return run_search(fake, job_with_budget(plain_peak(32) + kMiB), options);
}

// Whether a probe ran bf16 autocast (its config string ends in the precision).
bool autocast_probe(const ProbeReport& p) {
  const std::string suffix = ",precision=bf16";
  return p.config.size() >= suffix.size() &&
         p.config.compare(p.config.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TEST(DecisionTree, PlainFitsWhenTheBudgetIsLarge) {
  FakeRunner fake;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.config.micro_batch, 32);
  EXPECT_EQ(best.config.accumulation_steps, 1);
  EXPECT_FALSE(best.config.checkpoint.enabled());
  EXPECT_EQ(best.node, "plain");
  // The fit saw micro-batches 4, 8, 16 only; at 32 it must predict exactly
  // (the fake is linear).
  EXPECT_NEAR(best.predicted_peak_bytes, plain_peak(32), 1.0);
  EXPECT_LE(r.verification_trials, 3);
  EXPECT_EQ(r.smallest_micro_batch, 1);
  EXPECT_EQ(r.largest_micro_batch, 32);  // the global batch: no max_micro_batch
}

TEST(DecisionTree, AccumulationFindsTheOraclesLargestMicroBatch) {
  FakeRunner fake;
  // Budget between peak(8) + gradients and peak(16): the largest divisor of
  // 32 that fits plain is 8 (4 accumulation steps): 4 x (0.01 + 0.016) =
  // 0.104 s. Checkpointing at 32 also fits (18 + 2 * 32 = 82 MiB < 87 MiB)
  // but is slower: 1.6 x (0.01 + 0.064) = 0.118 s.
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(8) + 4 * kMiB + kMiB));
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.config.micro_batch, 8);
  EXPECT_EQ(best.config.accumulation_steps, 4);
  EXPECT_FALSE(best.config.checkpoint.enabled());
  EXPECT_EQ(best.config.micro_batch * best.config.accumulation_steps, 32) << "global batch exact";
  EXPECT_LE(r.verification_trials, 3);
}

// A toy model that steps in microseconds: a note comparing two predicted
// times prints them apart (it printed "0.000 s vs 0.000 s"). The search
// above with every time x 1e-3: checkpointing at 16 x 2 takes
// 2 x 1.6 x (0.01 + 0.032) ms = 0.1344 ms, the chosen 8 x 4 takes
// 4 x (0.01 + 0.016) ms = 0.104 ms.
TEST(DecisionTree, APredictedSlowerNoteTellsSmallTimesApart) {
  FakeRunner fake;
  fake.time_scale = 1e-3;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(8) + 4 * kMiB + kMiB));
  EXPECT_EQ(chosen(r).config.micro_batch, 8);
  const TrailNode* slower = nullptr;
  for (const TrailNode& node : r.trail) {
    if (node.config.micro_batch == 16 && node.config.accumulation_steps == 2 && node.config.checkpoint.enabled())
      slower = &node;
  }
  ASSERT_NE(slower, nullptr);
  EXPECT_EQ(slower->note, "predicted slower (0.000134 s vs 0.000104 s per global batch)");
}

TEST(DecisionTree, AccumulationRunsTheBalancedSplitOfTheLargestFit) {
  FakeRunner fake;
  JobSpec job = job_with_budget(plain_peak(13) + 4 * kMiB + kMiB / 2);
  job.allow_remainder = true;
  // With accumulation the largest plain micro-batch that fits is 13
  // (18 + 8 x 13 + 4 = 126 MiB): 13 + 13 + 6, three micro-batches. 11 + 11
  // + 10 is three as well, predicted as fast, with 16 MiB more margin.
  const SearchResult r = run_search(fake, job);
  const TrailNode* node = node_named(r, "micro-batch + accumulation");
  ASSERT_NE(node, nullptr);
  EXPECT_EQ(node->largest_fitting_micro_batch, 13);
  EXPECT_EQ(node->config.micro_batch, 11);
  EXPECT_EQ(node->config.accumulation_steps, 3);
  EXPECT_NEAR(node->predicted_peak_bytes, plain_peak(11) + 4 * kMiB, 1.0);
  EXPECT_EQ(chosen(r).config.micro_batch, 11);
}

// Note [Divisors only]. Global batch 31 (divisors 1 and 31), budget 79 MiB:
// plain with accumulation fits up to 7 (18 + 8 x 7 + 4 = 78 MiB), so its
// node runs 1 x 31: 31 x (0.01 + 0.002) = 0.372 s. Checkpointing at 31
// needs 18 + 2 x 31 = 80 MiB; 8-bit AdamW with it 74 MiB, chosen at
// 1.1 x 1.6 x (0.01 + 0.062) = 0.12672 s (244.6 samples/s). Plain at 7
// would take 5 micro-batches (7 x 4 + 3): 4 x (0.01 + 0.014) + 0.01 +
// 0.006 = 0.112 s, 276.8 samples/s, faster beyond the 3 % tie; every other node's largest
// fit is slower (checkpointing 2 x 1.6 x 0.042 = 0.1344 s at 16, offload
// 1.5 x 4 x 0.026 = 0.156 s at 8). With remainder = "last_smaller" the
// search then chooses the configuration the note named, and says nothing.
TEST(DecisionTree, ANoteSaysWhatADivisorPoorGlobalBatchCosts) {
  FakeRunner fake;
  fake.global_batch = 31;
  JobSpec job = job_with_budget(79 * kMiB);
  job.global_batch = 31;
  const SearchResult r = run_search(fake, job);
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.config.micro_batch, 31);
  EXPECT_EQ(best.config.optimizer, OptimizerKind::kAdamW8bit);
  EXPECT_TRUE(best.config.checkpoint.enabled());
  const std::string note =
      "remainder: a micro-batch must divide the global batch 31, which leaves micro-batches 1, 31; "
      "micro-batch + accumulation is predicted to fit at micro-batch 7, at 276.8 samples/s against the chosen "
      "configuration's predicted 244.6. A global batch that 7 divides (28 or 35) lets the search try it with "
      "equal micro-batches, as every framework takes them; remainder = \"last_smaller\" runs 31 as 7 x 4 + 3, "
      "which oomtune emit cannot write";
  EXPECT_EQ(std::count(r.notes.begin(), r.notes.end(), note), 1) << ::testing::PrintToString(r.notes);
  {  // Memory from meta, which agrees with the fake's lines: the same note.
    FakeRunner on_meta = fake;
    on_meta.meta = true;
    SearchOptions options;
    options.memory_from = MemorySource::kMeta;
    const SearchResult m = run_search(on_meta, job, options);
    EXPECT_EQ(m.memory_from, MemorySource::kMeta);
    EXPECT_EQ(std::count(m.notes.begin(), m.notes.end(), note), 1) << ::testing::PrintToString(m.notes);
  }

  job.allow_remainder = true;
  const SearchResult with_remainder = run_search(fake, job);
  const TrailNode& taken = chosen(with_remainder);
  EXPECT_EQ(taken.node, "micro-batch + accumulation");
  EXPECT_EQ(taken.config.micro_batch, 7);
  EXPECT_EQ(taken.config.accumulation_steps, 5);
  EXPECT_FALSE(has_note(with_remainder, "remainder:"));

  // A global batch 7 divides: the search runs it, and there is nothing to say.
  fake.global_batch = job.global_batch = 35;
  job.allow_remainder = false;
  const SearchResult divisible = run_search(fake, job);
  EXPECT_EQ(chosen(divisible).config.micro_batch, 7);
  EXPECT_FALSE(has_note(divisible, "remainder:"));
}

TEST(DecisionTree, AVerifiedTieGoesToTheConfigurationWithFewerStrategies) {
  // Plain 32 x 1 and 8-bit AdamW 32 x 1 both fit. 8-bit AdamW 1 % faster is
  // a tie (within kTimingTieRatio): plain wins, 8-bit AdamW says why. 10 %
  // faster is not: 8-bit AdamW wins.
  for (const auto& [factor, want_8bit] : {std::pair{0.99, false}, std::pair{0.90, true}}) {
    SCOPED_TRACE(factor);
    FakeRunner fake;
    fake.eight_bit_time_factor = factor;
    const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
    const TrailNode& best = chosen(r);
    EXPECT_EQ(best.config.optimizer == OptimizerKind::kAdamW8bit, want_8bit);
    EXPECT_EQ(best.config.micro_batch, 32);
    for (const TrailNode& n : r.trail)
      if (n.config.optimizer == OptimizerKind::kAdamW8bit && !n.config.checkpoint.enabled() &&
          n.config.micro_batch == 32 && !want_8bit) {
        ASSERT_TRUE(n.verification.has_value());
        EXPECT_NE(n.note.find("a tie"), std::string::npos) << n.note;
      }
    if (!want_8bit) {
      EXPECT_NE(best.note.find("simplest within 3 %"), std::string::npos) << best.note;
    }
  }
}

TEST(DecisionTree, TheSimplestFittingCandidateIsAlwaysVerified) {
  // 8-bit AdamW at half the time and bf16 at 0.9 rank 8-bit AdamW + bf16
  // (0.45), 8-bit AdamW (0.5), 8-bit AdamW + bf16 + checkpointing (0.72),
  // 8-bit AdamW + checkpointing (0.8) and bf16 (0.9) above plain (1.0):
  // plain still takes the last of the three verification slots, and 8-bit
  // AdamW + bf16 wins.
  FakeRunner fake;
  fake.eight_bit_time_factor = 0.5;
  JobSpec job = job_with_budget(plain_peak(32) + kMiB);
  job.allow_bf16 = true;
  const SearchResult r = run_search(fake, job);
  EXPECT_EQ(r.verification_trials, 3);
  bool plain_verified = false, bf16_verified = false;
  for (const TrailNode& n : r.trail) {
    if (n.node == "plain") plain_verified = n.verification.has_value();
    if (n.node == "bf16") bf16_verified = n.verification.has_value();
  }
  EXPECT_TRUE(plain_verified) << "the reference run";
  EXPECT_FALSE(bf16_verified) << "fifth by prediction, so the third slot went to plain";
  EXPECT_EQ(chosen(r).node, "8-bit AdamW + bf16");
  EXPECT_FALSE(chosen(r).config.checkpoint.enabled());
}

TEST(DecisionTree, Bf16FallsBackToBf16ParametersWhenAutocastCrashes) {
  // bf16 is 10 % faster, so it is the answer in either form; with autocast
  // crashing, the bf16_params form runs and the notes say why.
  for (bool crashes : {false, true}) {
    SCOPED_TRACE(crashes);
    FakeRunner fake;
    fake.autocast_crashes = crashes;
    JobSpec job = job_with_budget(plain_peak(32) + kMiB);
    job.allow_bf16 = true;
    const SearchResult r = run_search(fake, job);
    EXPECT_EQ(chosen(r).config.precision, crashes ? Precision::kBf16Params : Precision::kBf16);
    EXPECT_EQ(has_note(r,
                       "bf16: autocast failed (crashed: SIGSEGV during forward), so bf16 runs as "
                       "bf16 parameters with fp32 master weights"),
              crashes)
        << ::testing::PrintToString(r.notes);
  }
}

TEST(DecisionTree, AJobInBf16FallsBackWhenItsOwnAutocastCrashes) {
  FakeRunner fake;
  fake.autocast_crashes = true;
  JobSpec job = job_with_budget(plain_peak(32) + kMiB);
  job.precision = "bf16";
  const SearchResult r = run_search(fake, job);
  EXPECT_EQ(chosen(r).config.precision, Precision::kBf16Params);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes.front().find("autocast failed"), std::string::npos) << r.notes.front();
}

TEST(DecisionTree, AnOptimizerStrategyWithBf16FitsALargerMicroBatchThanEitherAlone) {
  // Budget 50 MiB, recomputation at 2x. With accumulation (4 MiB of
  // gradients) 8-bit AdamW needs 16 + 8 b MiB and bf16 22 + 4 b: neither
  // fits 8 x 4 (80, 54 MiB), so alone they run 4 x 8. Together they need
  // 16 + 4 b = 48 MiB at 8 x 4: 4 x (0.01 + 0.002 x 8) x 1.1 x 0.9 =
  // 0.10296 s per global batch, against bf16 4 x 8 at 8 x 0.018 x 0.9 =
  // 0.1296 s and checkpointing + bf16 32 x 1 at 0.074 x 2 x 0.9 = 0.1332 s.
  FakeRunner fake;
  fake.checkpoint_time_cost = 1.0;
  JobSpec job = job_with_budget(50 * kMiB);
  job.allow_bf16 = true;
  const SearchResult r = run_search(fake, job);
  // Plain at 4, 8, 16; checkpointing, bf16 and bf16 with checkpointing at
  // two sizes (Note [bf16 with checkpointing]); 8-bit AdamW and offload at
  // one: their pairs with bf16 cost no probe.
  EXPECT_EQ(r.probes.size(), 11u);
  const TrailNode* eight_bit = node_named(r, "8-bit AdamW");
  const TrailNode* bf16 = node_named(r, "bf16");
  const TrailNode* pair = node_named(r, "8-bit AdamW + bf16");
  const TrailNode* offload_pair = node_named(r, "optimizer offload + bf16");
  const TrailNode* all_three = node_named(r, "8-bit AdamW + bf16 + checkpointing");
  ASSERT_TRUE(eight_bit && bf16 && pair && offload_pair && all_three);
  EXPECT_EQ(eight_bit->config.micro_batch, 4);
  EXPECT_EQ(bf16->config.micro_batch, 4);
  EXPECT_EQ(pair->config.micro_batch, 8);
  EXPECT_EQ(pair->config.accumulation_steps, 4);
  EXPECT_EQ(pair->config.optimizer, OptimizerKind::kAdamW8bit);
  EXPECT_EQ(pair->config.precision, Precision::kBf16);
  EXPECT_FALSE(pair->config.checkpoint.enabled());
  EXPECT_NEAR(pair->predicted_peak_bytes, 48.0 * kMiB, 1e-3 * kMiB);
  EXPECT_NEAR(pair->predicted_seconds, 0.10296, 1e-9);
  // Offload moves the state (10 + 4 b MiB, + 4 accumulating) at 1.5x time.
  EXPECT_EQ(offload_pair->config.micro_batch, 8);
  EXPECT_TRUE(offload_pair->config.offload_optimizer);
  EXPECT_EQ(offload_pair->config.optimizer, OptimizerKind::kAdamW);
  EXPECT_NEAR(offload_pair->predicted_peak_bytes, 46.0 * kMiB, 1e-3 * kMiB);
  EXPECT_NEAR(offload_pair->predicted_seconds, 4 * 0.026 * 1.5 * 0.9, 1e-9);
  // With checkpointing all three fit the whole batch: 12 + 32 x 1 MiB.
  EXPECT_EQ(all_three->config.micro_batch, 32);
  EXPECT_TRUE(all_three->config.checkpoint.enabled());
  EXPECT_NEAR(all_three->predicted_peak_bytes, 44.0 * kMiB, 1e-3 * kMiB);
  EXPECT_NEAR(all_three->predicted_seconds, 0.074 * 2 * 1.1 * 0.9, 1e-9);
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.node, "8-bit AdamW + bf16");
  ASSERT_TRUE(best.verification.has_value());
  EXPECT_EQ(best.verification->peak_bytes, 48 * kMiB);
}

// Note [Step time]: an optimizer step of 0.05 s runs once per global batch,
// and offload makes it 4x slower (a host step). Budget 87 MiB: plain fits
// 8 x 4 (22 + 8 b MiB when accumulating), in 4 x (0.01 + 0.002 x 8) + 0.05
// = 0.154 s; offload 8 x 4 in 4 x 0.026 + 0.2 = 0.304 s; checkpointing
// fits 32 x 1 in 0.074 x 1.6 + 0.05 = 0.1684 s. One line through whole
// probe steps counted the optimizer once per micro-batch (plain 8 x 4 at
// 0.304 s), and scaled offload's host step with the micro-batches (0.97 s).
TEST(DecisionTree, TheOptimizerStepIsTimedOncePerGlobalBatch) {
  FakeRunner fake;
  fake.optimizer_seconds = 0.05;
  fake.offload_time_factor = 1;  // offload costs only in the optimizer step
  fake.offload_optimizer_factor = 4;
  const SearchResult r = run_search(fake, job_with_budget(87 * kMiB));
  EXPECT_NEAR(r.baseline_optimizer_seconds, 0.05, 1e-12);
  EXPECT_NEAR(r.baseline_seconds.intercept, 0.01, 1e-12);
  EXPECT_NEAR(r.baseline_seconds.slope, 0.002, 1e-12);
  const TrailNode* accumulation = node_named(r, "micro-batch + accumulation");
  const TrailNode* offload = node_named(r, "optimizer offload");
  const TrailNode* checkpointing = node_named(r, "checkpointing (all blocks)");
  ASSERT_TRUE(accumulation && offload && checkpointing);
  EXPECT_EQ(accumulation->config.micro_batch, 8);
  EXPECT_NEAR(accumulation->predicted_seconds, 4 * 0.026 + 0.05, 1e-9);
  EXPECT_EQ(offload->config.micro_batch, 8);
  EXPECT_NEAR(offload->predicted_seconds, 4 * 0.026 + 0.2, 1e-9);
  EXPECT_EQ(checkpointing->config.micro_batch, 32);
  EXPECT_NEAR(checkpointing->predicted_seconds, 0.074 * 1.6 + 0.05, 1e-9);
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.node, "micro-batch + accumulation");
  EXPECT_NEAR(best.verification->timing.steady_step_seconds, best.predicted_seconds, 1e-9);
}

// 8-bit AdamW costs only in its optimizer step (dequantize, update,
// requantize): 0.05 s x k per global batch. Activations 0.5 MiB per sample,
// budget 27 MiB: accumulating, plain fits 22 + b / 2 <= 27 -> 8 x 4, in
// 4 x (0.01 + 0.016) + 0.05 = 0.154 s; 8-bit AdamW (2 MiB of state, not 8)
// fits 16 + b / 2 -> 16 x 2, in 2 x (0.01 + 0.032) + 0.05 k = 0.084 + 0.05 k
// s. So 8-bit AdamW is the answer at k = 1 (0.134 s) and slower at k = 2
// (0.184 s). The others lose either way, by more than the 3 % tie:
// offload 32 x 1 (10 + 16 MiB) in 0.074 x 1.5 + 0.05 = 0.161 s, and
// checkpointing 3 of 4 blocks at 32 x 1, at recomputation 2x, in
// 0.074 x 1.75 + 0.05 = 0.1795 s.
TEST(DecisionTree, EightBitAdamWsOptimizerStepCostDecidesAgainstAccumulation) {
  for (const double k : {1.0, 2.0}) {
    SCOPED_TRACE(k);
    FakeRunner fake;
    fake.activation_per_sample = kMiB / 2;
    fake.checkpoint_time_cost = 1.0;
    fake.optimizer_seconds = 0.05;
    fake.eight_bit_time_factor = 1;
    fake.eight_bit_optimizer_factor = k;
    const SearchResult r = run_search(fake, job_with_budget(27 * kMiB));
    const TrailNode* accumulation = node_named(r, "micro-batch + accumulation");
    const TrailNode* eight_bit = node_named(r, "8-bit AdamW");
    ASSERT_TRUE(accumulation && eight_bit);
    EXPECT_EQ(accumulation->config.micro_batch, 8);
    EXPECT_NEAR(accumulation->predicted_seconds, 0.154, 1e-9);
    EXPECT_EQ(eight_bit->config.micro_batch, 16);
    EXPECT_EQ(eight_bit->config.accumulation_steps, 2);
    EXPECT_NEAR(eight_bit->predicted_seconds, 0.084 + 0.05 * k, 1e-9);
    const TrailNode& best = chosen(r);
    EXPECT_EQ(best.node, k == 1.0 ? "8-bit AdamW" : "micro-batch + accumulation");
    EXPECT_NEAR(best.verification->timing.steady_step_seconds, best.predicted_seconds, 1e-9);
  }
}

// bf16 casts the weights once per micro-batch (its fixed 0.01 s x 1.5) and
// halves the per-sample work (0.002 s x 0.5): probed at 4 and 8 its line is
// 0.015 + 0.001 b, so 32 x 1 takes 0.047 s against plain's 0.074. One ratio
// measured at those sizes (1.056 and 0.885) predicted 0.0718 s.
TEST(DecisionTree, AStrategyProbedAtTwoSizesScalesTheTimeLinesInterceptAndSlopeApart) {
  FakeRunner fake;
  fake.bf16_intercept_factor = 1.5;
  fake.bf16_per_sample_factor = 0.5;
  JobSpec job = job_with_budget(plain_peak(32) + kMiB);
  job.allow_bf16 = true;
  const SearchResult r = run_search(fake, job);
  const TrailNode* bf16 = node_named(r, "bf16");
  const TrailNode* plain = node_named(r, "plain");
  ASSERT_TRUE(bf16 && plain);
  EXPECT_EQ(bf16->config.micro_batch, 32);
  EXPECT_NEAR(bf16->predicted_seconds, 0.015 + 0.001 * 32, 1e-9);
  EXPECT_NEAR(plain->predicted_seconds, 0.074, 1e-9);
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.node, "bf16");
  EXPECT_NEAR(best.verification->timing.steady_step_seconds, best.predicted_seconds, 1e-9);
}

TEST(DecisionTree, CheckpointingWhenAccumulationIsNotAllowed) {
  FakeRunner fake;
  JobSpec job = job_with_budget(18 * kMiB + 2 * kMiB * 32 + kMiB);  // ckpt-all at 32 fits
  job.min_micro_batch = 32;                                         // e.g. batch norm over the whole batch
  const SearchResult r = run_search(fake, job);
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.config.micro_batch, 32);
  EXPECT_TRUE(best.config.checkpoint.enabled());
}

TEST(DecisionTree, SelectiveCheckpointingTakesTheFewestBlocks) {
  FakeRunner fake;
  JobSpec job = job_with_budget(plain_peak(32) - 100 * kMiB);
  job.min_micro_batch = 32;
  const SearchResult r = run_search(fake, job);
  // Per block the slope drops by (8 - 2) / 4 = 1.5 MiB per sample, so
  // 32 samples save 48 MiB a block: 3 blocks save 144 >= 100, 2 save 96.
  bool found = false;
  for (const TrailNode& node : r.trail)
    if (node.config.checkpoint.mode == CheckpointPlan::Mode::kFirstN) {
      EXPECT_EQ(node.config.checkpoint.first_n, 3);
      EXPECT_TRUE(node.predicted_fit);
      found = true;
    }
  EXPECT_TRUE(found);
  // Selective is faster than all blocks, so it is the answer.
  EXPECT_EQ(chosen(r).config.checkpoint.mode, CheckpointPlan::Mode::kFirstN);
}

// The two Decoder blocks modify their input in place, which the recompute
// operator refuses; the two Encoder blocks alone save 2 x 1.5 = 3 MiB a
// sample: peak(32) = 18 + 5 x 32 = 178 MiB, and the first Encoder alone
// 18 + 6.5 x 32 = 226 MiB. The global batch must run in one micro-batch.
TEST(DecisionTree, ARefusedBlockClassLeavesTheOtherBlocksToCheckpoint) {
  FakeRunner fake;
  fake.refusing_class = "__torch__.Decoder";
  JobSpec job = job_with_budget(194 * kMiB);  // plain 274 MiB, 8-bit 268, offload 266
  job.min_micro_batch = 32;
  SearchResult r = run_search(fake, job);
  ASSERT_TRUE(r.chosen.has_value());
  EXPECT_EQ(chosen(r).node, "checkpointing (all blocks but Decoder)");
  EXPECT_EQ(chosen(r).config.checkpoint.mode, CheckpointPlan::Mode::kPaths);
  EXPECT_EQ(chosen(r).config.checkpoint.paths, (std::vector<std::string>{"blocks.0", "blocks.1"}));
  EXPECT_TRUE(has_note(r,
                       "activation checkpointing: not available (micro-batch 32: error during forward: "
                       "oomtune::checkpoint: forward of __torch__.Decoder modified its argument x in place)"));
  EXPECT_TRUE(has_note(r,
                       "activation checkpointing: trying the 2 blocks of other classes than Decoder: blocks.0, "
                       "blocks.1"));

  // Selective checkpointing counts among the blocks left: the first 1 of 2.
  fake.probes = 0;
  r = run_search(fake, job_with_budget(230 * kMiB));
  const TrailNode* first = node_named(r, "checkpointing (first 1 of 2 blocks)");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->config.checkpoint.paths, std::vector<std::string>{"blocks.0"});
  EXPECT_TRUE(first->predicted_fit);
}

// When every block is of the refused class, checkpointing is out after one
// probe, as any other strategy whose probe fails.
TEST(DecisionTree, ARefusedClassOfEveryBlockRulesCheckpointingOut) {
  FakeRunner fake;
  fake.block_classes.assign(4, "__torch__.Block");
  fake.refusing_class = "__torch__.Block";
  JobSpec job = job_with_budget(194 * kMiB);
  job.min_micro_batch = 32;
  const SearchResult r = run_search(fake, job);
  EXPECT_FALSE(r.chosen.has_value());
  int checkpoint_probes = 0;
  for (const ProbeReport& p : r.probes) checkpoint_probes += p.config.find("ckpt=none") == std::string::npos;
  EXPECT_EQ(checkpoint_probes, 1);
  EXPECT_FALSE(has_note(r, "trying the"));
  for (const TrailNode& node : r.trail) EXPECT_FALSE(node.config.checkpoint.enabled()) << node.node;
}

// Checkpointing probes that ran 2 % faster than plain (noise: recomputation
// only adds work) are predicted at plain's time, not faster: with one
// verification slot, plain (first in the trail at the same time) is the one
// verified. Left at 0.98 the checkpointing node ranked first and won.
TEST(DecisionTree, CheckpointingIsNeverPredictedFasterThanPlain) {
  FakeRunner fake;
  fake.checkpoint_time_cost = -0.02;
  const SearchResult r = search_with_room_for_plain(fake, 1);
  ASSERT_TRUE(r.chosen.has_value());
  EXPECT_EQ(chosen(r).node, "plain");
  EXPECT_TRUE(has_note(r,
                       "activation checkpointing: measured at 0.980x the plain step time; recomputation cannot "
                       "make a step faster, so it is predicted at no less than 1x (timing noise)"));
  for (const TrailNode& n : r.trail) {
    if (n.config.checkpoint.enabled() && n.config.micro_batch == 32 && !n.config.offload_optimizer &&
        n.config.optimizer == OptimizerKind::kAdamW) {
      EXPECT_GE(n.predicted_seconds, chosen(r).predicted_seconds) << n.node;
      // Equal to the chosen plain's time: a tie, not "predicted slower".
      // 32 x 1 takes 0.01 + 0.002 x 32 = 0.074 s.
      EXPECT_EQ(n.note,
                "predicted as fast within 3 % (0.0740 s vs 0.0740 s per global batch; the chosen one "
                "measured 0.0740 s); not verified (verification budget spent)")
          << n.node;
    }
  }
}

// Verified runs that differ only by checkpointing: the checkpointed one
// measured faster (noise: checkpointing all 4 blocks "costs" -20 %, 0.0592
// s per 32 samples against plain's 0.074) counts at plain's speed, so the
// simpler plain wins instead of a configuration that recomputes for
// nothing.
TEST(DecisionTree, AVerifiedCheckpointedRunIsNeverFasterThanTheSameRunWithout) {
  FakeRunner fake;
  fake.checkpoint_time_cost = -0.2;
  const SearchResult r = search_with_room_for_plain(fake, 10);
  ASSERT_TRUE(r.chosen.has_value());
  EXPECT_EQ(chosen(r).node, "plain");
  const TrailNode* all = node_named(r, "checkpointing (all blocks)");
  ASSERT_NE(all, nullptr);
  ASSERT_TRUE(all->verification.has_value());
  EXPECT_NEAR(all->verification->samples_per_second, 32 / 0.0592, 0.01);
  EXPECT_TRUE(has_note(r,
                       "checkpointing (all blocks): verified at 540.5 samples/s, faster than the same "
                       "configuration without activation checkpointing (432.4); recomputation cannot make a step "
                       "faster, so it counts at 432.4 (timing noise)"));
  // Without the rule the checkpointed run would have won: it is the fastest measured.
  for (const TrailNode& n : r.trail) {
    if (n.verification) {
      EXPECT_LE(n.verification->samples_per_second, all->verification->samples_per_second) << n.node;
    }
  }
}

// The same for optimizer offload, alone and under checkpointing: on the CPU
// backend offload's "host" is the device's own memory, so its 10 % faster
// runs (0.0666 s per 32 samples against plain's 0.074) measured noise, and
// on a GPU it copies gradients and parameters besides. Each configuration
// that only adds work to plain counts at plain's 432.4 samples/s, so plain
// wins. Without the rule checkpointing + offload (0.9 x 0.9 = 0.81x:
// 533.9 samples/s) would have won.
TEST(DecisionTree, AVerifiedOffloadedRunIsNeverFasterThanTheSameRunWithout) {
  FakeRunner fake;
  fake.offload_time_factor = 0.9;
  fake.checkpoint_time_cost = -0.1;
  const SearchResult r = search_with_room_for_plain(fake, 10);
  ASSERT_TRUE(r.chosen.has_value());
  EXPECT_EQ(chosen(r).node, "plain");
  EXPECT_TRUE(has_note(r,
                       "optimizer offload: measured at 0.900x the plain step time; an optimizer step on the CPU "
                       "cannot make a step faster, so it is predicted at no less than 1x (timing noise)"))
      << ::testing::PrintToString(r.notes);
  EXPECT_TRUE(has_note(r,
                       "optimizer offload: verified at 480.5 samples/s, faster than the same configuration without "
                       "optimizer offload (432.4); an optimizer step on the CPU cannot make a step faster, so it "
                       "counts at 432.4 (timing noise)"))
      << ::testing::PrintToString(r.notes);
  EXPECT_TRUE(has_note(r,
                       "optimizer offload + checkpointing: verified at 533.9 samples/s, faster than the same "
                       "configuration without activation checkpointing and optimizer offload (432.4); "
                       "recomputation and an optimizer step on the CPU cannot make a step faster, so it counts at "
                       "432.4 (timing noise)"))
      << ::testing::PrintToString(r.notes);
  const TrailNode* both = node_named(r, "optimizer offload + checkpointing");
  ASSERT_NE(both, nullptr);
  ASSERT_TRUE(both->verification.has_value());
  for (const TrailNode& n : r.trail)
    if (n.verification) {
      EXPECT_LE(n.verification->samples_per_second, both->verification->samples_per_second) << n.node;
    }
}

// Rules: The optimizer step alone. 8-bit AdamW's runs measured 10 % faster
// outside the optimizer step (noise: the example GPT on a 2-core CPU ran
// 8-bit AdamW at 110.7 samples/s against plain's 102.1 with optimizer steps
// of 6.1 and 5.9 ms), while its own optimizer step is slower (0.006 s
// against 0.005). By hand, 32 x 1: plain 0.074 + 0.005 = 0.079 s (405.1
// samples/s), 8-bit AdamW 0.9 x 0.074 + 0.006 = 0.0726 s (440.8), which
// counts at plain's 0.074 s outside the step plus its own 0.006: 0.080 s
// (400.0), within the 3 % tie of plain's: plain, the simpler, wins;
// without the rule 8-bit AdamW would have, by 8.8 %.
TEST(DecisionTree, AVerifiedOptimizerChangeCountsByItsOptimizerStepAlone) {
  FakeRunner fake;
  fake.optimizer_seconds = 0.005;
  fake.eight_bit_time_factor = 0.9;
  fake.eight_bit_optimizer_factor = 1.2;
  const SearchResult r = search_with_room_for_plain(fake, 10);
  const TrailNode* eight_bit = node_named(r, "8-bit AdamW");
  ASSERT_NE(eight_bit, nullptr);
  ASSERT_TRUE(eight_bit->verification.has_value());
  EXPECT_EQ(eight_bit->config.micro_batch, 32);
  EXPECT_NEAR(eight_bit->verification->samples_per_second, 32 / 0.0726, 1e-6);
  EXPECT_EQ(chosen(r).node, "plain");
  EXPECT_NEAR(chosen(r).verification->samples_per_second, 32 / 0.079, 1e-6);
  EXPECT_TRUE(has_note(r,
                       "8-bit AdamW: verified at 440.8 samples/s; it changes only the optimizer step, timed apart at "
                       "0.00600 s against 0.00500 s for plain (405.1 samples/s), so it counts at 400.0 (the rest of "
                       "the step is the same work: its difference is timing noise)"))
      << ::testing::PrintToString(r.notes);
  EXPECT_FALSE(has_note(r, "the chosen configuration trains with adamw8bit"));
  // The trail says why the faster-measured run lost.
  EXPECT_EQ(eight_bit->note,
            "verified, 440.8 samples/s, counted at 400.0: as fast within 3 % (a tie), but more strategies or less "
            "margin than the chosen one");
}

// The same rule keeps a real gain: 8-bit AdamW's optimizer step takes half
// of plain's 0.05 s, and its run measured 5 % slower outside the step
// (noise). By hand, 32 x 1: plain 0.074 + 0.05 = 0.124 s (258.1 samples/s);
// 8-bit AdamW 1.05 x 0.074 + 0.025 = 0.1027 s (311.6), counted at 0.074 +
// 0.025 = 0.099 s (323.2), and chosen. Optimizer offload's runs measured
// 5 % faster (noise too: 0.95 x 0.074 + 0.05 = 0.1203 s, 266.0) and count
// at plain's 258.1 (Rules: Work added), so the best configuration that
// keeps AdamW, named beside the choice, is plain, the simpler of the two
// that tie; it was offload, measured fastest, before.
TEST(DecisionTree, AFasterOptimizerStepStillWinsAndTheJobsOptimizerIsNamedByTheSameRules) {
  FakeRunner fake;
  fake.optimizer_seconds = 0.05;
  fake.eight_bit_time_factor = 1.05;
  fake.eight_bit_optimizer_factor = 0.5;
  fake.offload_time_factor = 0.95;
  const SearchResult r = search_with_room_for_plain(fake, 10);
  const TrailNode* offload = node_named(r, "optimizer offload");
  ASSERT_NE(offload, nullptr);
  ASSERT_TRUE(offload->verification.has_value());
  EXPECT_NEAR(offload->verification->samples_per_second, 32 / (0.95 * 0.074 + 0.05), 1e-6);
  EXPECT_EQ(chosen(r).node, "8-bit AdamW");
  EXPECT_NEAR(chosen(r).verification->samples_per_second, 32 / 0.1027, 1e-6);
  EXPECT_TRUE(has_note(r,
                       "8-bit AdamW: verified at 311.6 samples/s; it changes only the optimizer step, timed apart at "
                       "0.0250 s against 0.0500 s for plain (258.1 samples/s), so it counts at 323.2 (the rest of "
                       "the step is the same work: its difference is timing noise)"))
      << ::testing::PrintToString(r.notes);
  EXPECT_TRUE(has_note(r,
                       "the chosen configuration trains with adamw8bit instead of the job's adamw (quantized "
                       "optimizer states: close to, not equal to, adamw's updates); the fastest verified "
                       "configuration with adamw is plain (micro-batch 32 x 1, adamw, fp32, 258.1 samples/s)"))
      << ::testing::PrintToString(r.notes);
  EXPECT_EQ(chosen(r).note.rfind("chosen: fastest verified, 311.6 samples/s, counted at 323.2, ", 0), 0u)
      << chosen(r).note;
  EXPECT_EQ(offload->note, "verified, but slower: 266.0 samples/s, counted at 258.1");
}

// Plain probes twice as slow as plain runs (noise: a slow first probe): the
// strategies, timed against them, are predicted faster than plain. Plain,
// the reference, takes the second of two verification slots and wins; the
// nodes predicted faster that were never run say so, with what plain
// measured. By hand: plain predicted 2 x 0.074 = 0.148 s, measured 0.074 s;
// 8-bit AdamW 0.148 x 1.1 / 2 = 0.0814 s (verified: 0.0814 s, slower);
// checkpointing measured at 1.6 / 2 = 0.8x plain is held at 1x, so 8-bit +
// checkpointing is predicted at 0.0814 s as well; offload measured at 1.5 /
// 2 = 0.75x plain is held at 1x too (an optimizer step on the CPU only adds
// work), 0.148 s with or without checkpointing: as fast as plain, not
// faster.
TEST(DecisionTree, NodesPredictedFasterButNeverRunSayWhatTheChosenOneMeasured) {
  FakeRunner fake;
  fake.plain_probe_time_factor = 2;
  const SearchResult r = search_with_room_for_plain(fake, 2);
  ASSERT_TRUE(r.chosen.has_value());
  EXPECT_EQ(chosen(r).node, "plain");
  EXPECT_NEAR(chosen(r).predicted_seconds, 0.148, 1e-9);
  std::map<std::string, std::string> notes;
  for (const TrailNode& n : r.trail) notes[n.node] = n.note;
  EXPECT_EQ(notes["8-bit AdamW"], "verified, but slower: 393.1 samples/s");
  const std::string tail =
      " s vs 0.148 s per global batch; the chosen one measured 0.0740 s); not verified "
      "(verification budget spent)";
  EXPECT_EQ(notes["8-bit AdamW + checkpointing"], "predicted faster (0.0814" + tail);
  EXPECT_EQ(notes["optimizer offload"], "predicted as fast within 3 % (0.148" + tail);
  EXPECT_EQ(notes["optimizer offload + checkpointing"], "predicted as fast within 3 % (0.148" + tail);
  EXPECT_TRUE(has_note(r,
                       "optimizer offload: measured at 0.750x the plain step time; an optimizer step on the CPU "
                       "cannot make a step faster, so it is predicted at no less than 1x (timing noise)"))
      << ::testing::PrintToString(r.notes);
  EXPECT_EQ(r.verification_trials, 2);
}

// Plain probes slowest at the smallest micro-batch (noise: the first probe
// warms up): 0.018, 0.026 and 0.042 s run at 4, 8 and 16, measured x 6,
// x 3 and x 1, 0.108, 0.078 and 0.042 s. Their least-squares line falls,
// 0.126 - 0.00536 s per sample, and would predict micro-batches past 23 at
// no time at all; with the slope held at 0, least squares is their mean,
// 0.076 s.
TEST(DecisionTree, StepTimesThatFallWithTheMicroBatchAreNoise) {
  FakeRunner fake;
  fake.plain_probe_time_factor_at = {{4, 6.0}, {8, 3.0}};
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_NEAR(r.baseline_seconds.intercept, 0.076, 1e-12);
  EXPECT_EQ(r.baseline_seconds.slope, 0);
  EXPECT_TRUE(has_note(r,
                       "plain's step times (0.108, 0.078, 0.042 s at micro-batch 4, 8, 16) fit 0.126 s - 0.00536 s "
                       "per sample, which no step runs (timing noise): taken as 0.076 s + 0 s per sample"))
      << ::testing::PrintToString(r.notes);
  for (const TrailNode& n : r.trail) EXPECT_GT(n.predicted_seconds, 0) << n.node;
}

TEST(DecisionTree, EightBitWhenOnlyItsSmallerStateFits) {
  FakeRunner fake;
  fake.parameters = 4 * kMiB;  // 4 Mi parameters: 4 P = 16 MiB
  fake.activation_per_sample = kMiB;
  // AdamW static 16 P + 2 = 66 MiB: no AdamW configuration fits 60 MiB.
  // 8-bit static 10 P + 2 = 42 MiB; activations b MiB, b / 4 with ckpt;
  // accumulation adds the 16 MiB of gradients:
  //   8-bit + ckpt 32 x 1: 42 + 8 = 50 MiB, 1.1 x 1.6 x 0.074 = 0.130 s
  //   8-bit 2 x 16:        42 + 2 + 16 = 60 MiB, 16 x 1.1 x 0.014 = 0.246 s
  //   offload 8 x 4:       34 + 8 + 16 = 58 MiB, 4 x 1.5 x 0.026 = 0.156 s
  //   offload + ckpt 32:   34 + 8 = 42 MiB, 1.5 x 1.6 x 0.074 = 0.178 s
  const SearchResult r = run_search(fake, job_with_budget(60 * kMiB));
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.config.optimizer, OptimizerKind::kAdamW8bit);
  EXPECT_FALSE(best.config.offload_optimizer);
  EXPECT_TRUE(best.config.checkpoint.enabled());
  EXPECT_EQ(best.config.micro_batch, 32);
  EXPECT_EQ(best.verification->peak_bytes, 50 * kMiB);
  // The optimizer change is said, with the fastest verified alternative that
  // keeps AdamW: offload 8 x 4, 32 / 0.156 s = 205.1 samples/s (above).
  EXPECT_EQ(r.notes.back(),
            "the chosen configuration trains with adamw8bit instead of the job's adamw (quantized "
            "optimizer states: close to, not equal to, adamw's updates); the fastest verified "
            "configuration with adamw is optimizer offload (micro-batch 8 x 4, adamw, offload, fp32, "
            "205.1 samples/s)");
}

TEST(DecisionTree, EightBitChosenForSpeedSaysWhatPlainWouldDo) {
  // Everything fits; 8-bit AdamW runs 20 % faster than plain (0.8 x 0.074 s
  // per 32 samples): it wins, and the note names plain's 32 / 0.074 = 432.4
  // samples/s. When 8-bit is slower nothing is said.
  FakeRunner fake;
  fake.eight_bit_time_factor = 0.8;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_EQ(chosen(r).config.optimizer, OptimizerKind::kAdamW8bit);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_EQ(r.notes.back(),
            "the chosen configuration trains with adamw8bit instead of the job's adamw (quantized "
            "optimizer states: close to, not equal to, adamw's updates); the fastest verified "
            "configuration with adamw is plain (micro-batch 32 x 1, adamw, fp32, 432.4 samples/s)");
  FakeRunner slower;
  const SearchResult plain = run_search(slower, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_EQ(chosen(plain).config.optimizer, OptimizerKind::kAdamW);
  for (const std::string& note : plain.notes) EXPECT_EQ(note.find("instead of the job's"), std::string::npos) << note;
}

TEST(DecisionTree, OffloadWhenEvenEightBitStateDoesNotFit) {
  FakeRunner fake;
  fake.parameters = 4 * kMiB;
  fake.activation_per_sample = kMiB;
  // 45 MiB: 8-bit needs at least 42 + 8 = 50 MiB (ckpt, 32 x 1); offload +
  // ckpt at 32 x 1 needs 34 + 8 = 42 MiB; with accumulation the 16 MiB of
  // gradients rule out everything else.
  const SearchResult r = run_search(fake, job_with_budget(45 * kMiB));
  const TrailNode& best = chosen(r);
  EXPECT_TRUE(best.config.offload_optimizer);
  EXPECT_TRUE(best.config.checkpoint.enabled());
  EXPECT_EQ(best.config.micro_batch, 32);
  EXPECT_EQ(best.verification->peak_bytes, 42 * kMiB);
}

// The host budget (Note [Host budget]): offload's fp32 masters, gradients
// and AdamW state take 16 bytes per parameter on the host, 64 MiB for the
// 4 Mi parameters of OffloadWhenEvenEightBitStateDoesNotFit, whose only
// fitting configuration offloads: its model and 45 MiB budget under
// `host_budget`.
struct OffloadOnly {
  FakeRunner fake;
  JobSpec job;
};
OffloadOnly offload_only_fits(int64_t host_budget) {
  OffloadOnly o;
  o.fake.parameters = 4 * kMiB;
  o.fake.activation_per_sample = kMiB;
  o.job = job_with_budget(45 * kMiB);
  o.job.host_budget_bytes = host_budget;
  return o;
}

TEST(DecisionTree, AHostBudgetBelowOffloadsStateRulesOffloadOutBeforeItIsProbed) {
  OffloadOnly tight = offload_only_fits(63 * kMiB);
  const SearchResult r = run_search(tight.fake, tight.job);
  EXPECT_FALSE(r.chosen.has_value());
  for (const ProbeReport& p : r.probes) EXPECT_EQ(p.config.find("offload=on"), std::string::npos) << p.config;
  EXPECT_EQ(node_named(r, "optimizer offload"), nullptr);
  EXPECT_TRUE(has_note(r,
                       "optimizer offload: not tried: its fp32 master weights, gradients and adamw state for 4194304 "
                       "trainable parameters take 64.00 MiB of host memory, over the usable host budget (63.00 MiB, "
                       "after 0 % headroom)"))
      << ::testing::PrintToString(r.notes);
  // With room on the host, offload is chosen as before, and its host peak
  // is the 64 MiB counted.
  OffloadOnly roomy = offload_only_fits(64 * kMiB);
  const SearchResult fits = run_search(roomy.fake, roomy.job);
  ASSERT_TRUE(fits.chosen.has_value());
  EXPECT_TRUE(chosen(fits).config.offload_optimizer);
  EXPECT_EQ(chosen(fits).verification->host_peak_bytes, 64 * kMiB);
}

// A trial holds its inputs on the host before they are copied: a host
// budget below what plain held is the job's error, not a search result.
TEST(DecisionTree, AHostBudgetBelowWhatPlainHoldsIsAnInputError) {
  FakeRunner fake;
  fake.host_batch_bytes = 2 * kMiB;
  JobSpec job = job_with_budget(plain_peak(32) + kMiB);
  job.spec_path = "job.toml";
  job.host_budget_bytes = kMiB;
  try {
    run_search(fake, job);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "job.toml: host_budget: the usable host budget (1.00 MiB) is below the 2.00 MiB that micro-batch 4 x 1, "
              "adamw, fp32 held on the host without optimizer offload (its inputs, before they are copied to the "
              "device): raise it or leave it out");
  }
}

// The state fits the host budget, but the trial measured more (its host
// update's temporaries, the batch): the probe ran out of host memory, and
// offload drops as any strategy whose probe ran out of memory.
TEST(DecisionTree, AProbeOverTheHostBudgetRanOutOfHostMemory) {
  OffloadOnly o = offload_only_fits(70 * kMiB);
  o.fake.offload_host_extra = 16 * kMiB;  // 4 bytes per parameter
  const SearchResult r = run_search(o.fake, o.job);
  EXPECT_FALSE(r.chosen.has_value());
  int offloaded = 0;
  for (const ProbeReport& p : r.probes) {
    if (p.config.find("offload=on") == std::string::npos) continue;
    ++offloaded;
    EXPECT_EQ(p.outcome, TrialOutcome::kOutOfMemory);
    EXPECT_EQ(outcome_text(p),
              "out_of_memory: host memory: the trial held 80.00 MiB on the host at its peak, over the usable host "
              "budget (70.00 MiB)");
  }
  EXPECT_GT(offloaded, 0);
  EXPECT_EQ(o.fake.verifications, 0);
}

// A verification whose later steps grow on the host past the budget is
// dropped, without blaming the device's memory model.
TEST(DecisionTree, AVerificationOverTheHostBudgetIsDropped) {
  OffloadOnly o = offload_only_fits(70 * kMiB);
  o.fake.verification_host_growth = 8 * kMiB;
  const SearchResult r = run_search(o.fake, o.job);
  EXPECT_FALSE(r.chosen.has_value());
  const TrailNode* offload = node_named(r, "optimizer offload + checkpointing");
  ASSERT_NE(offload, nullptr);
  ASSERT_TRUE(offload->verification.has_value());
  EXPECT_EQ(offload->note,
            "verified run: out_of_memory after 20 steps (host memory: the trial held 72.00 MiB on the host at its "
            "peak, over the usable host budget (70.00 MiB)); dropped");
}

TEST(DecisionTree, AdafactorIsOneRowOfTheTableTriedOnlyWhenTheJobAllowsIt) {
  FakeRunner fake;
  fake.parameters = 4 * kMiB;
  fake.activation_per_sample = kMiB;
  // As OffloadWhenEvenEightBitStateDoesNotFit, 45 MiB, with Adafactor's
  // 0.25 MiB of state: Adafactor + ckpt 32 x 1 needs 32 + 0.25 + 2 + 8 =
  // 42.25 MiB and runs 1.6 x 0.074 = 0.118 s, faster than offload + ckpt
  // (1.5 x 1.6 x 0.074 = 0.178 s at 42 MiB); without checkpointing or with
  // accumulation it needs 66.25 or 58.25 MiB.
  JobSpec job = job_with_budget(45 * kMiB);
  job.allow_adafactor = true;
  const SearchResult r = run_search(fake, job);
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.config.optimizer, OptimizerKind::kAdafactor);
  EXPECT_FALSE(best.config.offload_optimizer);
  EXPECT_TRUE(best.config.checkpoint.enabled());
  EXPECT_EQ(best.config.micro_batch, 32);
  EXPECT_EQ(best.verification->peak_bytes, 42 * kMiB + kMiB / 4);
  EXPECT_NEAR(best.predicted_peak_bytes, 42 * kMiB + kMiB / 4, 1);
  EXPECT_EQ(best.node, "Adafactor + checkpointing");
  ASSERT_NE(node_named(r, "Adafactor"), nullptr);
  EXPECT_FALSE(node_named(r, "Adafactor")->predicted_fit);
  // Its effect changes optimizer state only: one probe, at one size.
  const auto adafactor_probes = std::count_if(r.probes.begin(), r.probes.end(), [](const ProbeReport& p) {
    return p.config.find("optimizer=adafactor") != std::string::npos;
  });
  EXPECT_EQ(adafactor_probes, 1);
  EXPECT_EQ(r.notes.back().rfind("the chosen configuration trains with adafactor instead of the job's adamw (no "
                                 "momentum and a factored second moment: not adamw's updates;",
                                 0),
            0u)
      << r.notes.back();
  // Not allowed: never probed, and offload is chosen as before.
  FakeRunner again;
  again.parameters = 4 * kMiB;
  again.activation_per_sample = kMiB;
  const SearchResult plain = run_search(again, job_with_budget(45 * kMiB));
  EXPECT_TRUE(chosen(plain).config.offload_optimizer);
  for (const ProbeReport& p : plain.probes) EXPECT_EQ(p.config.find("adafactor"), std::string::npos) << p.config;
  EXPECT_EQ(node_named(plain, "Adafactor"), nullptr);
}

TEST(DecisionTree, NothingFitsSaysSoWithTheLeastMemoryNeeded) {
  FakeRunner fake;
  // The least any configuration needs: params + grads 8 MiB, offload, 2 MiB,
  // checkpointed activations 2 MiB at micro-batch 1, and with 32
  // accumulation steps the gradients (4 MiB) again = 16 MiB.
  const SearchResult r = run_search(fake, job_with_budget(10 * kMiB));
  EXPECT_FALSE(r.chosen.has_value());
  EXPECT_EQ(r.verification_trials, 0);
  EXPECT_NEAR(r.smallest_predicted_peak_bytes, 16 * kMiB, 1.0);
  EXPECT_EQ(r.smallest_micro_batch, 1);
  for (const TrailNode& node : r.trail) EXPECT_FALSE(node.predicted_fit) << node.node;
}

// The plain probes, in the order they ran: "4 out_of_memory", "2 ok".
std::vector<std::string> plain_probes(const SearchResult& r) {
  std::vector<std::string> plain;
  for (const ProbeReport& p : r.probes)
    if (p.config.find(",ckpt=none,optimizer=adamw,offload=off,precision=fp32") != std::string::npos)
      plain.push_back(std::to_string(p.micro_batch) + " " + to_string(p.outcome));
  return plain;
}

// oomtune probes under a RAM guard of 4x the usable budget. At 10 MiB that is
// 40 MiB, and plain micro-batch 4 (G/8) needs 18 + 32 = 50 MiB: the probes
// step down to 2 (34 MiB) and 1 (26 MiB) rather than trying 8 and 16, and
// the answer is the "nothing fits" of the test above, not an error.
TEST(DecisionTree, PlainProbesStepDownWhenEvenTheSmallestSizeRunsOutOfMemory) {
  FakeRunner fake;
  fake.probe_budget = 40 * kMiB;
  const SearchResult r = run_search(fake, job_with_budget(10 * kMiB));
  EXPECT_EQ(plain_probes(r), (std::vector<std::string>{"4 out_of_memory", "2 ok", "1 ok"}));
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{1, 2}));
  EXPECT_NEAR(r.baseline_peak(1), static_cast<double>(plain_peak(1)), 1.0);
  EXPECT_NEAR(r.baseline_peak.slope, 8.0 * kMiB, 1.0);
  EXPECT_FALSE(r.chosen.has_value());
  EXPECT_NEAR(r.smallest_predicted_peak_bytes, 16 * kMiB, 1.0);

  // Under an 11 MiB guard even micro-batch 1 (26 MiB) runs out, and so does
  // the least-memory combination there: checkpointing all blocks and
  // offload need 8 (weights + gradients) + 2 + 2 (a quarter of 8 MiB of
  // activations) = 12 MiB. Nothing fits, measured (Note [Rescue]); before,
  // this was an InputError (exit 2) naming micro-batch 1.
  FakeRunner tight;
  tight.probe_budget = 11 * kMiB;
  const SearchResult t = run_search(tight, job_with_budget(5 * kMiB));
  EXPECT_EQ(plain_probes(t), (std::vector<std::string>{"4 out_of_memory", "2 out_of_memory", "1 out_of_memory"}));
  ASSERT_EQ(t.probes.size(), 4u);
  EXPECT_EQ(t.probes.back().config, "micro_batch=1,accum=1,ckpt=all,optimizer=adamw,offload=on,precision=fp32");
  EXPECT_EQ(t.least_memory_failure,
            "plain and even the configuration that needs the least memory (checkpointing (all blocks) + optimizer "
            "offload) ran out of memory at micro-batch 1 (measured: oomtune budget: tried to allocate)");
  EXPECT_TRUE(t.trail.empty());
  EXPECT_FALSE(t.chosen.has_value());
  EXPECT_EQ(t.verification_trials, 0);
  EXPECT_EQ(t.smallest_micro_batch, 1);
  EXPECT_EQ(t.parameter_count, tight.parameters);  // for the ZeRO table
  EXPECT_EQ(t.static_memory.parameter_bytes, 4 * kMiB);
}

// Note [Rescue]: the guard is the budget (a GPU whose whole memory is the
// budget), 25 MiB. Plain needs 18 + 8 b MiB: out at 4, 2 and 1. The
// least-memory combination (checkpointing + offload, 12 MiB at 1) runs, so
// the single strategies are tried in the tree's order: checkpointing all
// blocks needs 18 + 2 b = 20 MiB at 1 and runs; it becomes the base. Its
// walk: 4 (26 MiB) out, 2 (22 MiB) runs. On top of it, 8-bit AdamW (state
// 2 MiB instead of 8: 12 + 2 b) and offload (10 + 2 b). With 8
// accumulation steps the gradients (4 MiB) add: 8-bit at 4 x 8 needs
// 12 + 8 + 4 = 24 MiB and is fastest, 8 x (0.016 + 0.0032 x 4) x 1.1 =
// 0.253 s (offload 4 x 8: x 1.5 = 0.346 s; checkpointing alone 1 x 32:
// 32 x 0.0192 = 0.614 s). The other single strategies are probed at 1
// without the base too: 8-bit AdamW alone (12 + 8 b = 20 MiB) and offload
// alone (18 MiB) run at 1 and run out at 2, so each is a node of its own,
// 1 x 32 (24 and 22 MiB with the gradients), 32 x 0.012 x 1.1 =
// 0.4224 s and x 1.5 = 0.576 s: slower than 8-bit + checkpointing here.
TEST(DecisionTree, WhenPlainRunsAtNoMicroBatchTheSimplestStrategyThatRunsBecomesTheBase) {
  FakeRunner fake;
  fake.probe_budget = 25 * kMiB;
  const SearchResult r = run_search(fake, job_with_budget(25 * kMiB));
  EXPECT_EQ(plain_probes(r), (std::vector<std::string>{"4 out_of_memory", "2 out_of_memory", "1 out_of_memory"}));
  std::vector<std::string> rescue;
  for (std::size_t i = 3; i < r.probes.size(); ++i)
    rescue.push_back(r.probes[i].config + " " + to_string(r.probes[i].outcome));
  EXPECT_EQ(rescue, (std::vector<std::string>{
                        "micro_batch=1,accum=1,ckpt=all,optimizer=adamw,offload=on,precision=fp32 ok",
                        "micro_batch=1,accum=1,ckpt=all,optimizer=adamw,offload=off,precision=fp32 ok",
                        "micro_batch=4,accum=1,ckpt=all,optimizer=adamw,offload=off,precision=fp32 out_of_memory",
                        "micro_batch=2,accum=1,ckpt=all,optimizer=adamw,offload=off,precision=fp32 ok",
                        "micro_batch=1,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32 ok",
                        "micro_batch=2,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32 out_of_memory",
                        "micro_batch=1,accum=1,ckpt=none,optimizer=adamw,offload=on,precision=fp32 ok",
                        "micro_batch=2,accum=1,ckpt=none,optimizer=adamw,offload=on,precision=fp32 out_of_memory",
                        "micro_batch=1,accum=1,ckpt=all,optimizer=adamw8bit,offload=off,precision=fp32 ok",
                        "micro_batch=1,accum=1,ckpt=all,optimizer=adamw,offload=on,precision=fp32 ok",
                    }));
  EXPECT_EQ(r.baseline_name, "checkpointing (all blocks)");
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{1, 2}));
  EXPECT_NEAR(r.baseline_peak.intercept, 18.0 * kMiB, 1.0);
  EXPECT_NEAR(r.baseline_peak.slope, 2.0 * kMiB, 1.0);
  EXPECT_TRUE(r.least_memory_failure.empty());
  EXPECT_EQ(r.notes.front(),
            "plain ran out of memory at every micro-batch down to 1 (oomtune budget: tried to allocate); "
            "checkpointing (all blocks) is the simplest combination that runs there, so the configurations below "
            "build on it, except the other combinations of one strategy (probed there too); other larger "
            "combinations without it are not predicted");
  EXPECT_EQ(r.notes[1],
            "8-bit AdamW also runs at micro-batch 1 (without checkpointing (all blocks); micro-batch 2: out_of_memory "
            "during forward: oomtune budget: tried to allocate): its node is fitted to that one probe, its memory "
            "lines with the slope of its retained activations (a lower bound), its time line is the base's times its "
            "measured ratio to it");
  std::map<std::string, const TrailNode*> alternatives;
  for (const TrailNode& node : r.trail) {
    if (node.node == "8-bit AdamW" || node.node == "optimizer offload") {
      alternatives[node.node] = &node;
      EXPECT_FALSE(node.config.checkpoint.enabled()) << node.node;
    } else {
      EXPECT_TRUE(node.config.checkpoint.enabled()) << node.node;
    }
  }
  ASSERT_EQ(alternatives.size(), 2u);
  const TrailNode& eight_bit = *alternatives["8-bit AdamW"];
  EXPECT_EQ(to_string(eight_bit.config),
            "micro_batch=1,accum=32,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32");
  EXPECT_NEAR(eight_bit.predicted_peak_bytes, 24.0 * kMiB, 1.0);
  EXPECT_NEAR(eight_bit.predicted_seconds, 32 * 0.012 * 1.1, 1e-9);
  EXPECT_EQ(eight_bit.verification->peak_bytes, 24 * kMiB);
  const TrailNode& offload = *alternatives["optimizer offload"];
  EXPECT_EQ(offload.config.micro_batch, 1);
  EXPECT_NEAR(offload.predicted_peak_bytes, 22.0 * kMiB, 1.0);
  EXPECT_NEAR(offload.predicted_seconds, 32 * 0.012 * 1.5, 1e-9);
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.node, "8-bit AdamW + checkpointing (all blocks)");
  EXPECT_EQ(best.config.micro_batch, 4);
  EXPECT_EQ(best.config.accumulation_steps, 8);
  EXPECT_NEAR(best.predicted_seconds, 8 * (0.016 + 0.0032 * 4) * 1.1, 1e-9);
  EXPECT_EQ(best.verification->peak_bytes, 24 * kMiB);
  // The strategies are counted against the job's own configuration: the
  // optimizer changed from the job's AdamW, so the report says so.
  EXPECT_NE(r.notes.back().find("trains with adamw8bit instead of the job's adamw"), std::string::npos)
      << r.notes.back();
}

// The rescue above under a host budget below offload's 16 MiB (1 Mi
// parameters): the least-memory combination keeps 8-bit AdamW's state on
// the device instead, and no combination offloads.
TEST(DecisionTree, ARescueUnderAHostBudgetTriesEightBitAdamWInPlaceOfOffload) {
  FakeRunner fake;
  fake.probe_budget = 25 * kMiB;
  JobSpec job = job_with_budget(25 * kMiB);
  job.host_budget_bytes = 15 * kMiB;
  const SearchResult r = run_search(fake, job);
  ASSERT_GT(r.probes.size(), 3u);
  EXPECT_EQ(r.probes[3].config, "micro_batch=1,accum=1,ckpt=all,optimizer=adamw8bit,offload=off,precision=fp32");
  for (const ProbeReport& p : r.probes) EXPECT_EQ(p.config.find("offload=on"), std::string::npos) << p.config;
  EXPECT_EQ(chosen(r).node, "8-bit AdamW + checkpointing (all blocks)");
  EXPECT_TRUE(has_note(r,
                       "optimizer offload: not tried: its fp32 master weights, gradients and adamw state for "
                       "1048576 trainable parameters take 16.00 MiB of host memory, over the usable host budget "
                       "(15.00 MiB, after 0 % headroom)"));
}

// The rescue above with recomputation three times as dear (checkpointing
// all blocks: time x 3): 8-bit AdamW + checkpointing 4 x 8 now takes 8 x
// 0.018 x 3 x 1.1 = 0.4752 s, and 8-bit AdamW alone, found only because the
// other single strategies are probed without the base, runs 1 x 32 in
// 32 x 0.012 x 1.1 = 0.4224 s at 24 MiB: it is chosen.
TEST(DecisionTree, ARescueAlternativeWithoutTheBaseIsChosenWhenItIsFaster) {
  FakeRunner fake;
  fake.probe_budget = 25 * kMiB;
  fake.checkpoint_time_cost = 2.0;
  const SearchResult r = run_search(fake, job_with_budget(25 * kMiB));
  EXPECT_EQ(r.baseline_name, "checkpointing (all blocks)");
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.node, "8-bit AdamW");
  EXPECT_EQ(to_string(best.config), "micro_batch=1,accum=32,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32");
  EXPECT_NEAR(best.predicted_seconds, 32 * 0.012 * 1.1, 1e-9);
  EXPECT_EQ(best.verification->peak_bytes, 24 * kMiB);
  const TrailNode* with_checkpointing = node_named(r, "8-bit AdamW + checkpointing (all blocks)");
  ASSERT_NE(with_checkpointing, nullptr);
  EXPECT_EQ(with_checkpointing->config.micro_batch, 4);
  EXPECT_NEAR(with_checkpointing->predicted_seconds, 8 * 0.018 * 3 * 1.1, 1e-9);
}

// Guard = budget = 25 MiB, bf16 allowed, recomputation at 3x: plain
// (18 + 8 b MiB) runs out at 1 and checkpointing (18 + 2 b) rescues; 8-bit
// AdamW (12 + 8 b), offload (10 + 8 b) and bf16 (18 + 4 b) alone run at 1,
// not at 2. 8-bit AdamW + bf16, which neither recomputes nor offloads, is
// probed too: 12 + 4 b runs at 1 and 2, and with 4 MiB of gradients when
// accumulating needs 24 MiB at 2 x 16, in 16 x (0.01 + 0.002 x 2) x 0.9 x
// 1.1 = 0.22176 s. It beats 8-bit AdamW + bf16 + checkpointing, 8 x 4 in
// 4 x 0.026 x 3 x 0.99 = 0.30888 s, which was the answer before.
TEST(DecisionTree, ARescueProbes8bitAdamWWithBf16WithoutTheBase) {
  FakeRunner fake;
  fake.probe_budget = 25 * kMiB;
  fake.checkpoint_time_cost = 2.0;
  JobSpec job = job_with_budget(25 * kMiB);
  job.allow_bf16 = true;
  const SearchResult r = run_search(fake, job);
  EXPECT_EQ(r.baseline_name, "checkpointing (all blocks)");
  std::vector<std::string> pair_probes;
  for (const ProbeReport& p : r.probes)
    if (p.config.find("ckpt=none,optimizer=adamw8bit,offload=off,precision=bf16") != std::string::npos)
      pair_probes.push_back(std::to_string(p.micro_batch) + " " + to_string(p.outcome));
  EXPECT_EQ(pair_probes, (std::vector<std::string>{"1 ok", "2 ok"}));
  EXPECT_NE(r.notes.front().find("except the other combinations of one strategy and 8-bit AdamW + bf16 (probed "
                                 "there too); other larger combinations without it are not predicted"),
            std::string::npos)
      << r.notes.front();
  EXPECT_NE(std::find(r.notes.begin(), r.notes.end(),
                      "8-bit AdamW + bf16 also runs at micro-batch 1 and 2 (without checkpointing (all blocks)): its "
                      "node is fitted to those probes, its time line is the base's times its measured ratio to it"),
            r.notes.end());
  const TrailNode* pair = node_named(r, "8-bit AdamW + bf16");
  const TrailNode* with_base = node_named(r, "8-bit AdamW + bf16 + checkpointing (all blocks)");
  ASSERT_TRUE(pair && with_base);
  EXPECT_EQ(node_named(r, "optimizer offload + bf16"), nullptr) << "offloads: not probed without the base";
  EXPECT_EQ(to_string(pair->config), "micro_batch=2,accum=16,ckpt=none,optimizer=adamw8bit,offload=off,precision=bf16");
  EXPECT_NEAR(pair->predicted_peak_bytes, 24.0 * kMiB, 1.0);
  EXPECT_NEAR(pair->predicted_seconds, 16 * 0.014 * 0.9 * 1.1, 1e-9);
  EXPECT_EQ(with_base->config.micro_batch, 8);
  EXPECT_NEAR(with_base->predicted_seconds, 4 * 0.026 * 3 * 0.99, 1e-9);
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.node, "8-bit AdamW + bf16");
  EXPECT_EQ(best.verification->peak_bytes, 24 * kMiB);
}

// Activations 14 MiB per sample, guard = budget = 25 MiB: plain (18 + 14 b)
// and 8-bit AdamW alone (12 + 14 b = 26 MiB at 1) run out; checkpointing
// (18 + 3.5 b) rescues. Offload alone runs at 1 (10 + 14 = 24 MiB), not at
// 2, and with 32 accumulation steps needs 28 MiB: its node does not fit.
TEST(DecisionTree, ARescueAlternativeThatRunsOutOfMemoryIsNotAvailable) {
  FakeRunner fake;
  fake.probe_budget = 25 * kMiB;
  fake.activation_per_sample = 14 * kMiB;
  const SearchResult r = run_search(fake, job_with_budget(25 * kMiB));
  EXPECT_EQ(r.baseline_name, "checkpointing (all blocks)");
  EXPECT_NE(std::find(r.notes.begin(), r.notes.end(),
                      "8-bit AdamW (without checkpointing (all blocks)): not available (micro-batch 1: out_of_memory "
                      "during forward: oomtune budget: tried to allocate)"),
            r.notes.end());
  EXPECT_EQ(node_named(r, "8-bit AdamW"), nullptr);
  const TrailNode* offload = node_named(r, "optimizer offload");
  ASSERT_NE(offload, nullptr);
  EXPECT_EQ(offload->largest_fitting_micro_batch, 0);
  EXPECT_FALSE(offload->predicted_fit);
}

// 2 Mi parameters, activations 4 MiB per sample, guard = budget = 36 MiB:
// plain needs 34 + 4 b MiB (out at 1), checkpointing 34 + b (runs at 1 and
// 2: the base, time (0.01 + 0.002 b) x 1.6). Offload alone needs 18 + 4 b
// (runs at 1 and 2: its line), + 8 MiB of gradients when accumulating:
// 34 MiB at 2 x 16 fits, 42 at 4 does not. Its time is the base's line
// times its ratio to it, 0.018 / 0.0192 at 1 and 0.021 / 0.0224 at 2:
// 16 x (0.015 + 0.003 x 2) = 0.336 s, the fake's true time (a flat line
// through a probe would say 16 x 0.018 = 0.288 s).
TEST(DecisionTree, ARescueAlternativeTakesTheTimeLineOfTheBaseScaledByItsRatio) {
  FakeRunner fake;
  fake.parameters = 2 * kMiB;
  fake.activation_per_sample = 4 * kMiB;
  fake.retained_fraction = 0.5;  // through one probe the slope would be 2 MiB: 4 x 8 would be predicted to fit
  fake.probe_budget = 36 * kMiB;
  const SearchResult r = run_search(fake, job_with_budget(36 * kMiB));
  EXPECT_EQ(r.baseline_name, "checkpointing (all blocks)");
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{1, 2}));
  const TrailNode* offload = node_named(r, "optimizer offload");
  ASSERT_NE(offload, nullptr);
  EXPECT_EQ(to_string(offload->config), "micro_batch=2,accum=16,ckpt=none,optimizer=adamw,offload=on,precision=fp32");
  EXPECT_NEAR(offload->predicted_peak_bytes, 34.0 * kMiB, 1.0);
  EXPECT_NEAR(offload->predicted_seconds, 16 * (0.015 + 0.003 * 2), 1e-9);
  EXPECT_TRUE(offload->predicted_fit);
  EXPECT_NE(std::find(r.notes.begin(), r.notes.end(),
                      "optimizer offload also runs at micro-batch 1 and 2 (without checkpointing (all blocks)): its "
                      "node is fitted to those probes, its time line is the base's times its measured ratio to it"),
            r.notes.end());
}

// Stepping down, a micro-batch that fails for its size (BatchNorm at 1)
// leaves one size that ran: the second lies between it and the smallest one
// that ran out. Guard 45 MiB: plain 4 needs 50 MiB, 2 needs 34, 3 needs 42.
TEST(DecisionTree, WhenSmallerSizesFailTheSecondProbeLiesBelowTheOneThatRanOut) {
  FakeRunner fake;
  fake.probe_budget = 45 * kMiB;
  fake.fails_at_or_below = 1;
  const SearchResult r = run_search(fake, job_with_budget(10 * kMiB));
  EXPECT_EQ(plain_probes(r), (std::vector<std::string>{"4 out_of_memory", "2 ok", "1 error", "3 ok"}));
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{2, 3}));
  EXPECT_NEAR(r.baseline_peak.slope, 8.0 * kMiB, 1.0);
  EXPECT_EQ(r.smallest_micro_batch, 2);  // micro-batch 1 cannot run
  EXPECT_FALSE(r.chosen.has_value());
}

// An out-of-memory probe ends the walk up (16 needs more than 8), and the
// one size that ran (4) gets a second below it, so the line has a slope.
// Guard 60 MiB (4 x the 15 MiB budget, as in oomtune): plain 4 needs
// 50 MiB, 8 needs 82, 2 needs 34.
TEST(DecisionTree, AnOutOfMemoryProbeEndsTheWalkUpAndASmallerSizeGivesTheSlope) {
  FakeRunner fake;
  fake.probe_budget = 60 * kMiB;
  const SearchResult r = run_search(fake, job_with_budget(15 * kMiB));
  EXPECT_EQ(plain_probes(r), (std::vector<std::string>{"4 ok", "8 out_of_memory", "2 ok"}));
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{2, 4}));
  ASSERT_FALSE(r.trail.empty());
  EXPECT_EQ(r.trail.front().node, "plain");
  EXPECT_NEAR(r.trail.front().predicted_peak_bytes, static_cast<double>(plain_peak(32)), 1.0);
}

// Plain runs out of memory at 1 (guard 25 MiB, plain 26 MiB) and every
// combination of strategies runs past the probe timeout there (0.0125 s;
// plain would take 0.012 s, 8-bit AdamW 1.1x that, offload 1.5x,
// checkpointing 1.6x): nothing ran, and a timeout proves nothing about
// memory, so this is the error naming both failures, not "nothing fits".
TEST(DecisionTree, WhenNoCombinationRunsForAnotherReasonThanMemoryItIsAnError) {
  FakeRunner fake;
  fake.probe_budget = 25 * kMiB;
  fake.probe_timeout_seconds = 0.0125;
  try {
    run_search(fake, job_with_budget(25 * kMiB));
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "fake.pt: no configuration could run at micro-batch 1: plain: oomtune budget: tried to allocate; "
              "checkpointing (all blocks) + optimizer offload: timeout: no result after 600 s");
  }
  // Plain at 4, 2, 1; then checkpointing + offload, checkpointing, 8-bit
  // AdamW, offload, checkpointing + 8-bit AdamW.
  EXPECT_EQ(fake.probes, 3 + 5);
}

// one_point_base_fake: activations 24 MiB per sample, guard = budget =
// 29 MiB; plain needs 42 MiB at 1; checkpointing (18 + 6 b MiB) runs at 1
// (24 MiB) and is rescued (Note [Rescue]), but runs out at 4 (42) and 2
// (30): one point. Its lines take the slope of its retained activations
// (6 MiB per sample, exact on the fake). 8-bit AdamW on top saves 6 MiB
// of state: 18 + 6 (b - 1) + 4 MiB of gradients fits at 2 x 16 (28 MiB);
// offload (16 + 6 (b - 1) + 4) too, slower (1.5x vs 1.1x). Before, the
// lines were flat: 8-bit at 16 x 2 was predicted at 22 MiB and its
// verification ran out (true 12 + 96 + 4 MiB).
TEST(DecisionTree, AOnePointBaseTakesTheSlopeOfItsRetainedActivations) {
  FakeRunner fake = one_point_base_fake();
  const SearchResult r = run_search(fake, job_with_budget(kOnePointBudget));
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{1}));
  EXPECT_NEAR(r.baseline_peak.slope, 6.0 * kMiB, 1.0);
  EXPECT_NE(std::find(r.notes.begin(), r.notes.end(),
                      "checkpointing (all blocks) ran at micro-batch 1 only: its memory lines take the slope of its "
                      "retained activations, 6.00 MiB per sample (a lower bound)"),
            r.notes.end());
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.node, "8-bit AdamW + checkpointing (all blocks)");
  EXPECT_EQ(best.config.micro_batch, 2);
  EXPECT_EQ(best.config.accumulation_steps, 16);
  EXPECT_NEAR(best.predicted_peak_bytes, 28.0 * kMiB, 1.0);
  EXPECT_EQ(best.verification->peak_bytes, 28 * kMiB);
  for (const TrailNode& node : r.trail) {
    if (node.verification) {
      EXPECT_EQ(node.verification->outcome, TrialOutcome::kOk) << node.node;
    }
  }
}

// Where the retained activations say nothing (all of a micro-batch's
// memory is backward's temporaries), a line through one point has no
// slope: the probe that ran out of memory above it bounds that
// configuration instead. The case above with retained activations 0:
// checkpointing's line is flat at 24 MiB. Without the bound, checkpointing
// at 32 x 1 and 16 x 2 were predicted to fit and their verification runs
// ran out; with it, accumulation runs 1 x 32 (24 + 4 MiB of gradients =
// 28 MiB).
TEST(DecisionTree, AProbeOutOfMemoryBoundsItsConfigurationWhereTheLineHasNoSlope) {
  FakeRunner fake = one_point_base_fake();
  fake.retained_fraction = 0;
  const SearchResult r = run_search(fake, job_with_budget(kOnePointBudget));
  EXPECT_EQ(r.baseline_name, "checkpointing (all blocks)");
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{1}));
  EXPECT_NEAR(r.baseline_peak.slope, 0.0, 1.0);
  const TrailNode* found = node_named(r, "checkpointing (all blocks)");
  ASSERT_NE(found, nullptr);
  const TrailNode& whole = *found;
  EXPECT_FALSE(whole.predicted_fit);
  EXPECT_EQ(whole.note, "does not fit: its probe ran out of memory at micro-batch 2 (measured)");
  EXPECT_FALSE(whole.verification.has_value());
  const TrailNode* accumulation = node_named(r, "micro-batch + accumulation + checkpointing (all blocks)");
  ASSERT_NE(accumulation, nullptr);
  EXPECT_EQ(accumulation->config.micro_batch, 1);
  EXPECT_EQ(accumulation->config.accumulation_steps, 32);
  ASSERT_TRUE(accumulation->verification.has_value());
  EXPECT_EQ(accumulation->verification->outcome, TrialOutcome::kOk);
  EXPECT_EQ(accumulation->verification->peak_bytes, 28 * kMiB);
  ASSERT_TRUE(r.chosen.has_value());
}

// A probe that runs past the trial timeout ends the walk up too: a larger
// micro-batch takes longer. Plain step time 0.01 + 0.002 b s against a
// 0.02 s limit: 4 (0.018 s) runs, 8 (0.026 s) times out, 2 gives the slope.
TEST(DecisionTree, ATimedOutProbeEndsTheWalkUp) {
  FakeRunner fake;
  fake.probe_timeout_seconds = 0.02;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_EQ(plain_probes(r), (std::vector<std::string>{"4 ok", "8 timeout", "2 ok"}));
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{2, 4}));
  EXPECT_NEAR(r.baseline_peak.slope, 8.0 * kMiB, 1.0);
  EXPECT_NEAR(r.baseline_seconds.slope, 0.002, 1e-12);
  EXPECT_EQ(chosen(r).config.micro_batch, 32);  // verifications have no such limit here
}

// When nothing ran before a timeout, the probes go up from the smallest
// micro-batch, not down by halving: each timeout costs the whole
// trial_timeout, and a model that times out at 1 will not run at all.
TEST(DecisionTree, AfterATimeoutAtTheFirstProbeTheProbesGoUpFromTheSmallest) {
  FakeRunner fake;
  fake.probe_timeout_seconds = 0.0165;  // 1 (0.012 s) and 2 (0.014 s) run, 4 (0.018 s) does not
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_EQ(plain_probes(r), (std::vector<std::string>{"4 timeout", "1 ok", "2 ok"}));
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{1, 2}));
  EXPECT_NEAR(r.baseline_peak(1), static_cast<double>(plain_peak(1)), 1.0);
  EXPECT_NEAR(r.baseline_peak.slope, 8.0 * kMiB, 1.0);

  // Every size times out (a hang): two timeouts, then the error naming
  // both. Before, 4, 8 and 16 each timed out, then 4 was named.
  FakeRunner hangs;
  hangs.probe_timeout_seconds = 0.005;
  try {
    run_search(hangs, job_with_budget(plain_peak(32) + kMiB));
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "fake.pt: the plain configuration could not run at micro-batch 1 or 4: timeout: no result after 600 s");
  }
  EXPECT_EQ(hangs.probes, 2);  // 4, 1

  // Micro-batch 1 fails for its size (BatchNorm): going up, 2 runs, and the
  // second point is bisected between 2 and the timed-out 4 (3: 0.016 s).
  FakeRunner batch_norm;
  batch_norm.probe_timeout_seconds = 0.0165;
  batch_norm.fails_at_or_below = 1;
  const SearchResult b = run_search(batch_norm, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_EQ(plain_probes(b), (std::vector<std::string>{"4 timeout", "1 error", "2 ok", "3 ok"}));
  EXPECT_EQ(b.baseline_micro_batches, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.smallest_micro_batch, 2);
}

// The same error about the user's input at two sizes (`output` unset for a
// model that returns a dict) does not depend on the micro-batch: the walk
// stops there, where it used to try 16 too, and the error names both sizes
// and the model's path once (Note [An error that does not depend on the
// micro-batch]).
TEST(DecisionTree, TheSameInputErrorAtTwoSizesEndsTheProbes) {
  FakeRunner fake;
  fake.loss_input_error = "fake.pt: the model returns a dict; set output = \"KEY\" in the job spec (keys: logits)";
  std::vector<std::string> lines;
  try {
    run_search(fake, job_with_budget(plain_peak(32) + kMiB), {},
               [&](const std::string& line) { lines.push_back(line); });
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "fake.pt: the plain configuration could not run at micro-batch 4 or 8: the model returns a dict; set "
              "output = \"KEY\" in the job spec (keys: logits)");
  }
  EXPECT_EQ(fake.probes, 2);
  // Each probe's progress line says the error without the model's path,
  // which the run's first line names.
  ASSERT_EQ(lines.size(), 2u);
  for (const std::string& line : lines)
    EXPECT_NE(line.find(" error during loss: the model returns a dict; set output"), std::string::npos) << line;

  // Only the model's own path goes, not another that ends with it.
  FakeRunner other;
  other.loss_input_error = "data/fake.pt: the file is not the model";
  try {
    run_search(other, job_with_budget(plain_peak(32) + kMiB));
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "fake.pt: the plain configuration could not run at micro-batch 4 or 8: data/fake.pt: the file is not "
              "the model");
  }

  // A forward's error names its inputs' shapes, the micro-batch among them;
  // the cause after them is what must be the same.
  FakeRunner past_positions;
  past_positions.loss_input_error =
      "fake.pt: forward(input_ids: Long {micro_batch}x200) failed: index out of range in self";
  try {
    run_search(past_positions, job_with_budget(plain_peak(32) + kMiB));
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "fake.pt: the plain configuration could not run at micro-batch 4 or 8: forward(input_ids: Long 4x200) "
              "failed: index out of range in self");
  }
  EXPECT_EQ(past_positions.probes, 2);
  // Inputs packed into one tuple argument (Note [Forward arguments]) nest
  // their shapes in parentheses: they are left out the same.
  FakeRunner packed;
  packed.loss_input_error =
      "fake.pt: forward(inputs=(ids: Long {micro_batch}x200, mask: Float {micro_batch}x200)) failed: index out of "
      "range in self";
  EXPECT_THROW(run_search(packed, job_with_budget(plain_peak(32) + kMiB)), InputError);
  EXPECT_EQ(packed.probes, 2);
  // A cause that names the micro-batch differs from size to size: the walk goes on.
  FakeRunner shaped;
  shaped.loss_input_error = "fake.pt: forward(x: Float {micro_batch}x8) failed: shape '[{micro_batch}, 3]' is invalid";
  EXPECT_THROW(run_search(shaped, job_with_budget(plain_peak(32) + kMiB)), InputError);
  EXPECT_GT(shaped.probes, 2);

  // An error that is not about the input (a libtorch failure in forward) at
  // two sizes goes on up: it may be the size's.
  FakeRunner batch_norm;
  batch_norm.fails_at_or_below = 8;
  const SearchResult r = run_search(batch_norm, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_EQ(plain_probes(r), (std::vector<std::string>{"4 error", "8 error", "16 ok"}));
}

// Checkpointing recomputes, so its probe at the larger of two sizes can pass
// the trial timeout where the plain one did not. Limit 0.04 s: plain runs at
// 4 and 8 (0.018, 0.026 s; 16 takes 0.042 s), checkpointing at 4 (0.0288 s)
// but not at 8 (0.0416 s). Its effect is fitted to 4 alone with the plain
// slope: at 4 it needs 18 + 2 x 4 = 26 MiB, so micro-batch b is predicted at
// 26 + 8 (b - 4) MiB, over its true 18 + 2 b MiB above 4. Before, the
// timeout made checkpointing "not available".
TEST(DecisionTree, AStrategyProbePastTheTimeoutAtTheLargerSizeKeepsTheSmallerOne) {
  FakeRunner fake;
  fake.probe_timeout_seconds = 0.04;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_EQ(plain_probes(r), (std::vector<std::string>{"4 ok", "8 ok", "16 timeout"}));
  EXPECT_FALSE(has_note(r, "activation checkpointing: not available")) << ::testing::PrintToString(r.notes);
  EXPECT_TRUE(has_note(r,
                       "activation checkpointing: micro-batch 8: timeout: no result after 600 s; fitted to "
                       "micro-batch 4 with the plain slope"))
      << ::testing::PrintToString(r.notes);
  const TrailNode* all_blocks = node_named(r, "checkpointing (all blocks)");
  ASSERT_NE(all_blocks, nullptr);
  EXPECT_EQ(all_blocks->config.micro_batch, 32);
  EXPECT_NEAR(all_blocks->predicted_peak_bytes, static_cast<double>((26 + 8 * 28) * kMiB), 1.0);
  EXPECT_GT(all_blocks->predicted_peak_bytes, static_cast<double>(fake.true_peak(all_blocks->config)));
}

// Verification runs that time out measure nothing: with every candidate's
// run past the limit (a global batch of 32 takes 0.074 s at best, plain
// 32 x 1), the search chooses nothing and unverified_candidates holds every
// verified node, so autotune says "not verified" (exit 4), not "nothing fits".
TEST(DecisionTree, VerificationsThatTimeOutAreUnverifiedNotNothingFits) {
  FakeRunner fake;
  fake.verify_timeout_seconds = 0.05;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_FALSE(r.chosen.has_value());
  const std::vector<const TrailNode*> unverified = unverified_candidates(r);
  EXPECT_EQ(static_cast<int64_t>(unverified.size()), r.verification_trials);
  EXPECT_GE(unverified.size(), 3u);
  for (const TrailNode* node : unverified) EXPECT_EQ(node->verification->outcome, TrialOutcome::kTimeout);

  // A run out of memory is a measurement: only the accumulation candidates
  // (16 x 2 takes 0.084 s) time out; every 32 x 1 run is over the budget.
  FakeRunner mixed;
  mixed.verify_timeout_seconds = 0.08;
  mixed.extra_at_full_batch = 1024 * kMiB;
  const SearchResult m = run_search(mixed, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_FALSE(m.chosen.has_value());
  std::size_t ran_out = 0;
  for (const TrailNode& node : m.trail)
    if (node.verification && node.verification->outcome == TrialOutcome::kOutOfMemory) ++ran_out;
  EXPECT_GE(ran_out, 1u);
  const std::vector<const TrailNode*> timed_out = unverified_candidates(m);
  EXPECT_EQ(timed_out.size() + ran_out, static_cast<std::size_t>(m.verification_trials));
  EXPECT_GE(timed_out.size(), 1u);
  for (const TrailNode* node : timed_out) {
    EXPECT_EQ(node->verification->outcome, TrialOutcome::kTimeout);
    EXPECT_LT(node->config.micro_batch, 32);
  }

  // Nothing predicted to fit: nothing verified, nothing unverified.
  FakeRunner small;
  const SearchResult n = run_search(small, job_with_budget(10 * kMiB));
  EXPECT_EQ(n.verification_trials, 0);
  EXPECT_TRUE(unverified_candidates(n).empty());
}

TEST(DecisionTree, AVerifiedOutOfMemoryDropsTheCandidateAndGoesOn) {
  FakeRunner fake;
  fake.extra_at_full_batch = 20 * kMiB;  // micro-batch 32 really needs 20 MiB more
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
  const TrailNode& best = chosen(r);
  EXPECT_LT(best.config.micro_batch, 32);
  bool dropped = false;
  for (const TrailNode& node : r.trail)
    if (node.config.micro_batch == 32 && node.verification &&
        node.verification->outcome == TrialOutcome::kOutOfMemory) {
      EXPECT_NE(node.note.find("the memory model was low: ruled out from micro-batch 32 up"), std::string::npos)
          << node.note;
      dropped = true;
    }
  EXPECT_TRUE(dropped);
}

TEST(DecisionTree, AMicroBatchThatFailsBelowOneThatRunsIsNeverPlanned) {
  // Probes at 4, 8, 16; 4 raises an error (not an OOM), 8 and 16 run. With
  // room for plain micro-batch 4 only (18 + 32 + 4 = 54 MiB of 55), no node
  // may use 4 or less: 8, 16 and 32 are what is left of the divisors of 32.
  FakeRunner fake;
  fake.fails_at_or_below = 4;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(4) + 4 * kMiB + kMiB));
  ASSERT_FALSE(r.trail.empty());
  for (const TrailNode& n : r.trail) EXPECT_GE(n.config.micro_batch, 8) << n.node;
  EXPECT_EQ(r.smallest_micro_batch, 8);
  bool noted = false;
  for (const std::string& note : r.notes)
    noted |= note.rfind("micro-batch 4 cannot run (error during forward: Expected more than 1 value", 0) == 0 &&
             note.find("micro-batches of 5 or more (min_micro_batch = 5") != std::string::npos;
  EXPECT_TRUE(noted) << ::testing::PrintToString(r.notes);
  // Checkpointing at 16 x 2 fits (18 + 2 x 16 + 4 = 54 MiB) and runs.
  EXPECT_EQ(chosen(r).config.micro_batch, 16);
  EXPECT_TRUE(chosen(r).config.checkpoint.enabled());
}

TEST(DecisionTree, NoAccumulationNodeWhenOnlyTheGlobalBatchIsAValidMicroBatch) {
  FakeRunner fake;
  fake.global_batch = 3;
  JobSpec job = job_with_budget(plain_peak(3) + kMiB);
  job.global_batch = 3;
  job.min_micro_batch = 2;  // valid micro-batches: 3 only (2 does not divide 3)
  const SearchResult r = run_search(fake, job);
  for (const TrailNode& n : r.trail) {
    EXPECT_EQ(n.node.find("accumulation"), std::string::npos) << n.node;
    EXPECT_EQ(n.config.micro_batch, 3) << n.node;
  }
  bool noted = false;
  for (const std::string& note : r.notes)
    noted |= note == "micro-batch + accumulation: not possible (no valid micro-batch is 2 or less; valid: 3)";
  EXPECT_TRUE(noted) << ::testing::PrintToString(r.notes);
  EXPECT_EQ(chosen(r).node, "plain");

  // A global batch of one sample: nothing to split, and the note says that
  // (it said "no valid micro-batch is 0 or less; valid: 1").
  fake.global_batch = job.global_batch = 1;
  job.min_micro_batch = 1;
  const SearchResult one = run_search(fake, job);
  EXPECT_TRUE(has_note(one,
                       "micro-batch + accumulation: not possible (the global batch is 1 sample: no smaller "
                       "micro-batch)"))
      << ::testing::PrintToString(one.notes);
  EXPECT_EQ(chosen(one).config.micro_batch, 1);
}

TEST(DecisionTree, ConstraintsThatLeaveNoMicroBatchAreInputErrors) {
  const auto message = [](FakeRunner& fake, const JobSpec& job) {
    try {
      run_search(fake, job);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  JobSpec job = job_with_budget(plain_peak(3) + kMiB);
  job.spec_path = "job.toml";
  job.global_batch = 3;
  job.min_micro_batch = 2;
  job.max_micro_batch = 2;
  FakeRunner before;
  before.global_batch = 3;
  EXPECT_EQ(message(before, job),
            "job.toml: no micro-batch from 2 to 2 divides the global batch 3 (change "
            "min_micro_batch / max_micro_batch, or set remainder = \"last_smaller\")");
  EXPECT_EQ(before.probes, 0) << "refused before any trial";
  // Allowed by the spec (1 divides 3), but micro-batch 1 cannot run.
  job.min_micro_batch = 1;
  FakeRunner after;
  after.global_batch = 3;
  after.fails_at_or_below = 1;
  EXPECT_EQ(message(after, job),
            "job.toml: micro-batch 1 cannot run (error during forward: Expected more than 1 value "
            "per channel when training), and no micro-batch from 2 to 2 divides the global batch "
            "3 (change min_micro_batch / max_micro_batch, or set remainder = \"last_smaller\")");
  // Bounds that leave no size at all: no remainder can help, and the error
  // does not suggest one.
  job.min_micro_batch = 4;
  job.max_micro_batch.reset();
  FakeRunner above;
  above.global_batch = 3;
  EXPECT_EQ(message(above, job), "job.toml: no micro-batch is left: min_micro_batch 4 is above the global batch 3");
  job.min_micro_batch = 3;
  job.max_micro_batch = 2;
  EXPECT_EQ(message(above, job), "job.toml: no micro-batch is left: min_micro_batch 3 is above the max_micro_batch 2");
  EXPECT_EQ(above.probes, 0);
}

TEST(DecisionTree, NoBudgetIsAnInputError) {
  FakeRunner fake;
  JobSpec no_budget = job_with_budget(1);
  no_budget.budget_bytes.reset();
  EXPECT_THROW(search(no_budget, fake, SearchOptions{}, [](const std::string&) {}), InputError);
}

// The sentence after the parameters' bytes (search/fit.cpp, Note [Parameters alone]).
const std::string kNoSingleGpu =
    ": no single-GPU configuration holds them (every strategy keeps the weights on the device)";

// Parameters alone over the usable budget: nothing fits one GPU, a result
// (the command prints the ZeRO/FSDP table from its counts, exit 3), not a
// bad input. The fake's P = 1 Mi fp32 parameters hold 4 P = 4 MiB; the
// plain probes (no guard) run at 4, 8 and 16, then checkpointing all blocks
// once at 4 for the table's activations (A / 4 per sample retained).
TEST(DecisionTree, ParametersAloneOverTheBudgetIsNothingFitsOneGpu) {
  FakeRunner fake;
  const SearchResult r = run_search(fake, job_with_budget(2 * kMiB));
  EXPECT_FALSE(r.chosen);
  EXPECT_TRUE(r.trail.empty());
  EXPECT_TRUE(r.least_memory_failure.empty());
  EXPECT_EQ(r.parameters_alone,
            "the parameters alone (4.00 MiB) exceed the usable budget (2.00 MiB, after 0 % headroom)" + kNoSingleGpu);
  ASSERT_EQ(fake.probes, 4);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r.probes[i].config, to_string(with_micro_batch_of(int64_t{4} << i)));
  EXPECT_EQ(r.probes[3].config, to_string(with_micro_batch_of(4, Precision::kFp32, false, true)));
  EXPECT_EQ(r.probes[3].retained_activation_bytes, 4 * fake.activation_per_sample / 4);
  EXPECT_EQ(r.notes.back(),
            "activation checkpointing (all blocks) probed at micro-batch 4 for the ZeRO/FSDP table's activations "
            "only: 8.00 MiB retained");
  EXPECT_EQ(fake.verifications, 0);
  // What the ZeRO table is computed from: the measured counts and bytes,
  // and plain's line (peak(b) = 16 P + 2 MiB + A b).
  EXPECT_EQ(r.parameter_count, fake.parameters);
  EXPECT_EQ(r.static_memory.parameter_bytes, 4 * fake.parameters);
  EXPECT_EQ(r.static_memory.gradient_bytes, 4 * fake.parameters);
  EXPECT_NEAR(r.baseline_peak.intercept, 16.0 * static_cast<double>(fake.parameters) + 2 * kMiB, 1.0);
  EXPECT_NEAR(r.baseline_peak.slope, static_cast<double>(fake.activation_per_sample), 1.0);
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{4, 8, 16}));
}

// bf16 allowed: the cheapest storage is bf16 parameters, 2 P = 2 MiB
// (recipes/zero_estimate.h: weights 2 bytes under bf16_params). Below
// that, nothing fits one GPU, and the sentence names both sizes.
TEST(DecisionTree, ParametersAloneCountTheCheapestStorageTheJobAllows) {
  FakeRunner fake;
  fake.bf16_parameters_stored = true;
  JobSpec job = job_with_budget(3 * kMiB / 2);
  job.allow_bf16 = true;
  const SearchResult r = run_search(fake, job);
  EXPECT_FALSE(r.chosen);
  EXPECT_EQ(r.parameters_alone,
            "the parameters alone (2.00 MiB as bf16 parameters, the least storage the job allows; 4.00 MiB measured) "
            "exceed the usable budget (1.50 MiB, after 0 % headroom)" +
                kNoSingleGpu);
  EXPECT_EQ(fake.probes, 4) << "plain at 4, 8, 16 and checkpointing at 4";
}

// A budget between the bf16 weights (2 MiB) and the fp32 ones (4 MiB):
// not "nothing fits" before bf16 parameters were tried. Autocast keeps the
// fp32 weights, so bf16 is probed as bf16 parameters from the start (no
// autocast probe) and the walk decides: bf16 parameters need their
// gradients too (2 P + 2 P = 4 MiB before any state), so nothing fits,
// predicted, the least at offload + bf16 parameters + checkpointing:
// 4 MiB + 2 MiB + A / 4 / 2 = 7 MiB at micro-batch 1.
TEST(DecisionTree, ABudgetBetweenTheBf16AndTheFp32WeightsTriesBf16Parameters) {
  FakeRunner fake;
  fake.bf16_parameters_stored = true;
  JobSpec job = job_with_budget(3 * kMiB);
  job.allow_bf16 = true;
  const SearchResult r = run_search(fake, job);
  EXPECT_FALSE(r.chosen);
  EXPECT_TRUE(r.parameters_alone.empty()) << r.parameters_alone;
  int bf16_parameter_probes = 0;
  for (const ProbeReport& p : r.probes) {
    EXPECT_FALSE(autocast_probe(p)) << "no autocast probe: " << p.config;
    if (p.config.find("precision=bf16_params") != std::string::npos) ++bf16_parameter_probes;
  }
  EXPECT_GT(bf16_parameter_probes, 0);
  EXPECT_NE(node_named(r, "bf16 parameters"), nullptr);
  EXPECT_NE(node_named(r, "optimizer offload + bf16 parameters"), nullptr);
  EXPECT_TRUE(std::any_of(r.notes.begin(), r.notes.end(), [](const std::string& note) {
    return note.rfind(
               "the parameters alone (4.00 MiB measured) exceed the usable budget (3.00 MiB); as bf16 "
               "parameters they take 2.00 MiB, so bf16 is tried as bf16 parameters",
               0) == 0;
  })) << "the note says why";
  EXPECT_GT(r.smallest_predicted_peak_bytes, 3.0 * kMiB);
  EXPECT_EQ(fake.true_peak(with_micro_batch_of(1, Precision::kBf16Params, true, true)), 7 * kMiB)
      << "the least a configuration needs, by the fake's formula";
  // Without bf16 the same budget is below the parameters alone.
  FakeRunner fp32;
  fp32.bf16_parameters_stored = true;
  job.allow_bf16 = false;
  EXPECT_EQ(run_search(fp32, job).parameters_alone,
            "the parameters alone (4.00 MiB) exceed the usable budget (3.00 MiB, after 0 % headroom)" + kNoSingleGpu);
}

// A budget above the fp32 weights (4 MiB) but below them with their fp32
// gradients (4 + 4 MiB), and above both in bf16 (2 + 2 MiB): autocast, its
// fp32 weights and gradients on the device, fits in no configuration, so
// bf16 is probed as bf16 parameters from the start (Note [Parameters
// alone]) and its nodes are bf16 parameters' (which need 9 MiB at least by
// the fake's formula, so none fits here: the walk says so).
// A search of the fake, its bf16 parameters stored in bf16, bf16 allowed.
SearchResult search_allowing_bf16(int64_t budget) {
  FakeRunner fake;
  fake.bf16_parameters_stored = true;
  JobSpec job = job_with_budget(budget);
  job.allow_bf16 = true;
  return run_search(fake, job);
}

TEST(DecisionTree, ABudgetBelowTheFp32WeightsAndGradientsTriesBf16Parameters) {
  const SearchResult r = search_allowing_bf16(15 * kMiB / 2);
  EXPECT_TRUE(r.parameters_alone.empty()) << r.parameters_alone;
  for (const ProbeReport& p : r.probes) EXPECT_FALSE(autocast_probe(p)) << "no autocast probe: " << p.config;
  EXPECT_TRUE(std::any_of(r.notes.begin(), r.notes.end(), [](const std::string& note) {
    return note.rfind(
               "the parameters and their gradients (4.00 MiB + 4.00 MiB measured) exceed the usable budget "
               "(7.50 MiB); as bf16 parameters they take 2.00 MiB + 2.00 MiB, so bf16 is tried as bf16 parameters",
               0) == 0;
  })) << ::testing::PrintToString(r.notes);
  EXPECT_NE(node_named(r, "optimizer offload + bf16 parameters + checkpointing"), nullptr);
  EXPECT_EQ(node_named(r, "optimizer offload + bf16 + checkpointing"), nullptr);
  // Above the fp32 weights and gradients, bf16 keeps its autocast form.
  const SearchResult roomy = search_allowing_bf16(9 * kMiB);
  EXPECT_TRUE(std::any_of(roomy.probes.begin(), roomy.probes.end(), autocast_probe));
}

// A job on bf16 autocast whose fp32 weights exceed the budget and whose
// bf16 ones do not: its precision becomes bf16 parameters (as the autocast
// fallback does, Note [bf16 fallback]) and plain is probed again so.
TEST(DecisionTree, ABf16AutocastJobOverTheBudgetInFp32RunsAsBf16Parameters) {
  FakeRunner fake;
  fake.bf16_parameters_stored = true;
  JobSpec job = job_with_budget(3 * kMiB);
  job.precision = "bf16";
  const SearchResult r = run_search(fake, job);
  EXPECT_TRUE(r.parameters_alone.empty()) << r.parameters_alone;
  ASSERT_GE(r.probes.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i)  // plain at 4, 8, 16 in autocast, then again as bf16 parameters
    EXPECT_EQ(r.probes[i].config,
              to_string(with_micro_batch_of(int64_t{4} << (i % 3), i < 3 ? Precision::kBf16 : Precision::kBf16Params)));
  EXPECT_EQ(r.static_memory.parameter_bytes, 2 * fake.parameters);
  EXPECT_FALSE(r.chosen) << "4 MiB of weights and gradients before any state";
}

// Weights larger than even the probes' RAM guard: every plain probe runs
// out of memory while loading, so no parameter bytes are measured; nothing
// fits one GPU, and the sentence names the cause. No count: the command
// prints no ZeRO table (autotune_report_test). With a meta device the
// count comes from its run of plain (meta holds no memory).
TEST(DecisionTree, WeightsThatDoNotLoadAreOverTheBudget) {
  struct WeightsDoNotLoad : FakeRunner {
    ProbeReport probe(const TrainingConfig& c) override {
      ++probes;
      ProbeReport r;
      r.config = to_string(c);
      r.micro_batch = c.micro_batch;
      r.outcome = TrialOutcome::kOutOfMemory;
      r.phase_at_failure = Phase::kLoad;
      r.message = "oomtune budget: tried to allocate 4.83 KiB; 0 B of 3.80 KiB budget in use";
      return r;
    }
  } fake;
  const SearchResult r = run_search(fake, job_with_budget(1024));
  EXPECT_FALSE(r.chosen);
  EXPECT_EQ(r.parameters_alone,
            "loading the weights ran out of memory (oomtune budget: tried to allocate 4.83 KiB; 0 B of 3.80 KiB "
            "budget in use): the parameters alone exceed the usable budget (1.00 KiB, after 0 % headroom)" +
                kNoSingleGpu);
  EXPECT_EQ(r.parameter_count, 0) << "unknown";
  EXPECT_EQ(r.smallest_micro_batch, 4) << "the first plain probe's";
  EXPECT_EQ(fake.probes, 1) << "the weights load alike at every micro-batch: one probe says so";
  EXPECT_EQ(fake.verifications, 0);

  WeightsDoNotLoad with_meta;
  with_meta.meta = true;
  SearchOptions options;
  options.memory_from = MemorySource::kMeta;
  const SearchResult m = run_search(with_meta, job_with_budget(1024), options);
  EXPECT_EQ(m.parameters_alone, r.parameters_alone);
  EXPECT_EQ(m.parameter_count, with_meta.parameters) << "counted by the meta run of plain";
  EXPECT_EQ(m.static_memory.parameter_bytes, 4 * with_meta.parameters);
  // The meta runs that place the timing probes (Note [Timing probes on
  // meta]) walk plain down to the smallest micro-batch first; none is a
  // real probe.
  EXPECT_EQ(with_meta.probes, 1);
  EXPECT_GE(with_meta.meta_runs, 1);
}

TEST(DecisionTree, ValidMicroBatchesKeepTheGlobalBatchExact) {
  JobSpec job = job_with_budget(kMiB);
  job.global_batch = 12;
  EXPECT_EQ(valid_micro_batches(job), (std::vector<int64_t>{1, 2, 3, 4, 6, 12}));
  job.min_micro_batch = 3;
  job.max_micro_batch = 6;
  EXPECT_EQ(valid_micro_batches(job), (std::vector<int64_t>{3, 4, 6}));
  job.allow_remainder = true;
  EXPECT_EQ(valid_micro_batches(job), (std::vector<int64_t>{3, 4, 5, 6}));
}

// Note [An error that comes with the size] (search/fit.cpp): an error
// that is not about memory at a micro-batch above every one that ran (a
// CUDA kernel's grid past its limit) keeps the search below it. The fake
// fails at `above` and larger with "CUDA error: invalid configuration
// argument"; the budget fits plain at the global batch, 32.

// The largest micro-batch of a node the last walk placed: the trail keeps
// the nodes whose verification failed, at the sizes they failed at, first.
int64_t largest_node_micro_batch(const SearchResult& r) {
  int64_t largest = 0;
  for (const TrailNode& node : r.trail)
    if (!node.verification || node.verification->outcome == TrialOutcome::kOk)
      largest = std::max(largest, node.config.micro_batch);
  return largest;
}

// The plain probes (4, 8, 16) ran; plain 32 x 1, the first candidate, errs
// in its verification. Before, three of the four verifications went to
// nodes at 32 (plain, its first block checkpointed, 8-bit AdamW), the same
// error each time. Now that one run lowers the ceiling to 16, the largest
// size that ran, and the tree is walked again: the three other runs go to
// candidates at 16 x 2, and plain 16 x 2 is chosen. No configuration runs
// twice.
TEST(DecisionTree, AVerificationThatFailsForItsSizeWalksTheTreeAgainBelowIt) {
  FakeRunner fake;
  fake.fails_at_or_above = 32;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_EQ(plain_probes(r), (std::vector<std::string>{"4 ok", "8 ok", "16 ok"}));
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.node, "micro-batch + accumulation");
  EXPECT_EQ(best.config.micro_batch, 16);
  EXPECT_EQ(best.config.accumulation_steps, 2);
  EXPECT_EQ(largest_node_micro_batch(r), 16);
  EXPECT_EQ(r.largest_micro_batch, 16);
  ASSERT_FALSE(r.trail.empty());  // the failed run stays in the trail, first
  EXPECT_EQ(r.trail.front().node, "plain");
  EXPECT_EQ(r.trail.front().config.micro_batch, 32);
  ASSERT_TRUE(r.trail.front().verification.has_value());
  EXPECT_EQ(r.trail.front().verification->outcome, TrialOutcome::kError);
  EXPECT_EQ(r.verification_trials, 4);  // plain 32 x 1, then the three slots below it
  EXPECT_EQ(fake.verifications, 4);
  EXPECT_TRUE(has_note(r,
                       "plain: verified run: error after 0 steps (CUDA error: invalid configuration "
                       "argument); dropped"));
  EXPECT_TRUE(has_note(r,
                       "micro-batch 32 cannot run (error during forward: CUDA error: invalid "
                       "configuration argument) where 16 ran: an error that comes with the size, not with "
                       "memory (a kernel's launch or indexing limit), so the search uses micro-batches of "
                       "16 or less (max_micro_batch = 16 in the job spec skips that run)"));
}

// Plain errs at 16 in its probes, above 4 and 8 that ran: the walk up ends
// there and every node keeps to 15 or less (of the divisors of 32: 8), so
// no verification is spent on a size that cannot run. Before, the nodes
// stayed at 32 and 16 x 2, six verifications all failed, and nothing was
// chosen.
TEST(DecisionTree, APlainProbeThatFailsForItsSizeKeepsEveryNodeBelowIt) {
  FakeRunner fake;
  fake.fails_at_or_above = 16;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_EQ(plain_probes(r), (std::vector<std::string>{"4 ok", "8 ok", "16 error"}));
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(largest_node_micro_batch(r), 8);
  EXPECT_EQ(r.largest_micro_batch, 8);  // of the divisors of 32, the largest at 15 or less
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.config.micro_batch, 8);
  EXPECT_EQ(best.config.accumulation_steps, 4);
  for (const TrailNode& node : r.trail) {
    if (node.verification) {
      EXPECT_EQ(node.verification->outcome, TrialOutcome::kOk) << node.node;
    }
  }
  EXPECT_TRUE(has_note(r,
                       "micro-batch 16 cannot run (error during forward: CUDA error: invalid "
                       "configuration argument) where 8 ran: an error that comes with the size, not with "
                       "memory (a kernel's launch or indexing limit), so the search uses micro-batches of "
                       "15 or less (max_micro_batch = 15 in the job spec skips that run)"));
}

// Plain errs at 8, above 4, the one size that ran: the walk up stops there
// (16 is not probed) and goes down for the lines' second point, 2, as after
// an out-of-memory; the search stays at 7 or less.
TEST(DecisionTree, APlainProbeThatFailsForItsSizeAfterOneSizeRanStepsDownForTheSecondPoint) {
  FakeRunner fake;
  fake.fails_at_or_above = 8;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB));
  EXPECT_EQ(plain_probes(r), (std::vector<std::string>{"4 ok", "8 error", "2 ok"}));
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{2, 4}));
  EXPECT_NEAR(r.baseline_peak.slope, 8.0 * kMiB, 1.0);  // two points: the fake's own slope
  EXPECT_EQ(largest_node_micro_batch(r), 4);
  EXPECT_EQ(r.largest_micro_batch, 4);
  EXPECT_EQ(chosen(r).config.micro_batch, 4);
  EXPECT_TRUE(has_note(r,
                       "micro-batch 8 cannot run (error during forward: CUDA error: invalid "
                       "configuration argument) where 4 ran"));
}

// The lowered ceiling can leave no micro-batch: global batch 12 and
// min_micro_batch 5 allow 6 and 12; 5 runs, 6 errs, and no divisor of 12
// lies from 5 to 5. That is the job's constraints, said as a bad input
// naming the size that failed.
TEST(DecisionTree, ASizeErrorThatLeavesNoMicroBatchIsAnInputError) {
  FakeRunner fake;
  fake.fails_at_or_above = 6;
  fake.global_batch = 12;
  JobSpec job = job_with_budget(plain_peak(32) + kMiB);
  job.global_batch = 12;
  job.min_micro_batch = 5;
  try {
    run_search(fake, job);
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "fake.pt: micro-batch 6 cannot run (error during forward: CUDA error: invalid configuration argument), "
              "and no micro-batch from 5 to 5 divides the global batch 12 (change min_micro_batch / max_micro_batch, "
              "or set remainder = \"last_smaller\")");
  }
  EXPECT_EQ(fake.probes, 2);  // 5 and 6
}

// walk.cpp, Note [Verifications that run out of memory]: every
// verification's later steps hold 30 MiB more than any probe or prediction
// (verification_growth), under a budget of 83 MiB. The first walk's six
// runs all run out (each node sits at the largest size predicted to fit:
// 32 x 1 to 4 x 8, 54 to 82 MiB predicted). Before, nothing was chosen
// and the report said nothing fits; now the tree is walked again with each
// of those nodes one size down, and three of them run within the budget:
// 8-bit AdamW + checkpointing 16 x 2 is the fastest (48 + 30 = 78 MiB).
TEST(DecisionTree, VerificationsOverTheBudgetWalkTheTreeAgainOneSizeDown) {
  FakeRunner fake;
  fake.verification_growth = 30 * kMiB;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(8) + kMiB));
  const TrailNode& best = chosen(r);
  EXPECT_EQ(best.node, "8-bit AdamW + checkpointing");
  EXPECT_EQ(best.config.micro_batch, 16);
  EXPECT_EQ(best.config.accumulation_steps, 2);
  EXPECT_EQ(best.verification->peak_bytes, 78 * kMiB);
  EXPECT_EQ(r.verification_trials, 9);  // 6, then max_verifications more
  EXPECT_EQ(fake.verifications, 9);
  // The runs over the budget stay in the trail, first, each at the size it
  // failed at; the second walk places that configuration below it.
  const std::vector<const TrailNode*> ran_out = ran_out_candidates(r);
  ASSERT_EQ(ran_out.size(), 6u);
  ASSERT_GT(r.trail.size(), ran_out.size());
  for (std::size_t k = 0; k < ran_out.size(); ++k) {
    EXPECT_EQ(ran_out[k], &r.trail[k]);
    EXPECT_EQ(ran_out[k]->verification->outcome, TrialOutcome::kOutOfMemory);
    for (std::size_t i = ran_out.size(); i < r.trail.size(); ++i)
      if (r.trail[i].node == ran_out[k]->node) {
        EXPECT_LT(r.trail[i].config.micro_batch, ran_out[k]->config.micro_batch) << r.trail[i].node;
      }
  }
  EXPECT_EQ(r.trail.front().node, "checkpointing (all blocks)");
  EXPECT_EQ(r.trail.front().config.micro_batch, 32);
}

// Every verification runs out (1 GiB more than predicted): the first
// walk's six runs, then max_verifications (3) in the walk again, no more.
// Nothing is chosen; the candidates that ran out are said as such, with
// the ones predicted to fit that never ran (autotune: "nothing verified to
// fit", exit 4, not "nothing fits").
TEST(DecisionTree, VerificationsThatAllRunOutStopAtTheExtraRuns) {
  FakeRunner fake;
  fake.verification_growth = 1024 * kMiB;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(8) + kMiB));
  EXPECT_FALSE(r.chosen.has_value());
  EXPECT_EQ(r.verification_trials, 9);
  EXPECT_EQ(ran_out_candidates(r).size(), 9u);
  EXPECT_TRUE(unverified_candidates(r).empty());
  EXPECT_GT(candidates_not_run(r), 0u);
  for (const TrailNode& node : r.trail) {  // the rows of those not run say so (their note was empty)
    if (node.predicted_fit && !node.verification) {
      EXPECT_EQ(node.note, "predicted to fit; not verified (verification budget spent)") << node.node;
    }
  }

  // With one verification, the walk again gets one run.
  FakeRunner one;
  one.verification_growth = 1024 * kMiB;
  SearchOptions options;
  options.max_verifications = 1;
  const SearchResult o = run_search(one, job_with_budget(plain_peak(8) + kMiB), options);
  EXPECT_FALSE(o.chosen.has_value());
  EXPECT_EQ(o.verification_trials, 1 + options.max_extra_verifications + 1);
}

}  // namespace
}  // namespace oomtune
