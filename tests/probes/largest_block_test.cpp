// The bisection behind "largest block" (probes/largest_block.h) against a
// fake allocator whose limit is known: every answer below is the largest
// multiple of the granularity at or under that limit, worked out by hand.

#include "probes/largest_block.h"

#include <stdexcept>

#include <gtest/gtest.h>

#include "common/byte_size.h"

namespace oomtune {
namespace {

TEST(LargestAllocatable, FindsTheLargestMultipleUnderTheLimitInLogarithmicTries) {
  const int64_t limit = 37 * kMiB + 12345;  // fragmentation leaves an odd size
  const auto under_limit = [&](int64_t bytes) { return bytes <= limit; };
  int64_t attempts = 0;
  // 80 GiB in 2 MiB units: 40960 units; the bound, then log2(40960) < 16 halvings.
  EXPECT_EQ(largest_allocatable(under_limit, 80 * 1024 * kMiB, 2 * kMiB, &attempts), 36 * kMiB);
  EXPECT_GE(attempts, 2);
  EXPECT_LE(attempts, 1 + 16);
  EXPECT_EQ(largest_allocatable(under_limit, 80 * 1024 * kMiB, kMiB), 37 * kMiB);
}

TEST(LargestAllocatable, TheBoundAndNothingAreAnswersToo) {
  int64_t attempts = 0;
  EXPECT_EQ(largest_allocatable([](int64_t) { return true; }, 256 * kMiB + 1, 2 * kMiB, &attempts), 256 * kMiB);
  EXPECT_EQ(attempts, 1) << "the bound fits: one try";
  EXPECT_EQ(largest_allocatable([](int64_t) { return false; }, 256 * kMiB, 2 * kMiB, &attempts), 0);
  EXPECT_EQ(attempts, 1 + 7) << "the bound, then 127 units halved down to none";
  EXPECT_EQ(largest_allocatable([](int64_t) { return true; }, kMiB, 2 * kMiB, &attempts), 0);
  EXPECT_EQ(attempts, 0) << "no multiple of the granularity under the bound: nothing tried";
  EXPECT_THROW(largest_allocatable([](int64_t) { return true; }, kMiB, 0), std::invalid_argument);
  EXPECT_THROW(largest_allocatable([](int64_t) { return true; }, -1, kMiB), std::invalid_argument);
}

// Success below a size that succeeded: the tries never go past a failure.
TEST(LargestAllocatable, NeverTriesAboveASizeThatFailed) {
  const int64_t limit = 1000 * kMiB;
  int64_t smallest_failure = INT64_MAX;
  const auto checked = [&](int64_t bytes) {
    EXPECT_LT(bytes, smallest_failure);
    if (bytes > limit) smallest_failure = std::min(smallest_failure, bytes);
    return bytes <= limit;
  };
  EXPECT_EQ(largest_allocatable(checked, 4096 * kMiB, 2 * kMiB), 1000 * kMiB);
}

}  // namespace
}  // namespace oomtune
