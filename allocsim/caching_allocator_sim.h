#pragma once
// A simulator of PyTorch 2.x's CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator; in 2.9+ also
// c10/core/CachingDeviceAllocator.h). It replays a stream of allocation
// events (allocsim/alloc_event.h) and predicts what the real allocator would
// reserve from CUDA: peak reserved bytes, fragmentation, cudaMalloc calls,
// cache flushes, and the first request that runs out of memory under a
// budget. See docs/allocator_simulator.md and the notes in
// caching_allocator_sim.cpp.
//
// Rules (each one is PyTorch's; the function named is where it lives):
// - Requests are rounded to a multiple of 512 bytes, or to a power-of-two
//   division when roundup_power2_divisions is set (round_size).
// - Requests <= 1 MiB use the small pool, carved from 2 MiB segments; larger
//   ones the large pool: < 10 MiB from 20 MiB segments, else from a segment of
//   the request rounded up to 2 MiB (get_pool, get_allocation_size).
// - A request takes the smallest cached free block that fits, ties broken by
//   lowest address (get_free_block, BlockComparatorSize).
// - The block is split when >= 512 bytes are left (small pool, or any pool
//   with expandable_segments), or when > 1 MiB is left and the request is
//   below max_split_size (large pool); otherwise the whole block is handed out
//   (should_split).
// - Requests below max_split_size never take blocks >= max_split_size;
//   larger requests take them only within max_non_split_rounding_size
//   (get_free_block).
// - A freed block merges with free neighbours of its segment (free_block,
//   try_merge_blocks).
// - With no fitting block: garbage collection when garbage_collection_threshold
//   is set; then cudaMalloc, which fails when reserved + segment > budget; then
//   free oversize cached blocks (max_split_size only) and retry; then free
//   every unsplit cached segment and retry; then out of memory (malloc,
//   alloc_block, release_available_cached_blocks, release_cached_blocks).
// - expandable_segments: one growing segment per pool, mapped in 2 MiB
//   (small) or 20 MiB (large) pages; a flush unmaps free pages
//   (try_allocate_expandable_block, map_block, unmap_block).
// - Private memory pools (CUDA graphs' pools, torch.cuda.MemPool): a request
//   aimed at one is served from that pool's own cached blocks or a new
//   segment, never from the default pool's, nor the default pool's from
//   its; its segments are never expandable (alloc_block: "our checkpointing
//   logic for private pools doesn't support the expandable_segments_
//   structure yet"), and they stay reserved: the sim takes every private
//   pool as in use by a live graph, whose pool release_cached_blocks and
//   empty_cache leave alone (they free graph_pools_freeable only), and
//   garbage collection looks at the default large pool only
//   (garbage_collect_cached_blocks).
// - Streams: a block serves requests of the stream that allocated its
//   segment only; each stream has its own expandable segments; a flush
//   (release_cached_blocks, empty_cache, garbage collection) returns every
//   stream's cached segments (get_free_block, find_expandable_block,
//   release_available_cached_blocks: Note [Streams in the simulator]).
// Simplified: no CUDA events (record_stream's deferred free is the caller's
// to replay, at free_completed), no graph pool freed when its graphs die, no
// free-memory callbacks.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "allocsim/alloc_event.h"
#include "allocsim/allocator_rules.h"
#include "common/phase.h"

