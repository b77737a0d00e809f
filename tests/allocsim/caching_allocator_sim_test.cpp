// One synthetic stream per rule of the caching-allocator simulator, each
// with its expectations worked out by hand in the comments
// (c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.x).

#include "allocsim/caching_allocator_sim.h"

#include <gtest/gtest.h>

#include "common/byte_size.h"
#include "common/error.h"

namespace oomtune::allocsim {
namespace {

constexpr int64_t kKiB = int64_t{1} << 10;

SimOptions logged(SimOptions options = {}) {
  options.record_segment_log = true;
  return options;
}

std::uint64_t address(const CachingAllocatorSim& sim, std::uint64_t id) {
  const auto a = sim.address_of(id);
  EXPECT_TRUE(a.has_value()) << "id " << id << " is not live";
  return a.value_or(0);
}

TEST(CachingAllocatorSim, SmallRequestsShareA2MiBSegment) {
  CachingAllocatorSim sim(logged());
  ASSERT_TRUE(sim.malloc(1, 1000));  // -> 1024 bytes, small pool, new 2 MiB segment
  ASSERT_TRUE(sim.malloc(2, 3000));  // -> 3072 bytes from the rest of the same segment
  EXPECT_EQ(sim.reserved_bytes(), 2 * kMiB);
  EXPECT_EQ(sim.allocated_bytes(), 1024 + 3072);
  EXPECT_EQ(sim.result().num_device_alloc, 1);
  EXPECT_EQ(address(sim, 2), address(sim, 1) + 1024);  // carved right after the first
  EXPECT_EQ(sim.largest_free_block(), 2 * kMiB - 4096);
  ASSERT_EQ(sim.result().segment_log.size(), 1u);
  EXPECT_EQ(sim.result().segment_log[0].action, SegmentAction::kAlloc);
  EXPECT_EQ(sim.result().segment_log[0].bytes, 2 * kMiB);
}

TEST(CachingAllocatorSim, OneMiBIsStillSmall) {
  CachingAllocatorSim sim;
  ASSERT_TRUE(sim.malloc(1, kMiB));  // small pool: 2 MiB segment, 1 MiB left (>= 512: split)
  ASSERT_TRUE(sim.malloc(2, kMiB));  // takes the other half
  EXPECT_EQ(sim.reserved_bytes(), 2 * kMiB);
  ASSERT_TRUE(sim.malloc(3, kMiB));  // a second small segment
  EXPECT_EQ(sim.reserved_bytes(), 4 * kMiB);
  EXPECT_EQ(sim.result().num_device_alloc, 2);
}

TEST(CachingAllocatorSim, LargeRequestsBelow10MiBShareA20MiBSegment) {
  CachingAllocatorSim sim;
  ASSERT_TRUE(sim.malloc(1, kMiB + 1));  // -> 1 MiB + 512, large pool, 20 MiB segment
  EXPECT_EQ(sim.reserved_bytes(), 20 * kMiB);
  EXPECT_EQ(sim.allocated_bytes(), kMiB + 512);
  ASSERT_TRUE(sim.malloc(2, 8 * kMiB));  // fits in the 19 MiB - 512 left
  EXPECT_EQ(sim.reserved_bytes(), 20 * kMiB);
  EXPECT_EQ(sim.result().num_device_alloc, 1);
}

TEST(CachingAllocatorSim, RequestsFrom10MiBGetTheirOwnSegmentRoundedTo2MiB) {
  CachingAllocatorSim sim;
  ASSERT_TRUE(sim.malloc(1, 10 * kMiB));  // segment of exactly 10 MiB, nothing left
  EXPECT_EQ(sim.reserved_bytes(), 10 * kMiB);
  EXPECT_EQ(sim.largest_free_block(), 0);
  ASSERT_TRUE(sim.malloc(2, 10 * kMiB + 1));   // 10 MiB + 512 -> 12 MiB segment;
  EXPECT_EQ(sim.reserved_bytes(), 22 * kMiB);  // 2 MiB - 512 left (> 1 MiB): split off
  EXPECT_EQ(sim.allocated_bytes(), 20 * kMiB + 512);
  EXPECT_EQ(sim.largest_free_block(), 2 * kMiB - 512);
}

TEST(CachingAllocatorSim, LargePoolSplitsOnlyWhenMoreThan1MiBRemains) {
  // The fragmentation fixture's pairs: 9.5 MiB splits a 20 MiB segment
  // (10.5 MiB left); the second 9.5 MiB would leave exactly 1 MiB, which is
  // not > kSmallSize, so it gets the whole 10.5 MiB block.
  const int64_t k95 = 9961472;
  CachingAllocatorSim sim;
  ASSERT_TRUE(sim.malloc(1, k95));
  ASSERT_TRUE(sim.malloc(2, k95));
  EXPECT_EQ(sim.reserved_bytes(), 20 * kMiB);
  EXPECT_EQ(sim.allocated_bytes(), 20 * kMiB);  // 9.5 + 10.5 MiB
  EXPECT_EQ(sim.largest_free_block(), 0);
  // 9 MiB then 9.5 MiB: 1.5 MiB would be left, > 1 MiB: split.
  CachingAllocatorSim other;
  ASSERT_TRUE(other.malloc(1, 9 * kMiB));
  ASSERT_TRUE(other.malloc(2, k95));
  EXPECT_EQ(other.allocated_bytes(), 9 * kMiB + k95);
  EXPECT_EQ(other.largest_free_block(), 20 * kMiB - 9 * kMiB - k95);
}

TEST(CachingAllocatorSim, BestFitBySizeThenAddress) {
  CachingAllocatorSim sim;
  ASSERT_TRUE(sim.malloc(1, 12 * kMiB));  // segment A, 12 MiB, lowest address
  ASSERT_TRUE(sim.malloc(2, 14 * kMiB));  // segment B, 14 MiB
  ASSERT_TRUE(sim.malloc(3, 12 * kMiB));  // segment C, 12 MiB, highest address
  const std::uint64_t a = address(sim, 1);
  const std::uint64_t b = address(sim, 2);
  const std::uint64_t c = address(sim, 3);
  sim.free(3);
  sim.free(2);
  sim.free(1);
  // 11 MiB: fits 12@A, 12@C, 14@B; smallest size wins, then lowest address.
  ASSERT_TRUE(sim.malloc(4, 11 * kMiB));
  EXPECT_EQ(address(sim, 4), a);
  EXPECT_EQ(sim.allocated_bytes(), 12 * kMiB);  // 1 MiB left: not split
  ASSERT_TRUE(sim.malloc(5, 11 * kMiB));
  EXPECT_EQ(address(sim, 5), c);
  ASSERT_TRUE(sim.malloc(6, 11 * kMiB));  // only the 14 MiB block is left: split (3 MiB)
  EXPECT_EQ(address(sim, 6), b);
  EXPECT_EQ(sim.largest_free_block(), 3 * kMiB);
  EXPECT_EQ(sim.result().num_device_alloc, 3);
}

TEST(CachingAllocatorSim, FreedNeighboursCoalesce) {
  CachingAllocatorSim sim(logged());
  ASSERT_TRUE(sim.malloc(1, 4 * kMiB));  // [a 4][16 free] in one 20 MiB segment
  ASSERT_TRUE(sim.malloc(2, 4 * kMiB));  // [a 4][b 4][12 free]
  ASSERT_TRUE(sim.malloc(3, 4 * kMiB));  // [a 4][b 4][c 4][8 free]
  EXPECT_EQ(address(sim, 3), address(sim, 1) + 8 * kMiB);
  sim.free(2);  // [a][4 free][c][8 free]
  EXPECT_EQ(sim.largest_free_block(), 8 * kMiB);
  sim.free(1);  // [8 free][c][8 free]
  EXPECT_EQ(sim.largest_free_block(), 8 * kMiB);
  sim.empty_cache();  // the segment is still split: nothing to release
  EXPECT_EQ(sim.reserved_bytes(), 20 * kMiB);
  sim.free(3);  // one free 20 MiB block: the whole segment again
  EXPECT_EQ(sim.largest_free_block(), 20 * kMiB);
  sim.empty_cache();
  EXPECT_EQ(sim.reserved_bytes(), 0);
  EXPECT_EQ(sim.result().num_device_free, 1);
  ASSERT_EQ(sim.result().segment_log.size(), 2u);
  EXPECT_EQ(sim.result().segment_log[1].action, SegmentAction::kFree);
  EXPECT_EQ(sim.result().segment_log[1].bytes, 20 * kMiB);
}

TEST(CachingAllocatorSim, MaxSplitSizeKeepsOversizeBlocksForOversizeRequests) {
  SimOptions options;
  options.config.max_split_size = 40 * kMiB;
  CachingAllocatorSim sim(options);
  ASSERT_TRUE(sim.malloc(1, 50 * kMiB));  // oversize: own 50 MiB segment
  sim.free(1);
  ASSERT_TRUE(sim.malloc(2, 30 * kMiB));  // below max_split_size: may not take the 50 MiB block
  EXPECT_EQ(sim.reserved_bytes(), 80 * kMiB);
  ASSERT_TRUE(sim.malloc(3, 45 * kMiB));  // oversize, 50 < 45 + 20: takes it whole, unsplit
  EXPECT_EQ(sim.reserved_bytes(), 80 * kMiB);
  EXPECT_EQ(sim.allocated_bytes(), 80 * kMiB);
  EXPECT_EQ(sim.result().num_device_alloc, 2);
  ASSERT_TRUE(sim.malloc(4, 100 * kMiB));
  sim.free(4);
  // 60 MiB: the best fit is the cached 100 MiB block, but 100 >= 60 + 20
  // (max_non_split_rounding_size): refused, and no other block is tried.
  ASSERT_TRUE(sim.malloc(5, 60 * kMiB));
  EXPECT_EQ(sim.reserved_bytes(), 240 * kMiB);
  EXPECT_EQ(sim.result().num_device_alloc, 4);
}

TEST(CachingAllocatorSim, MaxNonSplitRoundingSizeWidensReuse) {
  SimOptions options;
  options.config.max_split_size = 40 * kMiB;
  options.config.max_non_split_rounding_size = 50 * kMiB;
  CachingAllocatorSim sim(options);
  ASSERT_TRUE(sim.malloc(1, 100 * kMiB));
  sim.free(1);
  ASSERT_TRUE(sim.malloc(2, 60 * kMiB));  // 100 < 60 + 50: reused whole
  EXPECT_EQ(sim.reserved_bytes(), 100 * kMiB);
  EXPECT_EQ(sim.allocated_bytes(), 100 * kMiB);
}

TEST(CachingAllocatorSim, MaxSplitSizeReleasesOversizeBlocksBeforeFlushing) {
  SimOptions options;
  options.budget_bytes = 100 * kMiB;
  options.config.max_split_size = 40 * kMiB;
  CachingAllocatorSim sim(logged(options));
  ASSERT_TRUE(sim.malloc(1, 70 * kMiB));
  sim.free(1);
  // 40 MiB: the 70 MiB block is refused (70 >= 40 + 20); cudaMalloc of 40 MiB
  // would pass the budget (110 > 100); release_available_cached_blocks frees
  // the 70 MiB block (the smallest oversize one >= 40 MiB) and the retry fits.
  ASSERT_TRUE(sim.malloc(2, 40 * kMiB));
  EXPECT_EQ(sim.reserved_bytes(), 40 * kMiB);
  EXPECT_EQ(sim.result().num_device_free, 1);
  EXPECT_EQ(sim.result().num_alloc_retries, 0);  // not a full flush
  EXPECT_FALSE(sim.result().oom);
}

TEST(CachingAllocatorSim, FlushAndRetryBeforeOutOfMemory) {
  SimOptions options;
  options.budget_bytes = 60 * kMiB;
  CachingAllocatorSim sim(logged(options));
  ASSERT_TRUE(sim.malloc(1, 30 * kMiB));
  sim.free(1);  // a cached, unsplit 30 MiB segment
  // 40 MiB: no cached block fits; 30 + 40 > 60: cudaMalloc fails; flush
  // frees the 30 MiB segment; the retry succeeds.
  ASSERT_TRUE(sim.malloc(2, 40 * kMiB));
  EXPECT_EQ(sim.result().num_alloc_retries, 1);
  EXPECT_EQ(sim.result().num_device_free, 1);
  EXPECT_EQ(sim.reserved_bytes(), 40 * kMiB);
  EXPECT_EQ(sim.result().peak_reserved_bytes, 40 * kMiB);
  EXPECT_FALSE(sim.result().oom);
  const auto& log = sim.result().segment_log;
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[1].action, SegmentAction::kFree);
  EXPECT_EQ(log[1].bytes, 30 * kMiB);
  EXPECT_EQ(log[1].event_index, 2);  // during the third event
  EXPECT_EQ(log[2].bytes, 40 * kMiB);
}

TEST(CachingAllocatorSim, OutOfMemoryUnderBudget) {
  SimOptions options;
  options.budget_bytes = 50 * kMiB;
  CachingAllocatorSim sim(options);
  ASSERT_TRUE(sim.malloc(1, 30 * kMiB));
  EXPECT_FALSE(sim.malloc(2, 30 * kMiB));  // 30 + 30 > 50, nothing cached to free
  const SimResult& r = sim.result();
  EXPECT_TRUE(r.oom);
  EXPECT_EQ(r.first_oom_event_index, 1);
  EXPECT_EQ(r.num_ooms, 1);
  EXPECT_EQ(r.num_alloc_retries, 1);
  ASSERT_EQ(r.ooms.size(), 1u);
  EXPECT_EQ(r.ooms[0].rounded_bytes, 30 * kMiB);
  EXPECT_EQ(r.ooms[0].segment_bytes, 30 * kMiB);
  EXPECT_EQ(r.ooms[0].reserved_bytes, 30 * kMiB);
  sim.free(2);  // the failed allocation: ignored
  sim.free(1);
  EXPECT_EQ(sim.allocated_bytes(), 0);
  ASSERT_TRUE(sim.malloc(3, 30 * kMiB));  // the cached segment serves it
}

TEST(CachingAllocatorSim, SplitSegmentsCannotBeFlushed) {
  // Fragmentation: 18 MiB is cached, but inside a segment that still holds
  // a 2 MiB tensor, so the flush cannot return it and 19 MiB fails.
  SimOptions options;
  options.budget_bytes = 30 * kMiB;
  CachingAllocatorSim sim(options);
  ASSERT_TRUE(sim.malloc(1, 2 * kMiB));  // 20 MiB segment, 18 MiB left free
  EXPECT_FALSE(sim.malloc(2, 19 * kMiB));
  EXPECT_EQ(sim.result().ooms[0].reserved_bytes - sim.result().ooms[0].allocated_bytes, 18 * kMiB);
  EXPECT_EQ(sim.result().num_device_free, 0);
}

TEST(CachingAllocatorSim, StopAtFirstOomIgnoresTheRest) {
  SimOptions options;
  options.budget_bytes = 50 * kMiB;
  options.stop_at_first_oom = true;
  const std::vector<AllocEvent> events = {alloc_event(1, 30 * kMiB), alloc_event(2, 30 * kMiB), free_event(1),
                                          alloc_event(3, 40 * kMiB)};
  const SimResult r = replay(events, options);
  EXPECT_EQ(r.first_oom_event_index, 1);
  EXPECT_EQ(r.num_ooms, 1);
  EXPECT_EQ(r.num_events, 4);
  EXPECT_EQ(r.allocated_bytes, 30 * kMiB);  // the free of 1 was ignored too
}

TEST(CachingAllocatorSim, GarbageCollectionFreesTheOldestCachedSegments) {
  // Budget 100 MiB, threshold 0.5: collect once reserved > 50 MiB.
  // get_free_block calls tick the large pool's clock: malloc 1 -> 1 (A cached
  // at 1 by free 1), malloc 2 -> 2 (B cached at 2), malloc 3 -> 3. Ages: A 2,
  // B 1, mean 1.5: A (30 MiB) is freed, which covers 62 - 50 = 12 MiB.
  SimOptions options;
  options.budget_bytes = 100 * kMiB;
  options.config.garbage_collection_threshold = 0.5;
  CachingAllocatorSim sim(logged(options));
  ASSERT_TRUE(sim.malloc(1, 30 * kMiB));
  sim.free(1);
  ASSERT_TRUE(sim.malloc(2, 32 * kMiB));  // reserved 30 <= 50: no collection
  sim.free(2);
  EXPECT_EQ(sim.reserved_bytes(), 62 * kMiB);
  ASSERT_TRUE(sim.malloc(3, 34 * kMiB));
  EXPECT_EQ(sim.reserved_bytes(), 66 * kMiB);  // 32 (B) + 34
  EXPECT_EQ(sim.result().num_device_free, 1);
  EXPECT_EQ(sim.result().num_alloc_retries, 0);
  EXPECT_EQ(sim.result().segment_log[2].action, SegmentAction::kFree);
  EXPECT_EQ(sim.result().segment_log[2].bytes, 30 * kMiB);
}

TEST(CachingAllocatorSim, GarbageCollectionNeedsABudget) {
  SimOptions options;
  options.config.garbage_collection_threshold = 0.5;  // no budget: PyTorch ignores it
  const std::vector<AllocEvent> events = {alloc_event(1, 30 * kMiB), free_event(1), alloc_event(2, 32 * kMiB),
                                          free_event(2), alloc_event(3, 34 * kMiB)};
  EXPECT_EQ(replay(events, options).reserved_bytes, 96 * kMiB);
}

TEST(CachingAllocatorSim, ExpandableSegmentsGrowByPages) {
  SimOptions options;
  options.config.expandable_segments = true;
  CachingAllocatorSim sim(logged(options));
  ASSERT_TRUE(sim.malloc(1, kKiB));  // small pool: one 2 MiB page mapped
  EXPECT_EQ(sim.reserved_bytes(), 2 * kMiB);
  ASSERT_TRUE(sim.malloc(2, 3 * kMiB));  // large pool: one 20 MiB page; 17 MiB left (split)
  EXPECT_EQ(sim.reserved_bytes(), 22 * kMiB);
  // 30 MiB: the free 17 MiB block plus one more 20 MiB page mapped behind
  // it make one 37 MiB block; 7 MiB stays free.
  ASSERT_TRUE(sim.malloc(3, 30 * kMiB));
  EXPECT_EQ(sim.reserved_bytes(), 42 * kMiB);
  EXPECT_EQ(address(sim, 3), address(sim, 2) + 3 * kMiB);  // contiguous in one segment
  EXPECT_EQ(sim.result().num_device_alloc, 3);             // three page maps
  EXPECT_EQ(sim.largest_free_block(), 7 * kMiB);
  sim.free(2);
  sim.free(3);        // one free 40 MiB mapped block
  sim.empty_cache();  // unmaps both large pages; the small page still holds id 1
  EXPECT_EQ(sim.reserved_bytes(), 2 * kMiB);
  EXPECT_EQ(sim.result().num_device_free, 1);  // one unmap of 40 MiB
  const auto& log = sim.result().segment_log;
  ASSERT_EQ(log.size(), 4u);
  EXPECT_EQ(log[3].action, SegmentAction::kUnmap);
  EXPECT_EQ(log[3].bytes, 40 * kMiB);
  // Without expandable segments the same requests reserve 2 + 20 + 30 MiB.
  const std::vector<AllocEvent> events = {alloc_event(1, kKiB), alloc_event(2, 3 * kMiB), alloc_event(3, 30 * kMiB)};
  EXPECT_EQ(replay(events, SimOptions{}).reserved_bytes, 52 * kMiB);
}

TEST(CachingAllocatorSim, ExpandableSegmentsAvoidAFragmentationOom) {
  // 20 tensors of 5 MiB under a 100 MiB budget, then tensors 2..5 freed and
  // 20 MiB requested.
  // Plain: four tensors per 20 MiB segment (5 segments = the budget); the
  // freed ones leave 10 MiB at the end of segment 0 and 10 MiB at the start
  // of segment 1, both split: no 20 MiB block, no unsplit segment to flush,
  // no room for a new one: out of memory at event 24.
  // Expandable: the tensors tile one segment of 5 pages, so the freed ones
  // are one contiguous 20 MiB block [10, 30) MiB that serves the request.
  std::vector<AllocEvent> events;
  for (std::uint64_t i = 0; i < 20; ++i) events.push_back(alloc_event(i, 5 * kMiB));
  for (std::uint64_t i = 2; i < 6; ++i) events.push_back(free_event(i));
  events.push_back(alloc_event(100, 20 * kMiB));
  SimOptions options;
  options.budget_bytes = 100 * kMiB;
  const SimResult plain = replay(events, options);
  EXPECT_TRUE(plain.oom);
  EXPECT_EQ(plain.first_oom_event_index, 24);
  EXPECT_EQ(plain.num_device_alloc, 5);
  options.config.expandable_segments = true;
  CachingAllocatorSim sim(options);
  for (const AllocEvent& event : events) ASSERT_TRUE(sim.apply(event));
  EXPECT_FALSE(sim.result().oom);
  EXPECT_EQ(sim.result().peak_reserved_bytes, 100 * kMiB);
  EXPECT_EQ(sim.result().num_device_alloc, 5);  // five 20 MiB page maps
  EXPECT_EQ(address(sim, 100), address(sim, 0) + 10 * kMiB);
}

TEST(CachingAllocatorSim, APrivatePoolServesOnlyItsOwnRequests) {
  // A CUDA graph's pool (1) holds a free 30 MiB segment, the default pool a
  // free 30 MiB one. A default request of 20 MiB takes the default block;
  // the next one finds no default block, and under a 90 MiB budget
  // (60 reserved + 20) gets a new segment; a third, with 80 reserved, needs
  // the flush: it frees nothing of the graph's pool (a live graph keeps
  // it), so 80 + 20 > 90 fails although the graph's 30 MiB is free.
  SimOptions options;
  options.budget_bytes = 90 * kMiB;
  CachingAllocatorSim sim(logged(options));
  ASSERT_TRUE(sim.malloc(1, 30 * kMiB, 1));
  ASSERT_TRUE(sim.malloc(2, 30 * kMiB));
  sim.free(1);
  sim.free(2);
  ASSERT_TRUE(sim.malloc(3, 20 * kMiB));
  EXPECT_EQ(address(sim, 3), sim.result().segment_log[1].address);  // the default segment
  ASSERT_TRUE(sim.malloc(4, 20 * kMiB));
  EXPECT_EQ(sim.reserved_bytes(), 80 * kMiB);
  EXPECT_FALSE(sim.malloc(5, 20 * kMiB));
  EXPECT_EQ(sim.result().num_device_free, 0);
  EXPECT_EQ(sim.largest_free_block(), 10 * kMiB);  // the default pool's: 30 - 20, split off
  // A request aimed at the graph's pool takes its cached block.
  ASSERT_TRUE(sim.malloc(6, 30 * kMiB, 1));
  EXPECT_EQ(address(sim, 6), sim.result().segment_log[0].address);
  EXPECT_EQ(sim.reserved_bytes(), 80 * kMiB);
  const std::vector<SegmentInfo> segments = sim.snapshot();
  ASSERT_EQ(segments.size(), 3u);
  EXPECT_EQ(segments[0].memory_pool, PoolId{1});
  EXPECT_EQ(segments[1].memory_pool, kDefaultPool);
}

TEST(CachingAllocatorSim, EmptyCacheKeepsALiveGraphsPool) {
  CachingAllocatorSim sim;
  ASSERT_TRUE(sim.malloc(1, 30 * kMiB, 1));
  ASSERT_TRUE(sim.malloc(2, 30 * kMiB, 2));
  ASSERT_TRUE(sim.malloc(3, 30 * kMiB));
  for (std::uint64_t id = 1; id <= 3; ++id) sim.free(id);
  sim.empty_cache();  // the default segment only
  EXPECT_EQ(sim.reserved_bytes(), 60 * kMiB);
  // Two private pools do not share blocks either: pool 2's free block
  // cannot serve pool 1, which has its own.
  ASSERT_TRUE(sim.malloc(4, 30 * kMiB, 1));
  ASSERT_TRUE(sim.malloc(5, 30 * kMiB, 3));
  EXPECT_EQ(sim.reserved_bytes(), 90 * kMiB);
}

TEST(CachingAllocatorSim, PrivatePoolsNeverUseExpandableSegments) {
  // With expandable_segments a default request maps 20 MiB pages of one
  // segment; a graph's request still gets a segment of its own, rounded
  // as without the setting (3 MiB -> a 20 MiB segment, 18 MiB -> 18 MiB).
  SimOptions options;
  options.config.expandable_segments = true;
  CachingAllocatorSim sim(logged(options));
  ASSERT_TRUE(sim.malloc(1, 3 * kMiB, 1));
  ASSERT_TRUE(sim.malloc(2, 18 * kMiB, 1));  // more than the 17 MiB left: a second segment
  ASSERT_TRUE(sim.malloc(3, 3 * kMiB));
  const auto& log = sim.result().segment_log;
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0].action, SegmentAction::kAlloc);
  EXPECT_EQ(log[0].bytes, 20 * kMiB);
  EXPECT_EQ(log[1].action, SegmentAction::kAlloc);
  EXPECT_EQ(log[1].bytes, 18 * kMiB);
  EXPECT_EQ(log[2].action, SegmentAction::kMap);
  EXPECT_EQ(log[2].bytes, 20 * kMiB);
  const std::vector<SegmentInfo> segments = sim.snapshot();
  ASSERT_EQ(segments.size(), 3u);
  EXPECT_FALSE(segments[0].is_expandable);
  EXPECT_TRUE(segments[2].is_expandable);
}

