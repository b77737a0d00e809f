// A trace recorded with _record_memory_history(skip_actions=[...])
// (PyTorch 2.11, torch/cuda/memory.py; its docstring's example skips
// "free_requested") reads as the full trace does.
//
// The variants are cpu_gpt2_backward_oom.pickle (recorded_on_cpu_test.cpp)
// with one free action's name changed in place to one PyTorch does not
// write ("free_requestex", same length; the name is memoized, so every
// such event changes): those events then count as other actions, as if
// they had not been recorded, and the others keep their indices.

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace oomtune::diagnose {
namespace {

/// The fixture's bytes with the action name `from` renamed to `to`.
std::string renamed(const std::string& path, const std::string& from, const std::string& to) {
  std::string bytes = testing::read_all(path);
  const size_t at = bytes.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) bytes.replace(at, from.size(), to);
  EXPECT_EQ(bytes.find(from), std::string::npos) << from << " is written more than once";
  return bytes;
}

/// What the diagnosis concludes, without the trace's notes on it and the
/// need's prose, which names event indices: where frees are read at their
/// completion (the event after free_requested), a block's events end one
/// later.
nlohmann::json conclusions(const Diagnosis& d) {
  nlohmann::json j = nlohmann::json::parse(render_json(d));
  j["need"].erase("estimate");
  return {j["verdicts"], j["ooms"], j["need"], j["peak"], j["recommendations"]};
}

TEST(SkippedActions, WithoutFreeRequestedTheCompletionsAreTheFrees) {
  const std::string path = testing::synthetic_fixture("cpu_gpt2_backward_oom.pickle");
  const Diagnosis full = testing::diagnose_file(path);
  const Snapshot s = load_snapshot_bytes(renamed(path, "free_requested", "free_requestex"), path);
  EXPECT_TRUE(s.free_requested_skipped);
  const Diagnosis d = diagnose(s, path, {});
  EXPECT_TRUE(d.trace.free_requested_skipped);
  EXPECT_FALSE(d.trace.free_completed_skipped);
  EXPECT_EQ(conclusions(d), conclusions(full));
  EXPECT_EQ(d.need.method, NeedMethod::kBackwardBlocks);  // not "only the failing request is known"
  EXPECT_NE(render_text(d).find("  actions: the trace has no free_requested events (recorded with "
                                "skip_actions=[\"free_requested\"])"),
            std::string::npos);
}

TEST(SkippedActions, WithoutFreeCompletedAFreedBlockIsReusableAtOnce) {
  const std::string path = testing::synthetic_fixture("cpu_gpt2_backward_oom.pickle");
  const Diagnosis full = testing::diagnose_file(path);
  const Snapshot s = load_snapshot_bytes(renamed(path, "free_completed", "free_completex"), path);
  EXPECT_FALSE(s.free_requested_skipped);
  const Diagnosis d = diagnose(s, path, {});
  EXPECT_TRUE(d.trace.free_completed_skipped);
  EXPECT_EQ(conclusions(d), conclusions(full));
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_TRUE(d.ooms[0].fragmentation);  // the freed blocks are free again, not pending forever
  EXPECT_EQ(d.ooms[0].reserved_free_bytes, full.ooms[0].reserved_free_bytes);
  EXPECT_NE(render_text(d).find("  actions: the trace has no free_completed events"), std::string::npos);
}

TEST(SkippedActions, AFullTraceSaysNothingOfThem) {
  const Diagnosis full = testing::diagnose_file(testing::synthetic_fixture("cpu_gpt2_backward_oom.pickle"));
  EXPECT_FALSE(full.trace.free_requested_skipped);
  EXPECT_FALSE(full.trace.free_completed_skipped);
  EXPECT_EQ(render_text(full).find("  actions:"), std::string::npos);
}

}  // namespace
}  // namespace oomtune::diagnose