namespace oomtune::allocsim {

/// Which memory pool a request targets: kDefaultPool, or a private pool
/// (a CUDA graph's, a torch.cuda.MemPool) numbered by the caller from 1.
using PoolId = std::uint32_t;
constexpr PoolId kDefaultPool = 0;

/// Which CUDA stream a request is made on: the cudaStream_t as an integer,
/// as a snapshot records it (TraceEntry::stream). Blocks are reused only on
/// their own stream; the CPU tracker's events are all kDefaultStream.
using StreamId = std::int64_t;
constexpr StreamId kDefaultStream = 0;

/// How to run a simulation.
struct SimOptions {
  /// The allocator's options (PYTORCH_CUDA_ALLOC_CONF); see allocsim_config.h
  /// to parse the environment string.
  alloc_rules::AllocatorConfig config;
  /// Bytes the allocator may reserve, like
  /// torch.cuda.set_per_process_memory_fraction (allowed_memory_maximum in
  /// CUDACachingAllocator.cpp): a cudaMalloc that would take reserved past it
  /// fails. 0: no budget (and then garbage collection is off, as in PyTorch).
  int64_t budget_bytes = 0;
  /// Bytes of physical device memory: a cudaMalloc (or page map) that would
  /// take reserved past it fails too. 0: unlimited (only the budget applies).
  /// It also sizes the virtual range of an expandable segment (1 1/8 × it, as
  /// PyTorch does; 80 GiB is assumed when both this and the budget are 0).
  int64_t device_total_bytes = 0;
  /// Record every segment alloc/free/map/unmap in SimResult::segment_log.
  bool record_segment_log = false;
  /// Ignore requests after the first out-of-memory (the step is over).
  bool stop_at_first_oom = false;
};

/// What the allocator asked of CUDA.
enum class SegmentAction : std::uint8_t {
  kAlloc,  ///< cudaMalloc of a segment (TraceEntry SEGMENT_ALLOC)
  kFree,   ///< cudaFree of a whole segment (SEGMENT_FREE)
  kMap,    ///< pages mapped into an expandable segment (SEGMENT_MAP)
  kUnmap,  ///< pages unmapped from an expandable segment (SEGMENT_UNMAP)
};

/// One segment_alloc / segment_free / map / unmap, for validation.
struct SegmentLogEntry {
  SegmentAction action = SegmentAction::kAlloc;
  int64_t event_index = 0;    ///< index of the event (alloc or free) that caused it
  std::uint64_t address = 0;  ///< segment (or mapped range) start
  int64_t bytes = 0;          ///< segment (or mapped range) size
};

/// A request that ran out of memory.
struct OomRecord {
  int64_t event_index = 0;      ///< index of the alloc event
  std::uint64_t id = 0;         ///< its allocation id
  int64_t requested_bytes = 0;  ///< as asked
  int64_t rounded_bytes = 0;    ///< after round_size (what PyTorch's trace records)
  int64_t segment_bytes = 0;    ///< the cudaMalloc that failed (get_allocation_size)
  int64_t reserved_bytes = 0;   ///< reserved when it failed (after the flush)
  int64_t allocated_bytes = 0;  ///< allocated when it failed
  std::string op;               ///< the event's operator, when known
};

/// The outcome of a replay. Bytes are int64_t; "allocated" counts block
/// sizes (rounded), like PyTorch's allocated_bytes stat; "requested" counts
/// bytes as asked (requested_bytes stat).
struct SimResult {
  /// SUM: peak bytes reserved from CUDA (segments, or mapped pages).
  int64_t peak_reserved_bytes = 0;
  /// SUM: bytes reserved now (after the last event).
  int64_t reserved_bytes = 0;
  /// SUM: peak bytes in allocated blocks.
  int64_t peak_allocated_bytes = 0;
  /// SUM: bytes in allocated blocks now.
  int64_t allocated_bytes = 0;
  /// SUM: bytes requested by live allocations, the peak.
  int64_t peak_requested_bytes = 0;
  /// SUM: reserved - allocated when reserved first reached its peak.
  int64_t fragmentation_at_peak_bytes = 0;
  /// SIZE: the largest cached free block when reserved first reached its peak.
  int64_t largest_free_block_at_peak_bytes = 0;
  /// Index of the event at which reserved first reached its peak (-1: none).
  int64_t peak_reserved_event_index = -1;
  /// Operator of that event, when known.
  std::string peak_reserved_op;
  /// SUM: peak reserved bytes within each phase (indexed by oomtune::Phase).
  std::array<int64_t, kNumPhases> peak_reserved_by_phase{};
  /// COUNT: cudaMalloc calls (with expandable segments also page maps): num_device_alloc.
  int64_t num_device_alloc = 0;
  /// COUNT: cudaFree calls (and page unmaps): num_device_free.
  int64_t num_device_free = 0;
  /// COUNT: cache flushes: failed cudaMalloc, free all cached segments, retry (num_alloc_retries).
  int64_t num_alloc_retries = 0;
  /// COUNT: requests that ran out of memory (num_ooms).
  int64_t num_ooms = 0;
  /// COUNT: alloc and free events applied.
  int64_t num_events = 0;
  /// True when some request ran out of memory under the budget.
  bool oom = false;
  /// Index of the first failing alloc event, -1 when none.
  int64_t first_oom_event_index = -1;
  /// Every failing request, in order.
  std::vector<OomRecord> ooms;
  /// Segment log (only with SimOptions::record_segment_log).
  std::vector<SegmentLogEntry> segment_log;
};

/// A block of a segment that exists before the replay (see ExistingSegment).
struct ExistingBlock {
  std::uint64_t id = 0;         ///< allocation id a later free event will name
  std::uint64_t address = 0;    ///< block start, inside its segment
  int64_t bytes = 0;            ///< block size (a multiple of 512)
  int64_t requested_bytes = 0;  ///< bytes as asked
};

/// A segment reserved before the replay starts, with the blocks allocated in
/// it then (everything else in it is free). Used to start a replay from a
/// snapshot's state.
struct ExistingSegment {
  std::uint64_t address = 0;
  int64_t bytes = 0;
  alloc_rules::Pool pool = alloc_rules::Pool::kLarge;
  PoolId memory_pool = kDefaultPool;            ///< a private pool's segment: its pool
  StreamId stream = kDefaultStream;             ///< the stream whose requests it serves
  std::vector<ExistingBlock> allocated_blocks;  ///< sorted or not; must not overlap
};

/// One block of a segment, as PyTorch's snapshot() reports it (BlockInfo).
struct BlockInfo {
  std::uint64_t address = 0;
  int64_t bytes = 0;
  int64_t requested_bytes = 0;  ///< bytes as asked (allocated blocks), else 0
  bool allocated = false;
  std::uint64_t id = 0;  ///< allocation id (allocated blocks)
};

/// One segment (for expandable segments: one contiguous mapped range) and
/// its blocks in address order, as PyTorch's snapshot() reports it (SegmentInfo).
struct SegmentInfo {
  std::uint64_t address = 0;
  int64_t bytes = 0;
  alloc_rules::Pool pool = alloc_rules::Pool::kLarge;
  bool is_expandable = false;
  PoolId memory_pool = kDefaultPool;  ///< the private pool it belongs to, or kDefaultPool
  StreamId stream = kDefaultStream;   ///< the stream whose requests it serves
  std::vector<BlockInfo> blocks;
};

/// The simulated allocator: one device, any number of streams. Feed it events one by one
/// (apply, malloc, free) or replay a whole stream (replay()). Not thread-safe.
class CachingAllocatorSim {
 public:
  /// An allocator with nothing reserved. Throws oomtune::ConfigError on a
  /// config PyTorch would reject (max_split_size below 20 MiB, divisions not a
  /// power of two, threshold outside [0, 1)).
  explicit CachingAllocatorSim(SimOptions options = {});
  ~CachingAllocatorSim();
  CachingAllocatorSim(const CachingAllocatorSim&) = delete;
  CachingAllocatorSim& operator=(const CachingAllocatorSim&) = delete;
  CachingAllocatorSim(CachingAllocatorSim&&) noexcept;
  CachingAllocatorSim& operator=(CachingAllocatorSim&&) noexcept;

