// The size rules of allocsim/allocator_rules.h against values worked out by
// hand from c10/cuda/CUDACachingAllocator.cpp.

#include "allocsim/allocator_rules.h"

#include <gtest/gtest.h>

#include "common/byte_size.h"

namespace oomtune::alloc_rules {
namespace {

constexpr int64_t kKiB = int64_t{1} << 10;

AllocatorConfig with_divisions(int64_t divisions) {
  AllocatorConfig config;
  config.roundup_power2_divisions.fill(divisions);
  return config;
}

TEST(AllocatorRules, ConstantsArePyTorchs) {
  EXPECT_EQ(kMinBlockSize, 512);
  EXPECT_EQ(kSmallSize, 1048576);
  EXPECT_EQ(kSmallBuffer, 2097152);
  EXPECT_EQ(kLargeBuffer, 20971520);
  EXPECT_EQ(kMinLargeAlloc, 10485760);
  EXPECT_EQ(kRoundLarge, 2097152);
  EXPECT_EQ(kExpandablePageSmall, 2 * kMiB);
  EXPECT_EQ(kExpandablePageLarge, 20 * kMiB);
}

TEST(AllocatorRules, ConfigDefaultsArePyTorchs) {
  const AllocatorConfig config;
  EXPECT_EQ(config.max_split_size, kNoMaxSplitSize);
  EXPECT_EQ(config.max_non_split_rounding_size, 20 * kMiB);
  for (int64_t divisions : config.roundup_power2_divisions) EXPECT_EQ(divisions, 0);
  EXPECT_EQ(config.garbage_collection_threshold, 0.0);
  EXPECT_FALSE(config.expandable_segments);
}

TEST(AllocatorRules, RoundSizeIsMultipleOf512AndAtLeast512) {
  EXPECT_EQ(round_size(0), 512);
  EXPECT_EQ(round_size(1), 512);
  EXPECT_EQ(round_size(512), 512);
  EXPECT_EQ(round_size(513), 1024);
  EXPECT_EQ(round_size(9961472), 9961472);  // 9.5 MiB, the fragmentation fixture's tensors
  // The config overload without divisions is the same.
  EXPECT_EQ(round_size(513, AllocatorConfig{}), 1024);
}

TEST(AllocatorRules, RoundupPower2NextDivision) {
  // PyTorch's own example: 1200 with 4 divisions of [1024, 2048) -> 1280.
  EXPECT_EQ(roundup_power2_next_division(1200, 4), 1280);
  EXPECT_EQ(roundup_power2_next_division(1024, 4), 1024);  // powers of two stay
  EXPECT_EQ(roundup_power2_next_division(1280, 4), 1280);  // exact division stays
  // 5 MiB + 1 with 4 divisions of [4, 8) MiB: steps 4, 5, 6, 7 -> 6 MiB.
  EXPECT_EQ(roundup_power2_next_division(5 * kMiB + 1, 4), 6 * kMiB);
  // More divisions than the interval has bytes: next power of two.
  EXPECT_EQ(roundup_power2_next_division(3, 8), 4);
}

TEST(AllocatorRules, RoundSizeWithDivisions) {
  const AllocatorConfig four = with_divisions(4);
  // Only requests above 512 × divisions (2048) use divisions: 1200 -> 1536.
  EXPECT_EQ(round_size(1200, four), 1536);
  EXPECT_EQ(round_size(5 * kMiB + 1, four), 6 * kMiB);
  EXPECT_EQ(round_size(5 * kMiB, four), 5 * kMiB);
  // 600 KiB + 1 with 8 divisions: [512, 1024) KiB in steps of 64 KiB -> 640 KiB.
  EXPECT_EQ(round_size(600 * kKiB + 1, with_divisions(8)), 640 * kKiB);
  // Divisions of 1 mean plain rounding.
  EXPECT_EQ(round_size(5 * kMiB + 1, with_divisions(1)), 5 * kMiB + 512);
}

TEST(AllocatorRules, DivisionIntervalIndex) {
  AllocatorConfig config;
  config.roundup_power2_divisions[0] = 2;   // below 2 MiB
  config.roundup_power2_divisions[6] = 8;   // [64, 128) MiB
  config.roundup_power2_divisions[15] = 4;  // 32 GiB and above
  EXPECT_EQ(roundup_power2_divisions_for(config, 1000), 2);
  EXPECT_EQ(roundup_power2_divisions_for(config, 2 * kMiB - 1), 2);
  EXPECT_EQ(roundup_power2_divisions_for(config, 2 * kMiB), 0);
  EXPECT_EQ(roundup_power2_divisions_for(config, 64 * kMiB), 8);
  EXPECT_EQ(roundup_power2_divisions_for(config, 128 * kMiB - 1), 8);
  EXPECT_EQ(roundup_power2_divisions_for(config, int64_t{1} << 40), 4);
  // 100 MiB with 8 divisions of [64, 128) MiB: steps of 8 MiB -> 104 MiB.
  EXPECT_EQ(round_size(100 * kMiB, config), 104 * kMiB);
}

TEST(AllocatorRules, PoolOfRequest) {
  EXPECT_EQ(pool_of(1), Pool::kSmall);
  EXPECT_EQ(pool_of(kSmallSize), Pool::kSmall);
  EXPECT_EQ(pool_of(kSmallSize + 1), Pool::kLarge);
}

TEST(AllocatorRules, SegmentSizeFor) {
  EXPECT_EQ(segment_size_for(512), 2 * kMiB);
  EXPECT_EQ(segment_size_for(1 * kMiB), 2 * kMiB);
  EXPECT_EQ(segment_size_for(1 * kMiB + 512), 20 * kMiB);
  EXPECT_EQ(segment_size_for(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(segment_size_for(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(segment_size_for(10 * kMiB + 512), 12 * kMiB);
  EXPECT_EQ(segment_size_for(288 * kMiB), 288 * kMiB);  // the GPT fixture's failing request
}

TEST(AllocatorRules, ShouldSplitLargePoolNeedsMoreThan1MiBLeft) {
  const AllocatorConfig config;
  EXPECT_TRUE(should_split(Pool::kLarge, 20 * kMiB, 9 * kMiB, config));         // 11 MiB left
  EXPECT_FALSE(should_split(Pool::kLarge, 20 * kMiB, 19 * kMiB, config));       // exactly 1 MiB left
  EXPECT_TRUE(should_split(Pool::kLarge, 20 * kMiB, 19 * kMiB - 512, config));  // 1 MiB + 512 left
  // The fragmentation fixture: 9.5 MiB from the 10.5 MiB rest leaves 1 MiB: not split.
  EXPECT_FALSE(should_split(Pool::kLarge, 11010048, 9961472, config));
  // Requests at or above max_split_size are never split off.
  AllocatorConfig capped;
  capped.max_split_size = 40 * kMiB;
  EXPECT_FALSE(should_split(Pool::kLarge, 100 * kMiB, 40 * kMiB, capped));
  EXPECT_TRUE(should_split(Pool::kLarge, 100 * kMiB, 39 * kMiB, capped));
}

TEST(AllocatorRules, ShouldSplitSmallPoolAndExpandableNeed512Left) {
  const AllocatorConfig config;
  EXPECT_TRUE(should_split(Pool::kSmall, 2 * kMiB, 2 * kMiB - 512, config));
  EXPECT_FALSE(should_split(Pool::kSmall, 2 * kMiB, 2 * kMiB, config));
  AllocatorConfig expandable;
  expandable.expandable_segments = true;
  EXPECT_TRUE(should_split(Pool::kLarge, 20 * kMiB, 20 * kMiB - 512, expandable));
}

TEST(AllocatorRules, MayReuseBlockOversizeRules) {
  AllocatorConfig config;
  config.max_split_size = 100 * kMiB;
  EXPECT_FALSE(may_reuse_block(120 * kMiB, 50 * kMiB, config));  // small request, oversize block
  EXPECT_TRUE(may_reuse_block(90 * kMiB, 50 * kMiB, config));
  EXPECT_TRUE(may_reuse_block(119 * kMiB, 100 * kMiB, config));   // within 20 MiB
  EXPECT_FALSE(may_reuse_block(120 * kMiB, 100 * kMiB, config));  // 20 MiB over: no
  config.max_non_split_rounding_size = 40 * kMiB;
  EXPECT_TRUE(may_reuse_block(120 * kMiB, 100 * kMiB, config));
  // Without max_split_size every block may be used.
  EXPECT_TRUE(may_reuse_block(int64_t{1} << 40, 512, AllocatorConfig{}));
}

}  // namespace
}  // namespace oomtune::alloc_rules
