// The fraction that caps the CUDA caching allocator at the budget: the
// allocator's own limit, floor(fraction * total), never passes the budget
// and falls short of it by a byte at most.

#include "probes/cuda_budget.h"

#include <stdexcept>

#include <gtest/gtest.h>

#include "common/byte_size.h"

namespace oomtune {
namespace {

TEST(CudaBudget, TheAllocatorsLimitIsTheBudgetWithinAByteBelow) {
  // cudaMemGetInfo totals: an H100 80GB (85,031,714,816 B as PyTorch reports
  // it), an H200, a 24 GB card, and an odd one.
  for (const int64_t total : {int64_t{85031714816}, int64_t{150102261760}, int64_t{25393692672}, int64_t{1000003}}) {
    for (const int64_t budget : {int64_t{1}, int64_t{999999}, 8 * kGiB, 16 * kGiB, 20 * kGiB + 7, total - 1}) {
      if (budget >= total) continue;
      const double f = allocator_fraction(budget, total);
      EXPECT_GT(f, 0.0);
      EXPECT_LT(f, 1.0);
      EXPECT_LE(allocator_limit_bytes(f, total), budget) << budget << " of " << total;
      EXPECT_GE(allocator_limit_bytes(f, total), budget - 1) << "within a byte of the budget";
    }
  }
}

TEST(CudaBudget, ABudgetOfTheWholeDeviceOrMoreIsFractionOne) {
  EXPECT_EQ(allocator_fraction(80 * kGiB, 80 * kGiB), 1.0);
  EXPECT_EQ(allocator_fraction(100 * kGiB, 80 * kGiB), 1.0);
  EXPECT_EQ(allocator_limit_bytes(1.0, 80 * kGiB), 80 * kGiB);
}

TEST(CudaBudget, NonPositiveBytesAreRefused) {
  EXPECT_THROW(allocator_fraction(0, 80 * kGiB), std::invalid_argument);
  EXPECT_THROW(allocator_fraction(8 * kGiB, 0), std::invalid_argument);
}

}  // namespace
}  // namespace oomtune
