// pad_length and Bucketing::name (allocsim/bucketing.h).

#include "allocsim/bucketing.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace oomtune::allocsim {
namespace {

TEST(Bucketing, PaddingRoundsUpToTheBucket) {
  EXPECT_EQ(pad_length(300, {}), 300);
  EXPECT_EQ(pad_length(300, {Bucketing::Kind::kMultiple, 128}), 384);
  EXPECT_EQ(pad_length(256, {Bucketing::Kind::kMultiple, 128}), 256);
  EXPECT_EQ(pad_length(300, {Bucketing::Kind::kPowerOfTwo, 1}), 512);
  EXPECT_EQ(pad_length(1, {Bucketing::Kind::kPowerOfTwo, 1}), 1);
  EXPECT_EQ((Bucketing{Bucketing::Kind::kMultiple, 128}.name()), "padded to a multiple of 128");
  EXPECT_THROW(pad_length(0, {}), InputError);
  EXPECT_THROW(pad_length(5, {Bucketing::Kind::kMultiple, 0}), InputError);
}

}  // namespace
}  // namespace oomtune::allocsim
