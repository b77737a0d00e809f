// PYTORCH_CUDA_ALLOC_CONF parsing (allocsim/allocsim_config.h), with the
// values PyTorch's own CUDAAllocatorConfig tests use.

#include "allocsim/allocsim_config.h"

#include <gtest/gtest.h>

#include "common/byte_size.h"
#include "common/error.h"

namespace oomtune::allocsim {
namespace {

TEST(AllocConf, EmptyIsDefaults) {
  const alloc_rules::AllocatorConfig config = parse_alloc_conf("");
  EXPECT_EQ(config.max_split_size, alloc_rules::kNoMaxSplitSize);
  EXPECT_EQ(config.max_non_split_rounding_size, 20 * kMiB);
  EXPECT_EQ(config.garbage_collection_threshold, 0.0);
  EXPECT_FALSE(config.expandable_segments);
  EXPECT_EQ(format_alloc_conf(config), "");
}

TEST(AllocConf, ParsesEveryOption) {
  // c10/test/core/AllocatorConfig_test.cpp uses this string.
  const alloc_rules::AllocatorConfig config = parse_alloc_conf(
      "max_split_size_mb:40,max_non_split_rounding_mb:30,garbage_collection_threshold:0.5,"
      "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1],expandable_segments:True,"
      "pinned_use_background_threads:True");
  EXPECT_EQ(config.max_split_size, 40 * kMiB);
  EXPECT_EQ(config.max_non_split_rounding_size, 30 * kMiB);
  EXPECT_EQ(config.garbage_collection_threshold, 0.5);
  EXPECT_TRUE(config.expandable_segments);
  // Index = log2(interval start in MiB); the first value also fills the
  // intervals below it, '>' those above the last.
  const std::array<int64_t, 16> expected = {8, 8, 8, 8, 8, 8, 8, 2, 4, 2, 4, 1, 1, 1, 1, 1};
  EXPECT_EQ(config.roundup_power2_divisions, expected);
  EXPECT_EQ(alloc_rules::roundup_power2_divisions_for(config, 32 * kMiB), 8);
  EXPECT_EQ(alloc_rules::roundup_power2_divisions_for(config, 128 * kMiB), 2);
  EXPECT_EQ(alloc_rules::roundup_power2_divisions_for(config, 256 * kMiB), 4);
}

TEST(AllocConf, SingleDivisionsValueAppliesEverywhere) {
  const auto config = parse_alloc_conf("roundup_power2_divisions:4");
  for (int64_t divisions : config.roundup_power2_divisions) EXPECT_EQ(divisions, 4);
}

TEST(AllocConf, RoundTrips) {
  const auto config =
      parse_alloc_conf("max_split_size_mb:128, garbage_collection_threshold:0.6, expandable_segments:True");
  EXPECT_EQ(format_alloc_conf(config),
            "max_split_size_mb:128,garbage_collection_threshold:0.6,expandable_segments:True");
  const auto again = parse_alloc_conf(format_alloc_conf(config));
  EXPECT_EQ(again.max_split_size, config.max_split_size);
  EXPECT_EQ(again.garbage_collection_threshold, config.garbage_collection_threshold);
  EXPECT_EQ(again.expandable_segments, config.expandable_segments);
  const auto divisions = parse_alloc_conf("roundup_power2_divisions:[64:8,>:1]");
  EXPECT_EQ(parse_alloc_conf(format_alloc_conf(divisions)).roundup_power2_divisions,
            divisions.roundup_power2_divisions);
}

TEST(AllocConf, IgnoresOptionsThatDoNotMoveMemory) {
  const auto config = parse_alloc_conf(
      "backend:native,release_lock_on_cudamalloc:True,pinned_num_register_threads:8,"
      "expandable_segments:False");
  EXPECT_FALSE(config.expandable_segments);
}

TEST(AllocConf, RejectsWhatPyTorchRejects) {
  EXPECT_THROW(parse_alloc_conf("max_split_size_mb:10"), ConfigError);  // < 20
  EXPECT_THROW(parse_alloc_conf("max_non_split_rounding_mb:1"), ConfigError);
  EXPECT_THROW(parse_alloc_conf("garbage_collection_threshold:1.0"), ConfigError);
  EXPECT_THROW(parse_alloc_conf("garbage_collection_threshold:0"), ConfigError);
  EXPECT_THROW(parse_alloc_conf("roundup_power2_divisions:3"), ConfigError);
  EXPECT_THROW(parse_alloc_conf("roundup_power2_divisions:[64:3]"), ConfigError);
  EXPECT_THROW(parse_alloc_conf("roundup_power2_divisions:[63:2]"), ConfigError);
  EXPECT_THROW(parse_alloc_conf("roundup_power2_divisions:[64:2"), ConfigError);
  EXPECT_THROW(parse_alloc_conf("expandable_segments:yes"), ConfigError);
  EXPECT_THROW(parse_alloc_conf("max_split_size_mb"), ConfigError);
}

TEST(AllocConf, UnknownKeyNamesTheClosest) {
  try {
    parse_alloc_conf("max_split_size:128");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("unknown key 'max_split_size'"), std::string::npos) << message;
    EXPECT_NE(message.find("did you mean 'max_split_size_mb'"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace oomtune::allocsim