TEST(CachingAllocatorSim, GarbageCollectionLeavesPrivatePools) {
  // Budget 100 MiB, threshold 0.5: the graph's cached 40 MiB segment is
  // never collected; the default pool's 20 MiB one is.
  SimOptions options;
  options.budget_bytes = 100 * kMiB;
  options.config.garbage_collection_threshold = 0.5;
  CachingAllocatorSim sim(logged(options));
  ASSERT_TRUE(sim.malloc(1, 40 * kMiB, 1));
  ASSERT_TRUE(sim.malloc(2, 20 * kMiB));
  sim.free(1);
  sim.free(2);
  ASSERT_TRUE(sim.malloc(3, 30 * kMiB));  // 60 reserved > 50: collect
  EXPECT_EQ(sim.result().num_device_free, 1);
  EXPECT_EQ(sim.result().segment_log[2].bytes, 20 * kMiB);
  EXPECT_EQ(sim.reserved_bytes(), 70 * kMiB);
}

// Two CUDA streams as a snapshot records them (cudaStream_t values): the
// default stream, 0, and a side stream.
constexpr StreamId kSideStream = 0x5603a2c0;

TEST(CachingAllocatorSim, ABlockServesOnlyItsOwnStream) {
  // The side stream's 60 MiB segment keeps a 4 MiB tensor at its start and
  // 56 MiB free behind it (split: more than 1 MiB remains). Under a 100 MiB
  // budget the default stream's 30 MiB tensor takes a segment of its own
  // (90 reserved), and its 20 MiB request finds no block on its stream, no
  // room for a segment, and nothing to flush (the side segment is split):
  // out of memory beside 56 MiB free. The same 20 MiB on the side stream is
  // served from that free block, right after the 4 MiB tensor.
  SimOptions options;
  options.budget_bytes = 100 * kMiB;
  CachingAllocatorSim sim(logged(options));
  ASSERT_TRUE(sim.malloc(1, 60 * kMiB, kDefaultPool, kSideStream));
  sim.free(1);
  ASSERT_TRUE(sim.malloc(2, 4 * kMiB, kDefaultPool, kSideStream));
  ASSERT_TRUE(sim.malloc(3, 30 * kMiB));
  EXPECT_EQ(sim.reserved_bytes(), 90 * kMiB);
  EXPECT_FALSE(sim.malloc(4, 20 * kMiB));
  EXPECT_EQ(sim.result().num_device_free, 0);
  EXPECT_EQ(sim.largest_free_block(), 56 * kMiB);  // cache_info: every stream's
  ASSERT_TRUE(sim.malloc(5, 20 * kMiB, kDefaultPool, kSideStream));
  EXPECT_EQ(address(sim, 5), address(sim, 2) + 4 * kMiB);
  EXPECT_EQ(sim.reserved_bytes(), 90 * kMiB);
  const std::vector<SegmentInfo> segments = sim.snapshot();
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_EQ(segments[0].stream, kSideStream);  // synthetic addresses: the older segment lies lower
  EXPECT_EQ(segments[1].stream, kDefaultStream);
}

