// Memory on other CUDA streams (Note [Memory on other streams],
// analysis.cpp): a block cached for one stream serves no request of another.
//
// cross_stream_oom.pickle (scripts/make_snapshot_fixtures.py) is built to
// these numbers under a 200 MiB cap: a side stream's 120 MiB staging tensor,
// freed, then a 4 MiB tensor of that stream at the start of its segment
// (116 MiB free behind it); the default stream's forward holds 60 MiB in a
// segment of its own and asks 48 MiB: 180 + 48 > 200, and the flush frees
// nothing (the side segment holds a live tensor).

#include <gtest/gtest.h>

#include "common/byte_size.h"
#include "diagnose/replay.h"
#include "diagnose/setting_replay.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

using testing::find_fix;
using testing::has_verdict;
using testing::trace_event;

constexpr int64_t kSideStream = 0x55D2C4A1B3E0;  // as the fixture's side stream

TEST(OtherStreams, ASideStreamsFreeBlockCannotServeTheDefaultStream) {
  const Diagnosis d = testing::diagnose_file(testing::synthetic_fixture("cross_stream_oom.pickle"));
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.stream, 0);
  EXPECT_EQ(o.reserved_bytes, 180 * kMiB);
  EXPECT_EQ(o.other_stream_segments, 1);
  EXPECT_EQ(o.other_stream_reserved_bytes, 120 * kMiB);
  EXPECT_EQ(o.other_stream_free_bytes, 116 * kMiB);
  EXPECT_EQ(o.other_stream_largest_free_block_bytes, 116 * kMiB);
  // What keeps the side segment reserved: the 4 MiB tensor prefetch() made.
  ASSERT_EQ(o.other_stream_holders.size(), 1u);
  EXPECT_EQ(o.other_stream_holders[0].site, "train.py:74 in prefetch");
  EXPECT_EQ(o.other_stream_holders[0].bytes, 4 * kMiB);
  EXPECT_EQ(o.other_stream_holders[0].blocks, 1);
  // The largest free block is the request's stream's: none. The free bytes
  // count every stream's, as "reserved but unallocated" does, so this is
  // fragmentation across streams.
  EXPECT_EQ(o.largest_free_block_bytes, 0);
  EXPECT_EQ(o.reserved_free_bytes, 116 * kMiB);
  EXPECT_TRUE(o.fragmentation);
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(d.verdicts[0].id, VerdictId::kFragmentation);
  EXPECT_TRUE(has_verdict(d, VerdictId::kOtherStreams));
  const Recommendation* one_stream = find_fix(d, FixId::kOtherStreams);
  ASSERT_NE(one_stream, nullptr);
  EXPECT_EQ(one_stream->frees_bytes, 116 * kMiB);
  // The replays keep the streams apart: under the snapshot's own settings
  // the request fails as it did; under expandable_segments the flush
  // unmaps the side segment's five free 20 MiB pages and it fits.
  EXPECT_TRUE(d.as_recorded_replay.reproduces(o.event_index)) << d.as_recorded_replay.failure;
  ASSERT_TRUE(d.expandable_replay.replayed) << d.expandable_replay.failure;
  EXPECT_TRUE(d.expandable_replay.fits);
  const std::string text = render_text(d);
  EXPECT_NE(text.find("largest free block in the large pool on the default stream 0 B"), std::string::npos) << text;
  EXPECT_NE(text.find("other streams: 1 segment, 120.00 MiB reserved, 116.00 MiB free, largest free block of the "
                      "large pool 116.00 MiB (none of it usable by this request, on the default stream)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("      kept reserved by the tensors alive in them: 4.00 MiB train.py:74 in prefetch (1 block)\n"),
            std::string::npos)
      << text;
  // The map names the side stream's segment's stream, and only that one's.
  const std::string svg = render_svg(d);
  EXPECT_NE(svg.find("(large pool; stream 0x55d2c4a1b3e0)"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("default stream"), std::string::npos);
  const nlohmann::json json = testing::json_without_file(d);
  EXPECT_EQ(json["ooms"][0]["other_stream_free_bytes"], 116 * kMiB);
  EXPECT_EQ(json["ooms"][0]["stream"], 0);
  EXPECT_EQ(json["ooms"][0]["other_stream_holders"][0]["site"], "train.py:74 in prefetch");
}

TEST(OtherStreams, OneStreamChangesNothing) {
  // Every segment and event of this fixture is the default stream's.
  const Diagnosis d = testing::diagnose_file(testing::synthetic_fixture("cudagraph_fragmentation_oom.pickle"));
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].other_stream_segments, 0);
  EXPECT_EQ(d.ooms[0].other_stream_free_bytes, 0);
  EXPECT_FALSE(has_verdict(d, VerdictId::kOtherStreams));
  EXPECT_EQ(find_fix(d, FixId::kOtherStreams), nullptr);
  const std::string text = render_text(d);
  EXPECT_EQ(text.find("other streams:"), std::string::npos);
  EXPECT_EQ(text.find("on the default stream"), std::string::npos);
}

