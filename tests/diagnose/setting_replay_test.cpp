// The trace replayed under another allocator setting (Note [Allocator
// settings replayed], setting_replay.h): the program's own
// torch.cuda.empty_cache() calls are part of what it replays, and the same
// replay under the snapshot's own settings must run out of memory where
// the real allocator did. Each expectation is worked out by hand in the
// comments.

#include "diagnose/setting_replay.h"

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/byte_size.h"
#include "common/error.h"
#include "common/gzip_file.h"
#include "diagnose/frames.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

/// The trace indices of the program's empty_cache() calls in fixture `name`.
std::vector<size_t> empty_cache_calls_in(const std::string& name) {
  const Snapshot snapshot = load_snapshot(testing::synthetic_fixture(name));
  const FrameIndex frames(snapshot);
  return empty_cache_calls(snapshot.device_traces.at(0), frames);
}

TEST(SettingReplay, EmptyCacheCallsAreFoundByTheirStack) {
  // forward_holes_*: one call returning 6 segments (events 39-44);
  // rounding_waste_second_iteration: one returning 3 (events 12-14).
  EXPECT_EQ(empty_cache_calls_in("forward_holes_combined.pickle"), std::vector<size_t>{39});
  EXPECT_EQ(empty_cache_calls_in("rounding_waste_second_iteration.pickle"), std::vector<size_t>{12});
  // The allocator's own flush inside a malloc (AdamW's first step) carries
  // the allocating call's stack: no call of the program.
  EXPECT_TRUE(empty_cache_calls_in("adamw_first_step_oom.pickle").empty());
  // The report counts them.
  const Diagnosis d = testing::diagnose_file(testing::synthetic_fixture("forward_holes_combined.pickle"));
  EXPECT_EQ(d.trace.empty_cache_calls, 1);
  EXPECT_NE(render_text(d).find("torch.cuda.empty_cache() calls while recording: 1"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(render_json(d))["trace"]["empty_cache_calls"], 1);
}

using testing::trace_event;

TEST(SettingReplay, AnEmptyCacheCallIsReplayed) {
  // The program frees a 24 MiB tensor and calls empty_cache() (its segment
  // goes back to CUDA), allocates 16 MiB (a new 16 MiB segment) and asks
  // 8 MiB, which needs a 20 MiB segment that the cap refuses (24 MiB, the
  // most reserved before, lies under 16 + 20). Replayed at a cap of 24 MiB
  // with the call: the same, the request fails at 16 MiB reserved. Without
  // it, the 16 MiB tensor splits the cached 24 MiB segment and the request
  // takes the 8 MiB left: the replay would not reproduce the out-of-memory
  // it judges the settings against.
  constexpr int64_t kX = int64_t{1} << 40;
  constexpr int64_t kY = int64_t{2} << 40;
  const std::vector<TraceEvent> trace = {trace_event(TraceAction::kSegmentAlloc, kX, 24 * kMiB),
                                         trace_event(TraceAction::kAlloc, kX, 24 * kMiB),
                                         trace_event(TraceAction::kFreeCompleted, kX, 24 * kMiB),
                                         trace_event(TraceAction::kSegmentFree, kX, 24 * kMiB),
                                         trace_event(TraceAction::kSegmentAlloc, kY, 16 * kMiB),
                                         trace_event(TraceAction::kAlloc, kY, 16 * kMiB),
                                         trace_event(TraceAction::kOom, 0, 8 * kMiB)};
  SettingReplayInput in;
  in.trace = &trace;
  in.oom_index = 6;
  in.still_needed_bytes = 8 * kMiB;
  in.cap_is_budget = true;
  in.cap_low_bytes = 24 * kMiB;
  in.cap_high_bytes = 16 * kMiB + 20 * kMiB;
  in.empty_cache_at = {3};
  const alloc_rules::AllocatorConfig as_recorded;
  const SettingReplay replayed = replay_with_setting(in, as_recorded);
  ASSERT_TRUE(replayed.replayed) << replayed.failure;
  EXPECT_FALSE(replayed.fits);
  EXPECT_EQ(replayed.failed_event, 6);
  EXPECT_EQ(replayed.reserved_bytes, 16 * kMiB);
  in.empty_cache_at.clear();
  const SettingReplay without_call = replay_with_setting(in, as_recorded);
  EXPECT_TRUE(without_call.fits);
  EXPECT_EQ(without_call.reserved_bytes, 24 * kMiB);
}

TEST(SettingReplay, TheReplayUnderTheSnapshotsOwnSettingsIsChecked) {
  // forward_holes_combined: the replay follows the program's empty_cache()
  // and fails at the out-of-memory's 24 MiB request (event 77) as the real
  // allocator did. Its context="state" recording shows the call as six
  // segment_free events of the segments' own stacks: the six cached 24 MiB
  // segments stay in the replay, the 9.5 MiB tensors split them, and the
  // second forward's 24 MiB block (event 76) finds no room a request early.
  const Diagnosis seen = testing::diagnose_file(testing::synthetic_fixture("forward_holes_combined.pickle"));
  ASSERT_EQ(seen.ooms.size(), 1u);
  EXPECT_EQ(seen.ooms[0].event_index, 77);
  EXPECT_TRUE(seen.as_recorded_replay.reproduces(77));
  EXPECT_NE(render_text(seen).find("allocator-settings replay checked: under this snapshot's own allocator settings "
                                   "the replayed trace runs out of memory at the same request"),
            std::string::npos);
  const Diagnosis unseen = testing::diagnose_file(testing::synthetic_fixture("forward_holes_context_state.pickle"));
  ASSERT_EQ(unseen.ooms.size(), 1u);
  const SettingReplay& r = unseen.as_recorded_replay;
  ASSERT_TRUE(r.replayed);
  EXPECT_FALSE(r.reproduces(77));
  EXPECT_EQ(r.failed_event, 76);
  EXPECT_EQ(r.failed_bytes, 24 * kMiB);
  const Recommendation* expandable = testing::find_fix(unseen, FixId::kExpandableSegments);
  ASSERT_NE(expandable, nullptr);
  EXPECT_NE(expandable->estimate.find("approximate: under the snapshot's own settings the same replay fails already "
                                      "at event 76 (a 24.00 MiB request), before the out-of-memory"),
            std::string::npos)
      << expandable->estimate;
  const nlohmann::json j = nlohmann::json::parse(render_json(unseen));
  EXPECT_EQ(j["as_recorded_replay"]["reproduces_oom"], false);
  EXPECT_EQ(j["as_recorded_replay"]["failed_event"], 76);
  EXPECT_TRUE(nlohmann::json::parse(render_json(seen))["as_recorded_replay"]["reproduces_oom"].get<bool>());
}

TEST(SettingReplay, EveryFixtureOutOfMemoryIsReproducedAsRecorded) {
  // The simulator against every fixture whose out-of-memory is replayed
  // under the allocator settings: the real PyTorch 2.11 snapshots (shared/
  // and h200_recorded/) and the made ones, all but the one recorded so
  // that the replay cannot see the program's empty_cache().
  std::vector<std::string> paths;
  for (const std::string& dir :
       {testing::synthetic_fixture(""), testing::synthetic_fixture("h200_recorded/"), testing::real_fixture("")}) {
    if (!std::filesystem::is_directory(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) paths.push_back(entry.path().string());
  }
  int replayed = 0;
  for (const std::string& path : paths) {
    const bool gz = path.size() > 10 && path.compare(path.size() - 10, 10, ".pickle.gz") == 0;
    const bool plain = path.size() > 7 && path.compare(path.size() - 7, 7, ".pickle") == 0;
    if ((!gz && !plain) || path.find("forward_holes_context_state") != std::string::npos) continue;
    Diagnosis d;
    try {
      d = diagnose(gz ? load_snapshot_bytes(read_gzip_file(path), path) : load_snapshot(path), path, {});
    } catch (const Error&) {
      continue;  // the fixtures of bad input
    }
    if (!d.as_recorded_replay.replayed) continue;
    ++replayed;
    ASSERT_FALSE(d.ooms.empty()) << path;
    EXPECT_TRUE(d.as_recorded_replay.reproduces(d.ooms.back().event_index))
        << path << ": " << as_recorded_clause(d.as_recorded_replay, d.ooms.back().event_index);
  }
  EXPECT_GE(replayed, 30);  // 26 made ones, 1 shared, 13 H200 recordings when this was written
}

}  // namespace
}  // namespace oomtune::diagnose