TEST(CachingAllocatorSim, TheLargestFreeBlockIsSoughtOnEveryStream) {
  // Free blocks sort by stream first: the last one is the largest of the
  // highest stream (10 MiB on stream 9), not the largest (50 MiB on 7).
  CachingAllocatorSim sim;
  ASSERT_TRUE(sim.malloc(1, 50 * kMiB, kDefaultPool, 7));
  ASSERT_TRUE(sim.malloc(2, 10 * kMiB, kDefaultPool, 9));
  sim.free(1);
  sim.free(2);
  EXPECT_EQ(sim.largest_free_block(), 50 * kMiB);
}

TEST(CachingAllocatorSim, AFlushReturnsEveryStreamsCachedSegments) {
  // The side stream's cached, unsplit 60 MiB segment cannot serve the
  // default stream's 50 MiB; 60 + 50 > 100 fails, and the flush
  // (release_cached_blocks) frees it whatever its stream: the retry fits.
  SimOptions options;
  options.budget_bytes = 100 * kMiB;
  CachingAllocatorSim sim(options);
  ASSERT_TRUE(sim.malloc(1, 60 * kMiB, kDefaultPool, kSideStream));
  sim.free(1);
  ASSERT_TRUE(sim.malloc(2, 50 * kMiB));
  EXPECT_EQ(sim.result().num_alloc_retries, 1);
  EXPECT_EQ(sim.result().num_device_free, 1);
  EXPECT_EQ(sim.reserved_bytes(), 50 * kMiB);
}

