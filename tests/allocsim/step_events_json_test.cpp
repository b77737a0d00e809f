// Step-events files (allocsim/step_events_json.h): a round trip, and one
// clear error per kind of bad file.

#include "allocsim/step_events_json.h"

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "support/scratch_path.h"

namespace oomtune::allocsim {
namespace {

std::string write(const std::string& text) {
  const std::string path = oomtune::testing::scratch_path("step_events.json").string();
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::string& text) {
  try {
    read_step_events(write(text));
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(StepEventsJson, RoundTrip) {
  AllocEvent a = alloc_event(7, 4096, 0, Phase::kForward);
  a.op = "aten::mm";
  const std::vector<AllocEvent> events = {free_event(3, 0, Phase::kForward), a, free_event(7, 0, Phase::kBackward)};
  const StepEvents read = read_step_events(write(step_events_json({events, {1024, 0, 65536}}).dump()));
  EXPECT_EQ(read.persistent_bytes, (std::vector<int64_t>{1024, 0, 65536}));
  const std::vector<AllocEvent>& back = read.events;
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].kind, AllocEventKind::kFree);
  EXPECT_EQ(back[0].id, 3u);
  EXPECT_EQ(back[1].bytes, 4096);
  EXPECT_EQ(back[1].op, "aten::mm");
  EXPECT_EQ(back[1].phase, Phase::kForward);
  EXPECT_EQ(back[2].phase, Phase::kBackward);
  EXPECT_EQ(back[2].order, 2);
}

TEST(StepEventsJson, BadFilesSayWhatIsWrong) {
  EXPECT_NE(error_of("{").find("not JSON"), std::string::npos);
  EXPECT_NE(error_of("{\"format\": \"x\"}").find("not a step-events file"), std::string::npos);
  const std::string head = "{\"format\": \"oomtune step events\", \"version\": 1, \"events\": ";
  EXPECT_NE(error_of("{\"format\": \"oomtune step events\", \"version\": 2}").find("version 2"), std::string::npos);
  EXPECT_NE(error_of(head + "[[\"alloc\", 1, -5, \"forward\", \"\"]]}").find("event 0: bytes"), std::string::npos);
  EXPECT_NE(error_of(head + "[[\"alloc\", 1, 5, \"sideways\", \"\"]]}").find("event 0: unknown phase"),
            std::string::npos);
  EXPECT_NE(error_of(head + "[[\"grow\", 1, 5, \"forward\", \"\"]]}").find("kind"), std::string::npos);
  EXPECT_NE(error_of(head + "[[\"alloc\", 1]]}").find("not a list of 5"), std::string::npos);
  EXPECT_NE(error_of(head + "[], \"persistent\": 5}").find("\"persistent\" is not a list"), std::string::npos);
  EXPECT_NE(error_of(head + "[], \"persistent\": [4, -1]}").find("persistent 1: not a non-negative"),
            std::string::npos);
}

// Files written before "persistent" existed still read, with none.
TEST(StepEventsJson, AFileWithoutPersistentHasNone) {
  const StepEvents read = read_step_events(write(
      "{\"format\": \"oomtune step events\", \"version\": 1, \"events\": [[\"alloc\", 1, 5, \"forward\", \"\"]]}"));
  EXPECT_EQ(read.events.size(), 1u);
  EXPECT_TRUE(read.persistent_bytes.empty());
}

}  // namespace
}  // namespace oomtune::allocsim
