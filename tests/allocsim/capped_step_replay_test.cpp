// replay_capped_step and smallest_running_cap (allocsim/capped_step_replay.h)
// on steps made by hand, the allocator's answers worked out in the comments
// from PyTorch's CUDACachingAllocator.cpp rules: a request of 1-10 MiB gets a
// 20 MiB segment (kLargeBuffer), one of 10 MiB or more a segment of its size
// rounded to 2 MiB; a cudaMalloc past the cap frees the cached segments and
// retries once (num_alloc_retries) before the request fails.

#include "allocsim/capped_step_replay.h"

#include <gtest/gtest.h>

#include "common/byte_size.h"

namespace oomtune::allocsim {
namespace {

// A lasting 8 MiB activation A, a 16 MiB workspace W freed before the next
// request, then a lasting 8 MiB B.
StepEvents workspace_between_activations() {
  StepEvents step;
  step.events = {alloc_event(1, 8 * kMiB),
                 alloc_event(2, 16 * kMiB),
                 free_event(2),
                 alloc_event(3, 8 * kMiB),
                 free_event(1),
                 free_event(3)};
  return step;
}

TEST(TransientRequests, AreTheRequestsFreedBeforeTheNextOneButNotTheLast) {
  StepEvents step = workspace_between_activations();
  // A's free comes after B's request, W's before it; B is freed last but
  // is the step's last request, and then nothing was asked after it.
  EXPECT_EQ(transient_requests(step.events), (std::vector<bool>{false, true, false, false, false, false}));
  // A free that names an earlier request than the latest does not count.
  const std::vector<AllocEvent> crossed = {alloc_event(1, 1), alloc_event(2, 1), free_event(1), alloc_event(3, 1)};
  EXPECT_EQ(transient_requests(crossed), (std::vector<bool>{false, false, false, false}));
  EXPECT_TRUE(transient_requests({}).empty());
}

TEST(CappedStepReplay, AWorkspaceWithoutRoomGivesWayAndTheStepRuns) {
  const StepEvents step = workspace_between_activations();
  // No cap: A's 20 MiB segment keeps 12 MiB free, too little for W, which
  // gets a 16 MiB segment of its own; B fits beside A: 36 MiB reserved.
  const CappedStepReplay free_run = replay_capped_step(step, 0);
  EXPECT_TRUE(free_run.ran);
  EXPECT_EQ(free_run.peak_reserved_bytes, 36 * kMiB);
  EXPECT_EQ(free_run.given_way, 0);
  // Capped at 20 MiB: W's segment would pass the cap and nothing cached is
  // free, so W gives way (its kernel runs another engine); B still fits.
  const CappedStepReplay capped = replay_capped_step(step, 20 * kMiB);
  EXPECT_TRUE(capped.ran);
  EXPECT_EQ(capped.peak_reserved_bytes, 20 * kMiB);
  EXPECT_EQ(capped.given_way, 1);
  EXPECT_EQ(capped.given_way_bytes, 16 * kMiB);
  EXPECT_EQ(capped.failed_request_bytes, 0);
  // Under 20 MiB A's segment cannot be made: A is lasting, the step fails.
  const CappedStepReplay short_of_a = replay_capped_step(step, 18 * kMiB);
  EXPECT_FALSE(short_of_a.ran);
  EXPECT_EQ(short_of_a.failed_request_bytes, 8 * kMiB);
  EXPECT_EQ(smallest_running_cap(step, 2 * kMiB), 20 * kMiB);
}

TEST(CappedStepReplay, ALastingRequestWithoutRoomEndsTheStep) {
  // W is freed only after B's request: it is lasting, and at 20 MiB it
  // fails where the workspace gave way.
  StepEvents step;
  step.events = {alloc_event(1, 8 * kMiB), alloc_event(2, 16 * kMiB), alloc_event(3, 8 * kMiB), free_event(2)};
  const CappedStepReplay capped = replay_capped_step(step, 20 * kMiB);
  EXPECT_FALSE(capped.ran);
  EXPECT_EQ(capped.failed_request_bytes, 16 * kMiB);
  EXPECT_EQ(capped.given_way, 0);
  // A (20 MiB segment) and W (16 MiB) are both alive when B comes; B fits in
  // A's free 12 MiB: 36 MiB.
  EXPECT_EQ(smallest_running_cap(step, 2 * kMiB), 36 * kMiB);
}

TEST(CappedStepReplay, TheCapFreesTheCacheWhereNoCapWouldKeepIt) {
  // X (16 MiB) freed, then Y (24 MiB), which the cached 16 MiB block cannot
  // serve. No cap: both segments stay, 40 MiB. Capped at 30: Y's cudaMalloc
  // would pass it, so the allocator frees the cached segment and retries:
  // 24 MiB reserved, one flush. Below 24 MiB Y cannot be had.
  StepEvents step;
  step.persistent_bytes = {};
  step.events = {alloc_event(1, 16 * kMiB), free_event(1), alloc_event(2, 24 * kMiB), free_event(2)};
  EXPECT_EQ(replay_capped_step(step, 0).peak_reserved_bytes, 40 * kMiB);
  const CappedStepReplay capped = replay_capped_step(step, 30 * kMiB);
  EXPECT_TRUE(capped.ran);
  EXPECT_EQ(capped.cache_flushes, 1);
  EXPECT_EQ(capped.peak_reserved_bytes, 24 * kMiB);
  EXPECT_EQ(smallest_running_cap(step, 2 * kMiB), 24 * kMiB);
}

TEST(CappedStepReplay, PersistentAllocationsComeFirstAndUnknownFreesFreeNothing) {
  // 12 MiB of weights (a 12 MiB segment), then the step frees the previous
  // step's gradient (id 99, never requested here) and asks for 12 MiB more.
  StepEvents step;
  step.persistent_bytes = {12 * kMiB};
  step.events = {free_event(99), alloc_event(1, 12 * kMiB), free_event(1)};
  EXPECT_EQ(replay_capped_step(step, 0).peak_reserved_bytes, 24 * kMiB);
  const CappedStepReplay capped = replay_capped_step(step, 22 * kMiB);
  EXPECT_FALSE(capped.ran);
  EXPECT_EQ(capped.failed_request_bytes, 12 * kMiB);
  EXPECT_EQ(smallest_running_cap(step, 2 * kMiB), 24 * kMiB);
  // Weights past the cap: the step does not start.
  EXPECT_FALSE(replay_capped_step(step, 10 * kMiB).ran);
  EXPECT_EQ(smallest_running_cap(StepEvents{}, 2 * kMiB), 0);
}

}  // namespace
}  // namespace oomtune::allocsim