TEST(CachingAllocatorSim, OversizeBlocksAreReleasedForTheirOwnStreamFirst) {
  // As MaxSplitSizeReleasesOversizeBlocksBeforeFlushing, but the cached
  // 70 MiB block is the side stream's: release_available_cached_blocks
  // looks at the request's stream only and frees nothing, so the whole
  // cache is flushed (a retry) before the 40 MiB request fits.
  SimOptions options;
  options.budget_bytes = 100 * kMiB;
  options.config.max_split_size = 40 * kMiB;
  CachingAllocatorSim sim(options);
  ASSERT_TRUE(sim.malloc(1, 70 * kMiB, kDefaultPool, kSideStream));
  sim.free(1);
  ASSERT_TRUE(sim.malloc(2, 40 * kMiB));
  EXPECT_EQ(sim.result().num_alloc_retries, 1);
  EXPECT_EQ(sim.reserved_bytes(), 40 * kMiB);
}

TEST(CachingAllocatorSim, EachStreamHasItsOwnExpandableSegment) {
  // The side stream maps two 20 MiB pages for 30 MiB and frees them: its
  // 40 MiB stay mapped. The default stream's 30 MiB cannot use them: it
  // maps two pages of a segment of its own (80 reserved). empty_cache
  // unmaps both streams' free pages.
  SimOptions options;
  options.config.expandable_segments = true;
  CachingAllocatorSim sim(logged(options));
  ASSERT_TRUE(sim.malloc(1, 30 * kMiB, kDefaultPool, kSideStream));
  sim.free(1);
  ASSERT_TRUE(sim.malloc(2, 30 * kMiB));
  EXPECT_EQ(sim.reserved_bytes(), 80 * kMiB);
  std::vector<SegmentInfo> segments = sim.snapshot();
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_TRUE(segments[0].is_expandable);
  EXPECT_TRUE(segments[1].is_expandable);
  EXPECT_NE(segments[0].stream, segments[1].stream);
  // A second side-stream request reuses its own free pages.
  ASSERT_TRUE(sim.malloc(3, 30 * kMiB, kDefaultPool, kSideStream));
  EXPECT_EQ(sim.reserved_bytes(), 80 * kMiB);
  sim.free(2);
  sim.free(3);
  sim.empty_cache();
  EXPECT_EQ(sim.reserved_bytes(), 0);
}

