// Private memory pools (Note [Private memory pools], analysis.cpp): CUDA
// graphs' pools and torch.cuda.MemPool, whose free blocks an ordinary
// request cannot use.
//
// The fixtures (scripts/make_snapshot_fixtures.py, cudagraph_pool_oom) are
// built to these numbers: 4 parameters of 8 MiB in two 20 MiB segments of
// the default pool (8 MiB free there, two 4 MiB blocks); a CUDA graph's
// pool of 6 segments of 16 MiB, 4 of them free; then eager 16 MiB requests
// under a 256 MiB cap, the 8th refused. The capture variant runs out of
// memory while the graph is recorded (cap 120 MiB), 5 activations alive.
// cudagraph_fragmentation_oom: 16 eager tensors of 5 MiB in four 20 MiB
// segments, 3 of each 4 freed (60 MiB free in blocks of 15 MiB); a graph's
// pool of 6 segments of 16 MiB, 4 of them free; then 40 MiB under a 200
// MiB cap (176 reserved). Worked out in make_snapshot_fixtures.py.

#include <gtest/gtest.h>

#include "common/byte_size.h"
#include "diagnose/setting_replay.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

using testing::find_fix;
using testing::has_verdict;

/// The only out-of-memory of `d`, with its private pools as expected.
const OomReport& oom_with_pools(const Diagnosis& d, bool captures, int64_t segments, int64_t reserved, int64_t free) {
  EXPECT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms.back();
  EXPECT_EQ(o.captures_cuda_graph, captures);
  EXPECT_EQ(o.private_pool_segments, segments);
  EXPECT_EQ(o.private_pool_reserved_bytes, reserved);
  EXPECT_EQ(o.private_pool_free_bytes, free);
  return o;
}

TEST(PrivatePools, AnOrdinaryRequestCannotUseAGraphsFreeMemory) {
  const Diagnosis d = testing::diagnose_file(testing::synthetic_fixture("cudagraph_pool_oom.pickle"));
  ASSERT_FALSE(d.ooms.empty());
  const OomReport& o = oom_with_pools(d, false, 6, 96 * kMiB, 64 * kMiB);
  EXPECT_EQ(o.reserved_bytes, 40 * kMiB + 96 * kMiB + 7 * 16 * kMiB);
  // The free figures are the default pool's: 16 MiB blocks free in the
  // graph's pool are no "free block large enough", and its free segments
  // nothing garbage collection could return.
  EXPECT_EQ(o.reserved_free_bytes, 8 * kMiB);
  EXPECT_EQ(o.pool_free_bytes, 8 * kMiB);
  EXPECT_EQ(o.largest_free_block_bytes, 4 * kMiB);
  EXPECT_EQ(o.fully_free_segment_bytes, 0);
  EXPECT_FALSE(o.fragmentation);
  EXPECT_TRUE(has_verdict(d, VerdictId::kPrivatePools));
  ASSERT_FALSE(d.recommendations.empty());
  EXPECT_EQ(d.recommendations.front().id, FixId::kPrivatePools);
  EXPECT_EQ(d.recommendations.front().frees_bytes, 64 * kMiB);
  EXPECT_EQ(find_fix(d, FixId::kGarbageCollection), nullptr);
  const std::string text = render_text(d);
  EXPECT_NE(text.find("private memory pools (CUDA graphs, torch.cuda.MemPool): 6 segments, 96.00 MiB reserved, "
                      "64.00 MiB free (none of it usable by this request"),
            std::string::npos)
      << text;
  // The map draws the graph's 6 segments with a dashed outline.
  const std::string svg = render_svg(d);
  size_t dashed = 0;
  for (size_t at = svg.find("a private memory pool: CUDA graphs"); at != std::string::npos;
       at = svg.find("a private memory pool: CUDA graphs", at + 1)) {
    ++dashed;
  }
  EXPECT_EQ(dashed, 6u);
}

TEST(PrivatePools, ARequestWhileAGraphIsRecordedAsksItsPool) {
  const Diagnosis d = testing::diagnose_file(testing::synthetic_fixture("cudagraph_capture_oom.pickle"));
  ASSERT_FALSE(d.ooms.empty());
  const OomReport& o = oom_with_pools(d, true, 5, 80 * kMiB, 0);
  EXPECT_EQ(o.reserved_free_bytes, 8 * kMiB);  // every pool's, the graph's holding none free
  EXPECT_FALSE(has_verdict(d, VerdictId::kPrivatePools));
  EXPECT_EQ(find_fix(d, FixId::kPrivatePools), nullptr);
}

TEST(PrivatePools, TheDefaultPoolAloneChangesNothing) {
  // A snapshot whose segments are all (0, 0): no pool line, no verdict.
  const Diagnosis d = testing::diagnose_file(testing::synthetic_fixture("compiled_step_oom.pickle"));
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].private_pool_segments, 0);
  EXPECT_FALSE(has_verdict(d, VerdictId::kPrivatePools));
  EXPECT_EQ(render_text(d).find("private memory pools"), std::string::npos);
}

