#include "common/seconds_text.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace oomtune {
namespace {

// Three significant digits from microseconds to minutes, never an exponent.
TEST(SecondsText, ThreeSignificantDigitsAtEveryScale) {
  EXPECT_EQ(format_seconds(0.0001344), "0.000134");
  EXPECT_EQ(format_seconds(0.1344), "0.134");
  EXPECT_EQ(format_seconds(0.01), "0.0100");
  EXPECT_EQ(format_seconds(0.002), "0.00200");
  EXPECT_EQ(format_seconds(1.0), "1.00");
  EXPECT_EQ(format_seconds(12.34), "12.3");
  EXPECT_EQ(format_seconds(99.94), "99.9");
  EXPECT_EQ(format_seconds(1234.4), "1234");
  EXPECT_EQ(format_seconds(3e-9), "0.00000000300");
}

TEST(SecondsText, SignZeroAndNonFinite) {
  EXPECT_EQ(format_seconds(-0.0000123), "-0.0000123");
  EXPECT_EQ(format_seconds(0.0), "0");
  EXPECT_EQ(format_seconds(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(format_seconds(std::nan("")), "nan");
}

}  // namespace
}  // namespace oomtune