TEST(CachingAllocatorSim, ExistingSegmentsKeepTheirStream) {
  // A side-stream segment from before the replay, with 10 MiB free at its
  // end: the default stream's 8 MiB request gets a 20 MiB segment of its own.
  CachingAllocatorSim sim;
  ExistingSegment segment;
  segment.address = std::uint64_t{1} << 32;
  segment.bytes = 30 * kMiB;
  segment.stream = kSideStream;
  segment.allocated_blocks.push_back({1, segment.address, 20 * kMiB, 20 * kMiB});
  sim.add_existing_segment(segment);
  ASSERT_TRUE(sim.malloc(2, 8 * kMiB));
  EXPECT_EQ(sim.reserved_bytes(), 50 * kMiB);
  ASSERT_TRUE(sim.malloc(3, 8 * kMiB, kDefaultPool, kSideStream));
  EXPECT_EQ(address(sim, 3), segment.address + 20 * kMiB);
}

TEST(CachingAllocatorSim, RoundupPower2DivisionsRoundRequests) {
  SimOptions options;
  options.config.roundup_power2_divisions.fill(4);
  CachingAllocatorSim sim(options);
  ASSERT_TRUE(sim.malloc(1, 5 * kMiB + 1));  // -> 6 MiB
  EXPECT_EQ(sim.allocated_bytes(), 6 * kMiB);
  EXPECT_EQ(sim.reserved_bytes(), 20 * kMiB);
}