  /// Adds a segment that was reserved before the replay (counts toward
  /// reserved; not logged, not counted as a cudaMalloc). Call before any event.
  /// Throws oomtune::InputError when a block lies outside the segment, blocks
  /// overlap, or an id is already live.
  void add_existing_segment(const ExistingSegment& segment);

  /// Real-address mode: give new cudaMalloc'd segments these addresses, in
  /// order (e.g. a snapshot trace's segment_alloc addresses), instead of
  /// synthetic ones; when the list runs out, synthetic addresses follow.
  void use_segment_addresses(std::vector<std::uint64_t> addresses);

  /// Applies one event: malloc for kAlloc, free for kFree; tracks its phase
  /// and operator. Returns false when an alloc ran out of memory. Throws
  /// oomtune::InputError for a phase outside oomtune::Phase.
  bool apply(const AllocEvent& event);

  /// Allocates `bytes` for allocation `id` on `stream` from `memory_pool`
  /// (the default pool, or a private one: rules above). Returns false (and
  /// records an OomRecord) when the allocator runs out of memory; a later
  /// free of `id` is then ignored. A request of 0 bytes reserves nothing
  /// (PyTorch returns a null pointer). Throws oomtune::InputError when `id`
  /// is already live.
  bool malloc(std::uint64_t id, int64_t bytes, PoolId memory_pool = kDefaultPool, StreamId stream = kDefaultStream);

  /// Frees allocation `id` (free_completed). Throws oomtune::InputError for
  /// an id that was never allocated (failed and zero-byte allocations are
  /// fine).
  void free(std::uint64_t id);

  /// torch.cuda.empty_cache(): frees every unsplit cached segment of the
  /// default pool, of every stream, and unmaps its free expandable pages
  /// (private pools keep theirs: rules above).
  void empty_cache();

  /// Address of the block of live allocation `id`, or nullopt.
  std::optional<std::uint64_t> address_of(std::uint64_t id) const;

  /// Current reserved and allocated bytes, every pool's.
  int64_t reserved_bytes() const;
  int64_t allocated_bytes() const;

  /// The largest cached free block of the default pool now, of any stream
  /// (bytes), 0 when none (DeviceCachingAllocator::cacheInfo looks at the
  /// default pool only).
  int64_t largest_free_block() const;

  /// Every segment and its blocks now, sorted by address
  /// (DeviceCachingAllocator::snapshot()).
  std::vector<SegmentInfo> snapshot() const;

  /// Statistics so far (reserved_bytes/allocated_bytes are current values).
  const SimResult& result() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Replays `events` on a fresh allocator and returns its statistics.
SimResult replay(const std::vector<AllocEvent>& events, const SimOptions& options);

}  // namespace oomtune::allocsim
