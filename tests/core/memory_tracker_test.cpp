#include "probes/memory_tracker.h"

#include <stdexcept>
#include <tuple>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include "probes/backward_activation_peak.h"

namespace oomtune {
namespace {

constexpr int64_t kFloats = 1 << 20;          // 4 MiB of float32
constexpr int64_t kBytes = kFloats * 4;

TEST(MemoryTracker, CountsLiveAndPeakBytesPerPhase) {
  MemoryTracker tracker;
  const int64_t base = tracker.live_bytes();
  tracker.begin_phase(Phase::kForward);
  {
    at::Tensor a = at::empty({kFloats}, at::kFloat);
    at::Tensor b = at::empty({kFloats}, at::kFloat);
    EXPECT_EQ(tracker.live_bytes() - base, 2 * kBytes);
    EXPECT_EQ(tracker.block_bytes(a.data_ptr()), kBytes);
  }
  EXPECT_EQ(tracker.live_bytes(), base);
  tracker.begin_phase(Phase::kBackward);
  at::Tensor c = at::empty({kFloats / 2}, at::kFloat);
  tracker.end_phase();
  const PhaseMemory forward = tracker.phase(Phase::kForward);
  EXPECT_EQ(forward.peak_bytes - forward.start_bytes, 2 * kBytes);
  EXPECT_EQ(forward.allocations, 2);
  EXPECT_EQ(forward.allocated_bytes, 2 * kBytes);
  EXPECT_EQ(forward.end_bytes, base);
  const PhaseMemory backward = tracker.phase(Phase::kBackward);
  EXPECT_EQ(backward.end_bytes - base, kBytes / 2);
  EXPECT_EQ(tracker.peak_bytes() - base, 2 * kBytes);
}

TEST(MemoryTracker, RestoresThePreviousAllocator) {
  c10::Allocator* before = c10::GetCPUAllocator();
  at::Tensor survivor;
  {
    MemoryTracker tracker;
    EXPECT_EQ(c10::GetCPUAllocator(), &tracker);
    survivor = at::ones({1000}, at::kFloat);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  // A block that outlives its tracker is still readable and freed cleanly.
  EXPECT_FLOAT_EQ(survivor.sum().item<float>(), 1000.0f);
  survivor = at::Tensor();
  MemoryTracker second;  // a new tracker starts from zero
  EXPECT_EQ(second.live_bytes(), 0);
}

TEST(MemoryTracker, BudgetThrowsOutOfMemoryAndLeavesNothingBehind) {
  TrackerOptions options;
  options.budget_bytes = 3 * kBytes;
  MemoryTracker tracker(options);
  at::Tensor a = at::empty({kFloats}, at::kFloat);
  at::Tensor b = at::empty({kFloats}, at::kFloat);
  EXPECT_THROW(at::empty({2 * kFloats}, at::kFloat), c10::OutOfMemoryError);
  EXPECT_EQ(tracker.out_of_memory_count(), 1);
  EXPECT_EQ(tracker.live_bytes(), 2 * kBytes);
  a = at::Tensor();
  b = at::Tensor();
  EXPECT_EQ(tracker.live_bytes(), 0);
  EXPECT_NO_THROW(at::empty({3 * kFloats}, at::kFloat));
}

TEST(MemoryTracker, HostScopeSeparatesHostFromDeviceBytes) {
  MemoryTracker tracker;
  at::Tensor device = at::empty({kFloats}, at::kFloat);
  at::Tensor host;
  {
    HostMemoryScope scope;
    EXPECT_EQ(current_memory_pool(), MemoryPool::kHost);
    host = at::empty({2 * kFloats}, at::kFloat);
  }
  EXPECT_EQ(current_memory_pool(), MemoryPool::kDevice);
  EXPECT_EQ(tracker.live_bytes(MemoryPool::kDevice), kBytes);
  EXPECT_EQ(tracker.live_bytes(MemoryPool::kHost), 2 * kBytes);
  host = at::Tensor();
  EXPECT_EQ(tracker.live_bytes(MemoryPool::kHost), 0);
}

TEST(MemoryTracker, LargestAllocationNamesItsOperatorAndPhase) {
  MemoryTracker tracker;
  at::Tensor x = at::randn({64, 256});
  at::Tensor w = at::randn({256, 4096});
  tracker.reset_statistics();
  tracker.begin_phase(Phase::kForward);
  at::Tensor y = at::mm(x, w);  // 64 * 4096 * 4 = 1 MiB, the largest
  at::Tensor z = at::relu(at::randn({16}));
  tracker.end_phase();
  const LargestAllocation largest = tracker.largest();
  EXPECT_EQ(largest.bytes, 64 * 4096 * 4);
  EXPECT_EQ(largest.op, "aten::mm");
  EXPECT_EQ(largest.phase, Phase::kForward);
}

TEST(MemoryTracker, OpsInsideAnOomtuneOperatorAreNamedUnderIt) {
  // A checkpointed block's ops run inside the recompute operator
  // oomtune::checkpoint; the label names the model's op under it.
  MemoryTracker tracker;
  at::Tensor x = at::randn({64, 256});
  at::Tensor w = at::randn({256, 4096});
  tracker.reset_statistics();
  tracker.begin_phase(Phase::kForward);
  at::Tensor y;
  {
    RECORD_FUNCTION("oomtune::checkpoint", std::vector<c10::IValue>());
    y = at::mm(x, w);
  }
  tracker.end_phase();
  EXPECT_EQ(tracker.largest().op, "oomtune::checkpoint > aten::mm");
}

TEST(MemoryTracker, RecordsEventsInOrderWhenAsked) {
  TrackerOptions options;
  options.record_events = true;
  options.attribute_ops = true;
  MemoryTracker tracker(options);
  tracker.begin_phase(Phase::kBackward);
  { at::Tensor a = at::zeros({kFloats}, at::kFloat); }
  const auto events = tracker.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, TrackedEvent::Kind::kAlloc);
  EXPECT_EQ(events[1].kind, TrackedEvent::Kind::kFree);
  EXPECT_EQ(events[0].address, events[1].address);
  EXPECT_EQ(events[0].bytes, kBytes);
  EXPECT_EQ(events[0].phase, Phase::kBackward);
  EXPECT_EQ(tracker.op_names()[events[0].op], "aten::zeros");
}

// A backward pass by hand, 1000 bytes live at its start, four autograd node
// runs: the moment where live bytes less the gradients made so far are
// highest, and the same backward as a later micro-batch of an accumulated
// step (a gradient is pending, beside the stored ones, until its run ends),
// worked out below as (live, gradients, pending).
TEST(BackwardActivationPeak, IsWhereLiveBytesLessNewGradientsAreHighest) {
  using K = TrackedEvent::Kind;
  auto event = [](K kind, uint64_t address, int64_t bytes, uint32_t run, MemoryPool pool = MemoryPool::kDevice) {
    return TrackedEvent{kind, pool, Phase::kBackward, address, bytes, 0, run};
  };
  const std::vector<TrackedEvent> events = {
      event(K::kAlloc, 1, 100, 1),                     // logits' gradient: (1100, 0, 0)
      event(K::kAlloc, 2, 400, 2),                     // run 2: gradient of W2: (1500, 400, 400)
      event(K::kAlloc, 3, 300, 2),                     // and of h: (1800, 400, 400) -> later 1800
      event(K::kFree, 1, 100, 0),                      // 1700
      event(K::kAlloc, 4, 2000, 3, MemoryPool::kHost), // host: not counted
      event(K::kAlloc, 5, 350, 3),                     // run 3, a temporary: (2050, 400, 0) -> 1650
      event(K::kFree, 5, 350, 0),                      // 1700
      event(K::kFree, 3, 300, 0),                      // 1400
      event(K::kAlloc, 5, 50, 4),                      // run 4: gradient of W1 at that address: (1450, 450, 50)
  };
  const std::unordered_set<uint64_t> gradients = {2, 5};
  using Peak = std::tuple<int64_t, int64_t, int64_t>;  // live, gradients, accumulating
  auto find = [&](std::size_t begin, std::size_t end, int64_t live, const std::unordered_set<uint64_t>& named) {
    const BackwardActivationPeak p = find_backward_activation_peak(events, begin, end, live, named);
    return Peak{p.live_bytes, p.gradient_bytes, p.accumulating_bytes};
  };
  EXPECT_EQ(find(0, events.size(), 1000, gradients), Peak(2050, 400, 1800));
  // Before the temporary: the gradient of h, with W2's pending.
  EXPECT_EQ(find(0, 3, 1000, gradients), Peak(1800, 400, 1800));
  // No gradients named: the highest live bytes, both ways.
  EXPECT_EQ(find(0, events.size(), 1000, {}), Peak(2050, 0, 2050));
  // Nothing happened: the start.
  EXPECT_EQ(find(3, 3, 1340, gradients), Peak(1340, 0, 1340));
  EXPECT_THROW(find_backward_activation_peak(events, 4, 3, 0, gradients), std::out_of_range);
  EXPECT_THROW(find_backward_activation_peak(events, 0, events.size() + 1, 0, gradients), std::out_of_range);
}

// Allocations name the run of their innermost enclosing frame: two calls of
// the same operator are two runs, and an op outside any frame has none.
TEST(MemoryTracker, EventsNameTheRunOfTheirEnclosingFrame) {
  TrackerOptions options;
  options.record_events = true;
  MemoryTracker tracker(options);
  { at::Tensor outside = at::zeros({16}, at::kFloat); }
  for (int call = 0; call < 2; ++call) {
    RECORD_FUNCTION("oomtune::checkpoint", std::vector<c10::IValue>());
    at::Tensor a = at::zeros({16}, at::kFloat);
    at::Tensor b = at::zeros({16}, at::kFloat);
  }
  std::vector<uint32_t> runs;
  for (const TrackedEvent& e : tracker.events())
    if (e.kind == TrackedEvent::Kind::kAlloc) runs.push_back(e.frame_run);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(runs[0], 0u);
  EXPECT_NE(runs[1], 0u);
  EXPECT_EQ(runs[1], runs[2]);
  EXPECT_NE(runs[3], runs[1]);
  EXPECT_EQ(runs[3], runs[4]);
}

}  // namespace
}  // namespace oomtune