TEST(CachingAllocatorSim, PeakStatistics) {
  CachingAllocatorSim sim;
  ASSERT_TRUE(sim.malloc(1, kMiB + 1));  // 20 MiB reserved, 1 MiB + 512 allocated
  ASSERT_TRUE(sim.malloc(2, 4 * kMiB));
  sim.free(2);
  const SimResult& r = sim.result();
  EXPECT_EQ(r.peak_reserved_bytes, 20 * kMiB);
  EXPECT_EQ(r.peak_reserved_event_index, 0);
  EXPECT_EQ(r.fragmentation_at_peak_bytes, 20 * kMiB - (kMiB + 512));
  EXPECT_EQ(r.largest_free_block_at_peak_bytes, 20 * kMiB - (kMiB + 512));
  EXPECT_EQ(r.peak_allocated_bytes, 5 * kMiB + 512);
  EXPECT_EQ(r.peak_requested_bytes, 5 * kMiB + 1);
  EXPECT_EQ(r.allocated_bytes, kMiB + 512);
  EXPECT_EQ(r.num_events, 3);
}

TEST(CachingAllocatorSim, PeakReservedByPhase) {
  std::vector<AllocEvent> events = {alloc_event(1, 30 * kMiB, 0, Phase::kForward),
                                    alloc_event(2, 40 * kMiB, 1, Phase::kBackward), free_event(2, 2, Phase::kBackward),
                                    free_event(1, 3, Phase::kOptimizer)};
  const SimResult r = replay(events, SimOptions{});
  EXPECT_EQ(r.peak_reserved_by_phase[static_cast<std::size_t>(Phase::kForward)], 30 * kMiB);
  EXPECT_EQ(r.peak_reserved_by_phase[static_cast<std::size_t>(Phase::kBackward)], 70 * kMiB);
  EXPECT_EQ(r.peak_reserved_by_phase[static_cast<std::size_t>(Phase::kOptimizer)], 70 * kMiB);
  EXPECT_EQ(r.peak_reserved_by_phase[static_cast<std::size_t>(Phase::kLoad)], 0);
}

