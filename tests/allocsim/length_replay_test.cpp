// replay_lengths and the length policies (allocsim/length_replay.h) on steps
// made by hand, with the allocator's answers worked out in the comments from
// the rules in allocsim/caching_allocator_sim.h (PyTorch's
// CUDACachingAllocator.cpp).

#include "allocsim/length_replay.h"

#include <gtest/gtest.h>

#include "common/byte_size.h"
#include "common/error.h"

namespace oomtune::allocsim {
namespace {

// One activation of T MiB, freed within the step (T >= 10: its own segment
// of T MiB rounded to 2 MiB, get_allocation_size).
LengthModel activation_step() {
  auto sample = [](int64_t t) {
    LengthSample s;
    s.length = t;
    s.events = {alloc_event(1, t * kMiB), free_event(1)};
    return s;
  };
  return LengthModel::fit({sample(20), sample(30)});
}

TEST(LengthReplay, VaryingLengthsReserveMoreThanAFixedOne) {
  const LengthModel step = activation_step();
  // 20, 30, 20, 30: the 30 MiB request finds only the cached 20 MiB block
  // and cudaMallocs a second segment; from then on each length reuses its
  // own block: 50 MiB reserved for a 30 MiB peak.
  const LengthRun varying = replay_lengths(step, {}, {20, 30, 20, 30}, {});
  EXPECT_EQ(varying.totals.peak_reserved_bytes, 50 * kMiB);
  EXPECT_EQ(varying.totals.peak_allocated_bytes, 30 * kMiB);
  EXPECT_DOUBLE_EQ(varying.reserved_over_allocated(), 50.0 / 30.0);
  ASSERT_EQ(varying.steps.size(), 4u);
  EXPECT_EQ(varying.steps[0].device_allocs, 1);
  EXPECT_EQ(varying.steps[1].device_allocs, 1);
  EXPECT_EQ(varying.steps[2].device_allocs, 0);
  EXPECT_EQ(varying.steps[1].reserved_bytes, 50 * kMiB);
  // One length: one block, reused every step.
  const LengthRun fixed = replay_lengths(step, {}, {30, 30, 30, 30}, {});
  EXPECT_EQ(fixed.totals.peak_reserved_bytes, 30 * kMiB);
  EXPECT_DOUBLE_EQ(fixed.reserved_over_allocated(), 1.0);
}

TEST(LengthReplay, PoliciesAreComparedOnTheSameLengths) {
  const std::vector<LengthPolicy> policies = compare_length_policies(activation_step(), {}, {20, 30, 20, 30}, {}, {32});
  ASSERT_EQ(policies.size(), 4u);
  EXPECT_EQ(policies[0].name, "as drawn");
  EXPECT_EQ(policies[0].run.totals.peak_reserved_bytes, 50 * kMiB);
  // expandable_segments: one segment grown in 20 MiB pages of the large
  // pool; the 30 MiB request extends the free 20 MiB at its end by one page
  // (40 MiB mapped), and both lengths then fit in it.
  EXPECT_EQ(policies[1].name, "expandable_segments");
  EXPECT_EQ(policies[1].run.totals.peak_reserved_bytes, 40 * kMiB);
  // Padded to 32: every step asks for 32 MiB, one block; 128 tokens run
  // for 100 drawn.
  EXPECT_EQ(policies[2].name, "padded to a multiple of 32");
  EXPECT_EQ(policies[2].run.totals.peak_reserved_bytes, 32 * kMiB);
  EXPECT_DOUBLE_EQ(policies[2].padded_tokens_ratio, 1.28);
  EXPECT_EQ(policies[3].name, "padded to a power of two");
  EXPECT_EQ(policies[3].run.totals.peak_reserved_bytes, 32 * kMiB);
  // The least reserved; of the two at 32 MiB the same padding, so the
  // earlier row.
  EXPECT_EQ(recommended_policy(policies).name, "padded to a multiple of 32");
}

TEST(LengthReplay, GradientsCarriedToTheNextStepAreFreedThere) {
  // Each step frees the previous step's 4 MiB gradient, makes an activation
  // of T MiB and a new gradient it keeps.
  auto sample = [](int64_t t) {
    LengthSample s;
    s.length = t;
    s.events = {free_event(99), alloc_event(1, t * kMiB), alloc_event(2, 4 * kMiB), free_event(1)};
    return s;
  };
  const LengthModel step = LengthModel::fit({sample(20), sample(40)});
  const LengthRun run = replay_lengths(step, {100 * kMiB}, {20, 20, 20, 20, 20}, {});
  // Persistent 100 MiB + one live gradient, not five.
  EXPECT_EQ(run.totals.allocated_bytes, 104 * kMiB);
  for (const LengthStep& s : run.steps) EXPECT_EQ(s.peak_allocated_bytes, 124 * kMiB);
  EXPECT_EQ(run.steps[4].reserved_bytes, run.steps[1].reserved_bytes);
}

TEST(LengthReplay, AStepThatKeepsWhatItMakesIsNotSteady) {
  auto sample = [](int64_t t) {
    LengthSample s;
    s.length = t;
    s.events = {alloc_event(1, t * kMiB)};
    return s;
  };
  const LengthModel step = LengthModel::fit({sample(20), sample(40)});
  EXPECT_THROW(replay_lengths(step, {}, {20, 20}, {}), InputError);
  EXPECT_NO_THROW(replay_lengths(step, {}, {20}, {}));
}

// Under a budget a policy that runs out of memory or flushes the cache is
// recommended only where every one does, whatever it reserves.
TEST(LengthReplay, UnderABudgetTheRecommendationNeverRunsOutOrRetries) {
  auto policy = [](const char* name, int64_t reserved_mib, int64_t ooms, int64_t retries, double padding) {
    LengthPolicy p;
    p.name = name;
    p.run.totals.peak_reserved_bytes = reserved_mib * kMiB;
    p.run.totals.num_ooms = ooms;
    p.run.totals.num_alloc_retries = retries;
    p.padded_tokens_ratio = padding;
    return p;
  };
  std::vector<LengthPolicy> policies = {policy("as drawn", 30, 1, 0, 1.0), policy("expandable_segments", 35, 0, 2, 1.0),
                                        policy("padded to 64", 39, 0, 0, 1.1), policy("power of two", 38, 0, 0, 1.3)};
  // 39 MiB is within 1 % of 38? No (2.6 %): the least reserved of those left.
  EXPECT_EQ(recommended_policy(policies).name, "power of two");
  policies[2].run.totals.peak_reserved_bytes = 38 * kMiB + kMiB / 4;  // within 1 %: the least padding
  EXPECT_EQ(recommended_policy(policies).name, "padded to 64");
  // Every one that does not run out retries: the least reserved of them.
  policies[2].run.totals.num_alloc_retries = policies[3].run.totals.num_alloc_retries = 1;
  EXPECT_EQ(recommended_policy(policies).name, "expandable_segments");
  // Every one runs out: the least reserved.
  for (LengthPolicy& p : policies) p.run.totals.num_ooms = 1;
  EXPECT_EQ(recommended_policy(policies).name, "as drawn");
}

TEST(LengthReplay, AnOutOfMemoryStepIsMarked) {
  SimOptions options;
  options.budget_bytes = 40 * kMiB;
  const LengthRun run = replay_lengths(activation_step(), {}, {20, 30}, options);
  // 20 MiB cached + a 30 MiB segment pass 40 MiB; the flush frees the cached
  // 20 MiB and the retry fits.
  EXPECT_FALSE(run.steps[1].oom);
  EXPECT_EQ(run.steps[1].alloc_retries, 1);
  const LengthRun too_long = replay_lengths(activation_step(), {}, {20, 50}, options);
  EXPECT_TRUE(too_long.steps[1].oom);
}

}  // namespace
}  // namespace oomtune::allocsim
