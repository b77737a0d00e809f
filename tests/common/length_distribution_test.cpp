// draw_lengths and read_length_histogram (job/length_distribution.h).
// The expected draws come from an independent Python implementation of
// SplitMix64 with the same rejection rule (Vigna's splitmix64.c constants;
// its first output for seed 0 is 0xe220a8397b1dcdaf).

#include "job/length_distribution.h"

#include <array>
#include <fstream>

#include <gtest/gtest.h>

#include "common/error.h"
#include "support/scratch_path.h"

namespace oomtune {
namespace {

TEST(LengthDraw, UniformDrawsAreTheSameOnEveryMachine) {
  EXPECT_EQ(draw_lengths(LengthDistribution::uniform(256, 1024), 8, 1234567),
            (std::vector<int64_t>{741, 682, 531, 850, 457, 770, 990, 701}));
  EXPECT_EQ(draw_lengths(LengthDistribution::histogram({100, 200, 300, 400, 500}), 8, 42),
            (std::vector<int64_t>{400, 200, 400, 500, 100, 300, 100, 400}));
  EXPECT_EQ(draw_lengths(LengthDistribution::fixed(512), 3, 7), (std::vector<int64_t>{512, 512, 512}));
  EXPECT_NE(draw_lengths(LengthDistribution::uniform(256, 1024), 8, 1),
            draw_lengths(LengthDistribution::uniform(256, 1024), 8, 2));
}

TEST(LengthDraw, UniformCoversItsRange) {
  const std::vector<int64_t> lengths = draw_lengths(LengthDistribution::uniform(3, 6), 4000, 11);
  std::array<int, 4> counts{};
  for (int64_t l : lengths) {
    ASSERT_GE(l, 3);
    ASSERT_LE(l, 6);
    ++counts[static_cast<std::size_t>(l - 3)];
  }
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
}

TEST(LengthDraw, BadDistributionsAreInputErrors) {
  EXPECT_THROW(draw_lengths(LengthDistribution::uniform(1024, 256), 1, 0), InputError);
  EXPECT_THROW(draw_lengths(LengthDistribution::uniform(0, 5), 1, 0), InputError);
  EXPECT_THROW(draw_lengths(LengthDistribution::histogram({}), 1, 0), InputError);
  EXPECT_THROW(draw_lengths(LengthDistribution::fixed(8), -1, 0), InputError);
}

TEST(LengthDraw, HistogramFileIsOneLengthPerLine) {
  const std::string path = testing::scratch_path("lengths.txt").string();
  std::ofstream(path) << "# token counts\n128\n\n  512 \n1024\n";
  EXPECT_EQ(read_length_histogram(path), (std::vector<int64_t>{128, 512, 1024}));
  std::ofstream(path) << "128\n12x\n";
  try {
    read_length_histogram(path);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), path + ":2: not a positive integer: '12x'");
  }
  std::ofstream(path) << "# nothing\n";
  EXPECT_THROW(read_length_histogram(path), InputError);
  std::ofstream(path) << "0\n";
  EXPECT_THROW(read_length_histogram(path), InputError);
}

}  // namespace
}  // namespace oomtune