TEST(CachingAllocatorSim, NamesTheOperatorAtThePeakAndAtTheOom) {
  std::vector<AllocEvent> events = {alloc_event(1, 30 * kMiB), alloc_event(2, 30 * kMiB)};
  events[0].op = "aten::mm";
  events[1].op = "aten::cat";
  SimOptions options;
  options.budget_bytes = 50 * kMiB;
  const SimResult r = replay(events, options);
  EXPECT_EQ(r.peak_reserved_op, "aten::mm");
  ASSERT_EQ(r.ooms.size(), 1u);
  EXPECT_EQ(r.ooms[0].op, "aten::cat");
  AllocEvent bad = alloc_event(3, 1);
  bad.phase = static_cast<Phase>(17);
  CachingAllocatorSim sim;
  EXPECT_THROW(sim.apply(bad), InputError);
}

TEST(CachingAllocatorSim, ZeroByteRequestsReserveNothing) {
  CachingAllocatorSim sim;
  ASSERT_TRUE(sim.malloc(7, 0));
  EXPECT_EQ(sim.reserved_bytes(), 0);
  sim.free(7);
  EXPECT_EQ(sim.result().num_events, 2);
}

TEST(CachingAllocatorSim, ExistingSegmentsStartTheReplay) {
  ExistingSegment segment;
  segment.address = 0x7f0000000000;
  segment.bytes = 20 * kMiB;
  segment.pool = alloc_rules::Pool::kLarge;
  segment.allocated_blocks.push_back({42, segment.address + 4 * kMiB, 2 * kMiB, 2 * kMiB});
  CachingAllocatorSim sim;
  sim.add_existing_segment(segment);  // free: [0, 4) MiB and [6, 20) MiB
  EXPECT_EQ(sim.reserved_bytes(), 20 * kMiB);
  EXPECT_EQ(sim.allocated_bytes(), 2 * kMiB);
  ASSERT_TRUE(sim.malloc(1, 3 * kMiB));  // best fit: the 4 MiB hole, 1 MiB left: taken whole
  EXPECT_EQ(address(sim, 1), segment.address);
  EXPECT_EQ(sim.allocated_bytes(), 6 * kMiB);
  EXPECT_EQ(sim.result().num_device_alloc, 0);
  sim.free(42);  // the pre-existing block can be freed by id
  EXPECT_EQ(sim.allocated_bytes(), 4 * kMiB);
}

