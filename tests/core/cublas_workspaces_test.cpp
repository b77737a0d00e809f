// with_cublas_workspaces (trial/cublas_workspaces.h): the simulator's input
// gains one never-freed allocation per thread's first cuBLAS call, placed
// before the event recorded there, and the replay's end moves with it.

#include "trial/cublas_workspaces.h"

#include <gtest/gtest.h>

namespace oomtune {
namespace {

TrackedEvent event(TrackedEvent::Kind kind, uint64_t address, int64_t bytes, Phase phase) {
  TrackedEvent e;
  e.kind = kind;
  e.address = address;
  e.bytes = bytes;
  e.phase = phase;
  return e;
}

TEST(CublasWorkspaces, EachThreadsWorkspaceIsAllocatedBeforeItsFirstCallsEvent) {
  using Kind = TrackedEvent::Kind;
  const std::vector<TrackedEvent> events = {
      event(Kind::kAlloc, 1, 100, Phase::kForward),  event(Kind::kAlloc, 2, 200, Phase::kForward),
      event(Kind::kFree, 1, 100, Phase::kBackward),  event(Kind::kAlloc, 3, 300, Phase::kBackward),
      event(Kind::kFree, 2, 200, Phase::kOptimizer),
  };
  CublasCalls calls;
  calls.training_thread = CublasCall{1, Phase::kForward};   // before the 200 B block
  calls.autograd_thread = CublasCall{3, Phase::kBackward};  // before the 300 B block
  std::size_t end = 4;                                      // the replay stops before the last free
  const std::vector<TrackedEvent> out = with_cublas_workspaces(events, calls, 1000, 0, 7, end);
  ASSERT_EQ(out.size(), 7u);
  EXPECT_EQ(end, 6u);  // the same moment: before the last free
  EXPECT_EQ(out[0].address, 1u);
  EXPECT_EQ(out[1].bytes, 1000);
  EXPECT_EQ(out[1].kind, Kind::kAlloc);
  EXPECT_EQ(out[1].pool, MemoryPool::kDevice);
  EXPECT_EQ(out[1].phase, Phase::kForward);
  EXPECT_EQ(out[1].op, 7u);  // the name a failed request gives
  EXPECT_EQ(out[4].op, 7u);
  EXPECT_EQ(out[2].op, 0u);  // the tracked events keep theirs
  EXPECT_EQ(out[2].address, 2u);
  EXPECT_EQ(out[3].address, 1u);  // the free of block 1
  EXPECT_EQ(out[4].bytes, 1000);
  EXPECT_EQ(out[4].phase, Phase::kBackward);
  EXPECT_NE(out[4].address, out[1].address);
  EXPECT_EQ(out[1].address % 64, 1u);  // odd: no 64-byte-aligned tracked block has it
  EXPECT_EQ(out[4].address % 64, 3u);
  EXPECT_EQ(out[5].address, 3u);
  EXPECT_EQ(out[6].kind, Kind::kFree);
  for (const TrackedEvent& e : out) {  // the workspaces are never freed
    if (e.kind == Kind::kFree) {
      EXPECT_TRUE(e.address == 1u || e.address == 2u);
    }
  }
}

// cuBLASLt's workspace (a matmul with a bias: +1 MiB on an H200, Note
// [cuBLAS calls]) comes after the cuBLAS one of the same event, at its own
// size and address; with no size given it is left out.
TEST(CublasWorkspaces, TheCublasLtWorkspaceFollowsAtItsThreadsFirstBiasMatmul) {
  using Kind = TrackedEvent::Kind;
  const std::vector<TrackedEvent> events = {event(Kind::kAlloc, 64, 100, Phase::kForward),
                                            event(Kind::kAlloc, 128, 200, Phase::kForward)};
  CublasCalls calls;
  calls.training_thread = CublasCall{0, Phase::kForward};
  calls.lt_training_thread = CublasCall{0, Phase::kForward};
  calls.lt_autograd_thread = CublasCall{1, Phase::kBackward};
  std::size_t end = 2;
  const std::vector<TrackedEvent> out = with_cublas_workspaces(events, calls, 1000, 10, 7, end);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(end, 5u);
  EXPECT_EQ(out[0].bytes, 1000);
  EXPECT_EQ(out[1].bytes, 10);
  EXPECT_EQ(out[1].phase, Phase::kForward);
  EXPECT_EQ(out[2].address, 64u);
  EXPECT_EQ(out[3].bytes, 10);
  EXPECT_EQ(out[3].phase, Phase::kBackward);
  EXPECT_EQ(out[4].address, 128u);
  EXPECT_NE(out[0].address, out[1].address);
  EXPECT_NE(out[1].address, out[3].address);
  end = 2;
  EXPECT_EQ(with_cublas_workspaces(events, calls, 1000, 0, 7, end).size(), 3u);
}

TEST(CublasWorkspaces, ACallAtOrPastTheEndAndNoCallsInsertNothing) {
  const std::vector<TrackedEvent> events = {event(TrackedEvent::Kind::kAlloc, 1, 100, Phase::kForward),
                                            event(TrackedEvent::Kind::kFree, 1, 100, Phase::kForward)};
  CublasCalls calls;
  calls.autograd_thread = CublasCall{1, Phase::kBackward};
  std::size_t end = 1;
  EXPECT_EQ(with_cublas_workspaces(events, calls, 1000, 0, 7, end).size(), 2u);
  EXPECT_EQ(end, 1u);
  end = 2;
  EXPECT_EQ(with_cublas_workspaces(events, CublasCalls{}, 1000, 0, 7, end).size(), 2u);
  EXPECT_EQ(end, 2u);
  // A call after every event allocates at the end.
  calls.autograd_thread = CublasCall{2, Phase::kBackward};
  end = 3;
  const std::vector<TrackedEvent> out = with_cublas_workspaces(events, calls, 1000, 0, 7, end);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].bytes, 1000);
  EXPECT_EQ(end, 4u);
}

}  // namespace
}  // namespace oomtune
