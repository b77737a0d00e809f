// What was live at the measured step's peak, from hand-made event streams
// whose answer is read off by hand.

#include "probes/peak_composition.h"

#include <stdexcept>

#include <gtest/gtest.h>

#include "probes/probe_report.h"

namespace oomtune {
namespace {

TrackedEvent alloc(uint64_t address, int64_t bytes, uint32_t op, Phase phase, MemoryPool pool = MemoryPool::kDevice) {
  TrackedEvent e;
  e.kind = TrackedEvent::Kind::kAlloc;
  e.pool = pool;
  e.phase = phase;
  e.address = address;
  e.bytes = bytes;
  e.op = op;
  return e;
}

TrackedEvent release(uint64_t address, Phase phase, MemoryPool pool = MemoryPool::kDevice) {
  TrackedEvent e;
  e.kind = TrackedEvent::Kind::kFree;
  e.pool = pool;
  e.phase = phase;
  e.address = address;
  return e;
}

const std::vector<std::string> kOps = {"(unknown)", "aten::linear", "aten::zeros_like", "MmBackward0 > aten::mm"};

// A warm-up step, then the measured one (from index 5): weights at load
// (1000 B), optimizer state in the warm-up (2 x 300 B); in the measured
// step two activations (400 + 400 B by linear), a host block that never
// counts (5000 B), a free of a block the replay never saw, then in backward
// a gradient (100 B by mm) and a temporary (250 B by mm) that is freed, the
// activations freed, and a last 500 B that stays below the peak.
std::vector<TrackedEvent> two_steps() {
  return {
      alloc(1, 1000, 0, Phase::kLoad),                         // 0: weights
      alloc(2, 300, 2, Phase::kOptimizer),                     // 1: state
      alloc(3, 300, 2, Phase::kOptimizer),                     // 2: state
      alloc(4, 50, 1, Phase::kForward),                        // 3: the warm-up's activation
      release(4, Phase::kBackward),                            // 4
      alloc(10, 400, 1, Phase::kForward),                      // 5: measured step
      alloc(11, 400, 1, Phase::kForward),                      // 6
      alloc(12, 5000, 1, Phase::kForward, MemoryPool::kHost),  // 7: host
      release(99, Phase::kForward),                            // 8: never seen
      alloc(13, 100, 3, Phase::kBackward),                     // 9: gradient
      alloc(14, 250, 3, Phase::kBackward),                     // 10: temporary: the peak, 2750 B
      release(14, Phase::kBackward),                           // 11
      release(10, Phase::kBackward),                           // 12
      release(11, Phase::kBackward),                           // 13
      alloc(15, 500, 7, Phase::kOptimizer),                    // 14: an op index past the names
  };
}

TEST(PeakComposition, GroupsTheBlocksOfTheFirstHighestMomentByOperatorAndPhase) {
  const std::vector<TrackedEvent> events = two_steps();
  const PeakComposition c = find_peak_composition(events, 5, events.size(), kOps);
  EXPECT_EQ(c.phase, Phase::kBackward);
  EXPECT_EQ(c.live_bytes, 1000 + 600 + 800 + 100 + 250);
  // The two mm blocks are one group: 350 B in 2 blocks.
  const std::vector<PeakShare> grouped = {
      {"(unknown)", Phase::kLoad, true, 1000, 1},
      {"aten::linear", Phase::kForward, false, 800, 2},
      {"aten::zeros_like", Phase::kOptimizer, true, 600, 2},
      {"MmBackward0 > aten::mm", Phase::kBackward, false, 350, 2},
  };
  EXPECT_EQ(c.shares, grouped);
}

TEST(PeakComposition, ARangeThatNeverRisesIsTheMomentBeforeIt) {
  const std::vector<TrackedEvent> events = two_steps();
  // From the frees on (index 11): nothing rises above the 2750 B live
  // before it, but the 500 B at index 14 rises above nothing either: the
  // moment before the range holds.
  const PeakComposition c = find_peak_composition(events, 11, events.size(), kOps);
  EXPECT_EQ(c.live_bytes, 2750);
  EXPECT_EQ(c.phase, Phase::kBackward);
  // An empty range: the moment before it, its label read past the names.
  const PeakComposition empty = find_peak_composition(events, 15, 15, kOps);
  EXPECT_EQ(empty.live_bytes, 1000 + 600 + 100 + 500);
  ASSERT_EQ(empty.shares.size(), 4u);
  EXPECT_EQ(empty.shares[2], (PeakShare{"(unknown)", Phase::kOptimizer, true, 500, 1}));
  EXPECT_THROW(find_peak_composition(events, 6, 5, kOps), std::out_of_range);
  EXPECT_THROW(find_peak_composition(events, 0, events.size() + 1, kOps), std::out_of_range);
}

TEST(PeakComposition, TheLinesListTheLargestAndSumTheRest) {
  const std::vector<TrackedEvent> events = two_steps();
  const PeakComposition c = find_peak_composition(events, 5, events.size(), kOps);
  const std::vector<std::string> lines = peak_composition_lines(c, 2);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0],
            "at the peak          2.69 KiB of tensors live in backward, by the operator that allocated them:");
  EXPECT_EQ(lines[1], "        1000 B  the model's parameters and buffers, at load, 1 block");
  EXPECT_EQ(lines[2], "         800 B  aten::linear in forward, 2 blocks");
  EXPECT_EQ(lines[3], "         950 B  2 others (4 blocks; --json lists all)");
  EXPECT_EQ(peak_composition_lines(c, 10).size(), 5u);
  EXPECT_TRUE(peak_composition_lines(PeakComposition{}, 6).empty());
}

TEST(PeakComposition, RoundTripsThroughTheReportJson) {
  const std::vector<TrackedEvent> events = two_steps();
  ProbeReport r;
  r.peak_composition = find_peak_composition(events, 5, events.size(), kOps);
  const ProbeReport back = probe_report_from_json(to_json(r));
  EXPECT_EQ(back.peak_composition.phase, Phase::kBackward);
  EXPECT_EQ(back.peak_composition.live_bytes, r.peak_composition.live_bytes);
  EXPECT_EQ(back.peak_composition.shares, r.peak_composition.shares);
  // Not measured: no key, nothing back.
  EXPECT_FALSE(to_json(ProbeReport{}).contains("peak_composition"));
  EXPECT_EQ(probe_report_from_json(to_json(ProbeReport{})).peak_composition.live_bytes, 0);
}

}  // namespace
}  // namespace oomtune