TEST(CachingAllocatorSim, RealAddressModeUsesGivenSegmentAddresses) {
  CachingAllocatorSim sim;
  sim.use_segment_addresses({0x500000000, 0x300000000});
  ASSERT_TRUE(sim.malloc(1, 12 * kMiB));
  ASSERT_TRUE(sim.malloc(2, 12 * kMiB));
  ASSERT_TRUE(sim.malloc(3, 12 * kMiB));  // the list ran out: synthetic
  EXPECT_EQ(address(sim, 1), 0x500000000u);
  EXPECT_EQ(address(sim, 2), 0x300000000u);
  EXPECT_GT(address(sim, 3), 0x500000000u);
  sim.free(1);
  sim.free(2);
  ASSERT_TRUE(sim.malloc(4, 12 * kMiB));  // equal sizes: the lower address wins
  EXPECT_EQ(address(sim, 4), 0x300000000u);
}

TEST(CachingAllocatorSim, RejectsBadStreamsAndConfigs) {
  CachingAllocatorSim sim;
  ASSERT_TRUE(sim.malloc(1, 100));
  EXPECT_THROW(sim.malloc(1, 100), InputError);  // id still live
  EXPECT_THROW(sim.free(99), InputError);        // never allocated
  sim.free(1);
  EXPECT_THROW(sim.free(1), InputError);  // freed twice
  SimOptions bad;
  bad.config.max_split_size = 10 * kMiB;
  EXPECT_THROW(CachingAllocatorSim{bad}, ConfigError);
  bad = SimOptions{};
  bad.config.roundup_power2_divisions[3] = 3;
  EXPECT_THROW(CachingAllocatorSim{bad}, ConfigError);
  bad = SimOptions{};
  bad.budget_bytes = -1;
  EXPECT_THROW(CachingAllocatorSim{bad}, ConfigError);
}

}  // namespace
}  // namespace oomtune::allocsim
