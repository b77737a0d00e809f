// JSON round trips of the simulator's records (allocsim/allocsim_json.h).

#include "allocsim/allocsim_json.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/byte_size.h"
#include "common/error.h"

namespace oomtune::allocsim {
namespace {

TEST(AllocsimJson, ResultRoundTrips) {
  SimOptions options;
  options.budget_bytes = 50 * kMiB;
  options.record_segment_log = true;
  const std::vector<AllocEvent> events = {alloc_event(1, 30 * kMiB, 0, Phase::kForward),
                                          alloc_event(2, 30 * kMiB, 1, Phase::kBackward)};
  const SimResult result = replay(events, options);
  const nlohmann::json j = result;
  EXPECT_EQ(j.at("peak_reserved_bytes"), 30 * kMiB);
  EXPECT_EQ(j.at("peak_reserved_by_phase").at("forward"), 30 * kMiB);
  EXPECT_EQ(j.at("ooms").at(0).at("event_index"), 1);
  EXPECT_EQ(j.at("segment_log").at(0).at("action"), "alloc");
  const auto back = j.get<SimResult>();
  EXPECT_EQ(nlohmann::json(back), j);
  EXPECT_EQ(back.first_oom_event_index, 1);
  EXPECT_EQ(back.segment_log.size(), 1u);
}

TEST(AllocsimJson, OptionsRoundTripAndNoLimitIsNull) {
  SimOptions options;
  options.config.expandable_segments = true;
  options.config.roundup_power2_divisions[2] = 4;
  options.budget_bytes = 8 * (int64_t{1} << 30);
  const nlohmann::json j = options;
  EXPECT_TRUE(j.at("config").at("max_split_size").is_null());
  const auto back = j.get<SimOptions>();
  EXPECT_EQ(back.config.max_split_size, alloc_rules::kNoMaxSplitSize);
  EXPECT_EQ(back.config.roundup_power2_divisions, options.config.roundup_power2_divisions);
  EXPECT_TRUE(back.config.expandable_segments);
  EXPECT_EQ(back.budget_bytes, options.budget_bytes);
}

TEST(AllocsimJson, BadInputNamesTheProblem) {
  nlohmann::json j = SimResult{};
  j["peak_reserved_by_phase"]["warmup"] = 1;
  EXPECT_THROW(j.get<SimResult>(), InputError);
  EXPECT_THROW((nlohmann::json{{"roundup_power2_divisions", {1, 2}}}.get<alloc_rules::AllocatorConfig>()), InputError);
  EXPECT_THROW((nlohmann::json{{"peak_reserved_bytes", "lots"}}.get<SimResult>()), InputError);
  try {  // a field of the wrong type: nlohmann's error, named as the allocator config's
    (void)nlohmann::json{{"expandable_segments", "yes"}}.get<alloc_rules::AllocatorConfig>();
    ADD_FAILURE() << "a string expandable_segments was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("allocator config JSON: ", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace oomtune::allocsim
