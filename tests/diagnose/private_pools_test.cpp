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

#include <gtest/gtest.h>

#include "common/byte_size.h"
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

}  // namespace
}  // namespace oomtune::diagnose