TEST(OtherStreams, ReplayedAsOneStreamASideStreamsBlockServedTheRequest) {
  // The fixture's trace by hand: the side stream's 120 MiB at kSide freed,
  // its 4 MiB there, the default stream's 60 MiB at kDefault, then 48 MiB
  // refused under a cap in [180, 228) MiB.
  constexpr int64_t kSide = int64_t{1} << 40;
  constexpr int64_t kDefault = int64_t{2} << 40;
  Snapshot snapshot;
  snapshot.streams = {kSideStream, 0};
  const std::vector<TraceEvent> trace = {trace_event(TraceAction::kAlloc, kSide, 120 * kMiB, 0),
                                         trace_event(TraceAction::kFreeCompleted, kSide, 120 * kMiB, 0),
                                         trace_event(TraceAction::kAlloc, kSide, 4 * kMiB, 0),
                                         trace_event(TraceAction::kAlloc, kDefault, 60 * kMiB, 1),
                                         trace_event(TraceAction::kOom, 0, 48 * kMiB, 1)};
  SettingReplayInput in;
  in.trace = &trace;
  in.snapshot = &snapshot;
  in.oom_index = 4;
  in.still_needed_bytes = 48 * kMiB;
  in.cap_is_budget = true;
  in.cap_low_bytes = 180 * kMiB;
  in.cap_high_bytes = 228 * kMiB;
  const alloc_rules::AllocatorConfig as_recorded;
  const SettingReplay streams = replay_as_recorded(in, as_recorded);
  ASSERT_TRUE(streams.replayed) << streams.failure;
  EXPECT_TRUE(streams.reproduces(4));
  EXPECT_EQ(streams.reserved_bytes, 180 * kMiB);
  // Without the events' streams every request is the default stream's:
  // the 60 MiB and then the 48 MiB go into the side stream's 116 MiB free
  // block, and nothing beyond its 120 MiB segment is reserved.
  in.snapshot = nullptr;
  const SettingReplay one_stream = replay_as_recorded(in, as_recorded);
  ASSERT_TRUE(one_stream.replayed) << one_stream.failure;
  EXPECT_TRUE(one_stream.fits);
  EXPECT_EQ(one_stream.reserved_bytes, 120 * kMiB);
}

TEST(OtherStreams, TheReplayKeepsEachStreamsRangesApart) {
  // Two expandable mappings that touch, of two streams, then a 4 MiB tensor
  // in the first: two segments, not one; the free figures by stream. The
  // same mappings on one stream are one segment.
  constexpr int64_t kBase = int64_t{1} << 40;
  constexpr int64_t kOther = 0x7f00;
  auto snapshot_of = [&](int64_t second_stream) {
    Snapshot s;
    s.streams = {kSideStream, second_stream};
    s.device_traces = {{trace_event(TraceAction::kSegmentMap, kBase, 20 * kMiB, 0),
                        trace_event(TraceAction::kSegmentMap, kBase + 20 * kMiB, 20 * kMiB, 1),
                        trace_event(TraceAction::kAlloc, kBase, 4 * kMiB, 0)}};
    return s;
  };
  const Snapshot two = snapshot_of(kOther);
  Replay replay(two, 0, alloc_rules::AllocatorConfig{}, nullptr, 0);
  for (size_t i = 0; i < two.device_traces[0].size(); ++i) replay.apply(i);
  ASSERT_EQ(replay.ranges().size(), 2u);
  EXPECT_EQ(replay.ranges().begin()->second.stream, kSideStream);
  ASSERT_NE(replay.range_at(kBase + 25 * kMiB), nullptr);
  EXPECT_EQ(replay.range_at(kBase + 25 * kMiB)->stream, kOther);
  EXPECT_EQ(replay.range_at(kBase + 40 * kMiB), nullptr);
  const RangeScope side(PoolScope::kAll, StreamScope::kOnly, kSideStream);
  const RangeScope not_side(PoolScope::kAll, StreamScope::kOthers, kSideStream);
  EXPECT_EQ(replay.segments_in(side), 1);
  EXPECT_EQ(replay.reserved_bytes_in(not_side), 20 * kMiB);
  EXPECT_EQ(replay.largest_free_block(alloc_rules::Pool::kLarge, side), 16 * kMiB);
  EXPECT_EQ(replay.free_bytes(alloc_rules::Pool::kLarge, not_side), 20 * kMiB);
  EXPECT_EQ(replay.largest_free_block(alloc_rules::Pool::kLarge), 20 * kMiB);  // every stream's
  EXPECT_EQ(replay.fully_free_segment_bytes(not_side), 20 * kMiB);

  const Snapshot one = snapshot_of(kSideStream);
  Replay merged(one, 0, alloc_rules::AllocatorConfig{}, nullptr, 0);
  for (size_t i = 0; i < one.device_traces[0].size(); ++i) merged.apply(i);
  ASSERT_EQ(merged.ranges().size(), 1u);
  EXPECT_EQ(merged.ranges().begin()->second.size, 40 * kMiB);
  EXPECT_EQ(merged.largest_free_block(alloc_rules::Pool::kLarge, side), 36 * kMiB);
}

}  // namespace
}  // namespace oomtune::diagnose