TEST(PrivatePools, AGraphsPoolIsNoRoomForExpandableSegments) {
  // Replayed as one pool, the graph's 4 freed segments served the 40 MiB
  // (expandable_segments and max_split_size_mb "enough"); as the allocator
  // keeps them (a live graph's pool, never expandable), every page of the
  // default pool's expandable segment holds a live 5 MiB tensor and the
  // request needs 2 new pages: 176 + 40 > 200 under either setting.
  const Diagnosis d = testing::diagnose_file(testing::synthetic_fixture("cudagraph_fragmentation_oom.pickle"));
  ASSERT_FALSE(d.ooms.empty());
  const OomReport& o = oom_with_pools(d, false, 6, 96 * kMiB, 64 * kMiB);
  EXPECT_TRUE(o.fragmentation);
  EXPECT_EQ(o.reserved_free_bytes, 60 * kMiB);
  EXPECT_EQ(o.largest_free_block_bytes, 15 * kMiB);
  ASSERT_TRUE(d.expandable_replay.replayed) << d.expandable_replay.failure;
  EXPECT_FALSE(d.expandable_replay.fits);
  EXPECT_EQ(d.expandable_replay.smallest_cap_bytes, 0);  // 216 MiB, the cap's upper end, is needed
  EXPECT_EQ(d.expandable_replay.reserved_bytes, 176 * kMiB);
  EXPECT_EQ(d.expandable_replay.failed_event, o.event_index);
  ASSERT_TRUE(d.max_split_replay.replayed) << d.max_split_replay.failure;
  EXPECT_FALSE(d.max_split_replay.fits);
  const Recommendation* expandable = find_fix(d, FixId::kExpandableSegments);
  ASSERT_NE(expandable, nullptr);
  EXPECT_TRUE(expandable->replayed);
  EXPECT_FALSE(expandable->replay_fits);
  // Running without the graph frees what the graph's pool holds free: the
  // first fix, and its verdict leads fragmentation's (Note [Fragmentation
  // first]).
  ASSERT_FALSE(d.recommendations.empty());
  EXPECT_EQ(d.recommendations.front().id, FixId::kPrivatePools);
  ASSERT_GE(d.verdicts.size(), 2u);
  EXPECT_EQ(d.verdicts[0].id, VerdictId::kPrivatePools);
  EXPECT_EQ(d.verdicts[1].id, VerdictId::kFragmentation);
}

/// A trace by hand: a graph's pool (1) holding a free 32 MiB block at
/// kGraph, a default 24 MiB tensor at kEager, then a 30 MiB request that
/// failed under a cap of 60 MiB (56 reserved).
SettingReplayInput graph_then_eager(const std::vector<TraceEvent>& trace) {
  constexpr int64_t kGraph = int64_t{1} << 40;
  SettingReplayInput in;
  in.trace = &trace;
  in.oom_index = 3;
  in.still_needed_bytes = 30 * kMiB;
  in.private_pool_ranges = {{kGraph, 32 * kMiB, 1}};
  in.cap_is_budget = true;
  in.cap_low_bytes = 60 * kMiB;
  in.cap_high_bytes = 90 * kMiB;
  return in;
}

TEST(PrivatePools, ARequestDuringCaptureIsReplayedInTheGraphsPool) {
  constexpr int64_t kGraph = int64_t{1} << 40;
  constexpr int64_t kEager = int64_t{2} << 40;
  using testing::trace_event;
  const std::vector<TraceEvent> trace = {
      trace_event(TraceAction::kAlloc, kGraph, 32 * kMiB), trace_event(TraceAction::kFreeCompleted, kGraph, 32 * kMiB),
      trace_event(TraceAction::kAlloc, kEager, 24 * kMiB), trace_event(TraceAction::kOom, 0, 30 * kMiB)};
  alloc_rules::AllocatorConfig expandable;
  expandable.expandable_segments = true;
  // Recording a graph: the request goes to its pool, whose free block serves it.
  SettingReplayInput in = graph_then_eager(trace);
  in.request_in_graph_capture = true;
  const SettingReplay captured = replay_with_setting(in, expandable);
  ASSERT_TRUE(captured.replayed) << captured.failure;
  EXPECT_TRUE(captured.fits);
  EXPECT_EQ(captured.reserved_bytes, 32 * kMiB + 40 * kMiB);  // the graph's segment, 2 pages of 20 MiB
  // Eager: the default pool's 2 pages hold 16 MiB free, and a third page
  // beside the graph's segment, which it cannot use, passes the cap.
  const SettingReplay eager = replay_with_setting(graph_then_eager(trace), expandable);
  ASSERT_TRUE(eager.replayed) << eager.failure;
  EXPECT_FALSE(eager.fits);
  EXPECT_EQ(eager.reserved_bytes, 32 * kMiB + 40 * kMiB);
}

}  // namespace
}  // namespace oomtune::diagnose
