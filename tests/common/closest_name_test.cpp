#include "common/closest_name.h"

#include <gtest/gtest.h>

namespace oomtune {
namespace {

TEST(ClosestName, PicksTheNearestByEditDistance) {
  const std::vector<std::string> keys = {"global_batch", "budget", "headroom", "device"};
  EXPECT_EQ(closest_name("global_bach", keys), "global_batch");
  EXPECT_EQ(closest_name("budjet", keys), "budget");
  EXPECT_EQ(closest_name("devise", keys), "device");
  EXPECT_EQ(closest_name("x", {}), "");
  EXPECT_EQ(closest_name("learning_rate", {"kind", "lr", "eps"}), "lr");
  // A word of a longer name beats a nearer edit distance ("bias" is 4 edits
  // from "mask", "attention_mask" 10); a part of a word does not count.
  EXPECT_EQ(closest_name("mask", {"input_ids", "attention_mask", "bias"}), "attention_mask");
  EXPECT_EQ(closest_name("ids", {"attention_mask", "input_ids"}), "input_ids");
  EXPECT_EQ(closest_name("ask", {"attention_mask", "bias"}), "bias");
}

TEST(ClosestName, SuggestListsTheValidNames) {
  EXPECT_EQ(suggest("sgdd", {"adamw", "sgd"}), "did you mean 'sgd'?; valid: adamw, sgd");
}

}  // namespace
}  // namespace oomtune
