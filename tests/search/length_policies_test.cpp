// The length replay of a probe (report/length_policies.h) on a step made by
// hand, so every reserved byte follows from the caching allocator's rules
// (allocsim/caching_allocator_sim.h, PyTorch's CUDACachingAllocator.cpp):
// 20 MiB of weights alive across the step (one 20 MiB segment, full) and
// one activation of T MiB made and freed in the step (T >= 10 MiB: its own
// segment rounded to 2 MiB). Lengths 20 or 30 tokens, from a histogram.
// The golden file tests/search/golden/length_policies.txt was reviewed line
// by line against the numbers worked out below; regenerate with
// OOMTUNE_UPDATE_GOLDEN=1 and review again before committing.

#include <filesystem>

#include <gtest/gtest.h>

#include "common/byte_size.h"
#include "common/error.h"
#include "report/length_policies.h"
#include "report/sequence_fit.h"
#include "support/golden_file.h"

namespace oomtune {
namespace {

constexpr std::uint64_t kSeed = 2;  // draws 20 first (SplitMix64 of 2: an even first output)

allocsim::LengthModel activation_step() {
  auto sample = [](int64_t t) {
    allocsim::LengthSample s;
    s.length = t;
    s.events = {allocsim::alloc_event(1, t * kMiB), allocsim::free_event(1)};
    return s;
  };
  return allocsim::LengthModel::fit({sample(20), sample(30)});
}

LengthPolicies example(int64_t steps, std::optional<int64_t> budget = std::nullopt) {
  const LengthDistribution lengths = LengthDistribution::histogram({20, 30});
  return replay_length_policies(activation_step(), {20 * kMiB}, lengths, describe_lengths(lengths, "lengths.txt"),
                                kSeed, steps, 8, budget);
}

TEST(LengthPolicies, EachPolicyReservesWhatTheAllocatorRulesGive) {
  // The precondition of the numbers below: the run draws 20 before any 30
  // (a 30 MiB block cached first would serve a later 20 MiB by splitting).
  const std::vector<int64_t> drawn = draw_lengths(LengthDistribution::histogram({20, 30}), 100, kSeed);
  ASSERT_EQ(drawn.front(), 20);
  ASSERT_NE(std::find(drawn.begin(), drawn.end(), 30), drawn.end());

  const LengthPolicies p = example(100);
  ASSERT_EQ(p.policies.size(), 5u);
  const auto reserved = [&](std::size_t i) { return p.policies[i].run.totals.peak_reserved_bytes; };
  // As drawn: the 20 MiB block cannot hold 30, a second segment: 20 + 20 + 30.
  EXPECT_EQ(p.policies[0].name, "as drawn");
  EXPECT_EQ(reserved(0), 70 * kMiB);
  EXPECT_EQ(p.policies[0].run.totals.peak_allocated_bytes, 50 * kMiB);
  // expandable_segments: the weights fill the first 20 MiB page; 20 maps a
  // second page; 30 then needs 30 MiB from offset 20: a third page.
  EXPECT_EQ(p.policies[1].name, "expandable_segments");
  EXPECT_EQ(reserved(1), 60 * kMiB);
  // Padded to a multiple of 64 and 256: one block of 64 or 256 MiB.
  EXPECT_EQ(p.policies[2].name, "padded to a multiple of 64");
  EXPECT_EQ(reserved(2), (20 + 64) * kMiB);
  EXPECT_EQ(reserved(3), (20 + 256) * kMiB);
  // A power of two: every length becomes 32, one 32 MiB block.
  EXPECT_EQ(p.policies[4].name, "padded to a power of two");
  EXPECT_EQ(reserved(4), (20 + 32) * kMiB);
  int64_t drawn_tokens = 0;
  for (int64_t t : drawn) drawn_tokens += t;
  EXPECT_DOUBLE_EQ(p.policies[4].padded_tokens_ratio, 32.0 * 100 / static_cast<double>(drawn_tokens));
  EXPECT_EQ(p.policies[p.recommended].name, "padded to a power of two");
  EXPECT_EQ(policy_change(p.policies[p.recommended]), "pad each batch to the next power of two");
  EXPECT_EQ(policy_change(p.policies[1]), "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
  EXPECT_EQ(policy_change(p.policies[2]),
            "pad each batch to a multiple of 64 tokens (DataCollatorWithPadding(..., pad_to_multiple_of=64))");
}

// Under a 64 MiB budget as drawn flushes the cache to fit the 30 MiB
// segment (20 + 20 + 30 > 64) and 256 runs out: the recommendation is one
// that does neither.
TEST(LengthPolicies, UnderABudgetRetriesAndOutOfMemoryAreCounted) {
  const LengthPolicies p = example(100, 64 * kMiB);
  EXPECT_GT(p.policies[0].run.totals.num_alloc_retries, 0);
  EXPECT_EQ(p.policies[0].run.totals.num_ooms, 0);
  EXPECT_GT(p.policies[3].run.totals.num_ooms, 0);
  const allocsim::LengthPolicy& best = p.policies[p.recommended];
  EXPECT_EQ(best.run.totals.num_alloc_retries, 0);
  EXPECT_EQ(best.run.totals.num_ooms, 0);
  EXPECT_EQ(best.name, "padded to a power of two");
}

TEST(LengthPolicies, TextMatchesTheReviewedGoldenFile) {
  const std::string text = render_length_policies_text(example(100));
  testing::expect_golden_file(std::filesystem::path(OOMTUNE_SOURCE_DIR) / "tests/search/golden/length_policies.txt",
                              text);
}

TEST(LengthPolicies, JsonHasEveryPolicyAndEachStepsReserved) {
  const nlohmann::json j = length_policies_json(example(12));
  EXPECT_EQ(j.at("distribution"), "the histogram in lengths.txt (2 lengths, 20 to 30 tokens)");
  EXPECT_EQ(j.at("steps"), 12);
  EXPECT_EQ(j.at("seed"), kSeed);
  EXPECT_EQ(j.at("micro_batch"), 8);
  EXPECT_TRUE(j.at("budget_bytes").is_null());
  ASSERT_EQ(j.at("policies").size(), 5u);
  EXPECT_EQ(j.at("policies").at(2).at("pad_multiple"), 64);
  EXPECT_EQ(j.at("policies").at(0).at("reserved_bytes_after_each_step").size(), 12u);
  EXPECT_EQ(j.at("recommended"), "padded to a power of two");
}

TEST(LengthPolicies, NoStepsIsAnInputError) { EXPECT_THROW(example(0), InputError); }

}  // namespace
}  // namespace oomtune
