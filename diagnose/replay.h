#pragma once
// Replays a device's trace to know the allocator's state at any event.
//
// Rules:
//   - The state when recording began is the dumped state with the trace
//     undone: segments created in the trace (segment_alloc / segment_map)
//     did not exist yet, segments freed in it (segment_free / segment_unmap)
//     did; blocks allocated before recording are the dumped allocated
//     blocks with no alloc in the trace, plus blocks freed in the trace with
//     no alloc before their free ("orphan" frees).
//   - Trace sizes are requested bytes (CUDACachingAllocator.cpp record_trace
//     for ALLOC/FREE_* passes the requested size), but `allocated` in PyTorch
//     counts block bytes. A block's size is therefore rebuilt with the
//     allocator's rules: round_size() of the request, and the whole free
//     block when the remainder would not be split (should_split(): large pool
//     splits only when MORE than kSmallSize remains — PyTorch 2.x
//     `remaining > kSmallSize`; small pool and expandable segments when at
//     least kMinBlockSize remains). A block still allocated at dump time takes
//     its exact dumped size.
//   - allocated drops at free_requested (DeviceStats allocated_bytes drop in
//     free()); the block's bytes stay unusable until free_completed. A trace
//     with no free_completed (recorded with _record_memory_history(
//     skip_actions=["free_completed"]), PyTorch 2.11) releases the block at
//     free_requested, as happens when no other stream used it.
//   - reserved = sum of segment (and mapped) ranges.
//   - Free blocks are the gaps between live blocks inside a segment: the
//     allocator merges adjacent free blocks, so each gap is one block.
//   - Inconsistent events (an alloc outside every segment, a free of an
//     unknown address) are counted, never fatal.
//   - A range belongs to a private memory pool when the dumped segment at
//     its address has a segment_pool_id other than (0, 0): a CUDA graph's
//     pool (torch.cuda.graph, torch.compile's CUDA graph trees) or a
//     torch.cuda.MemPool. The caching allocator serves a request from the
//     pool it targets only (CUDACachingAllocator.cpp, get_pool), so the
//     free blocks of private pools cannot serve an ordinary request. A
//     segment freed before the dump has no pool on record: default.
//   - A range belongs to the stream that made it: the dumped segment's
//     `stream`, or the segment event's (segment_alloc and segment_free
//     record the segment's stream). The allocator serves a request from
//     blocks of its own stream only (get_free_block), so another stream's
//     free blocks cannot serve it; expandable mappings of two streams are
//     two segments.

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "allocsim/allocator_rules.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// Labels the replay keeps running sums for (category, site).
struct BlockLabel {
  uint8_t category = 0;  ///< < kMaxLabelCategories
  int32_t site = -1;     ///< index into the caller's site table, -1 for none
};
constexpr int kMaxLabelCategories = 8;

/// A block in use (allocated, or freed but waiting for free_completed).
struct LiveBlock {
  int64_t size = 0;          ///< bytes (block size, see rules)
  int64_t requested = 0;     ///< bytes requested
  int64_t alloc_event = -1;  ///< index of its alloc in the trace; -1: before recording
  StackId frames = 0;
  BlockLabel label;
  bool allocated = true;  ///< false once free_requested was seen
};

/// A reserved address range: a segment or an expandable segment's mapping.
struct ReservedRange {
  int64_t size = 0;  ///< bytes
  bool is_large = true;
  bool is_expandable = false;
  bool private_pool = false;  ///< in a private memory pool (rules above)
  int64_t stream = 0;         ///< the stream whose requests it serves (cudaStream_t as an integer)
};

/// Which ranges a free-memory question is about, by pool.
enum class PoolScope : uint8_t {
  kAll,           ///< every reserved range
  kDefaultPool,   ///< the default pool's: what an ordinary request can use
  kPrivatePools,  ///< private memory pools' only
};

/// ... and by stream.
enum class StreamScope : uint8_t {
  kAll,     ///< every stream's ranges
  kOnly,    ///< RangeScope::stream's only: what a request on it can use
  kOthers,  ///< every other stream's
};

/// Which ranges a free-memory question is about.
struct RangeScope {
  PoolScope pools = PoolScope::kAll;
  StreamScope streams = StreamScope::kAll;
  int64_t stream = 0;                                      ///< the stream kOnly and kOthers are about
  RangeScope(PoolScope p = PoolScope::kAll) : pools(p) {}  // NOLINT: a pool scope is a range scope
  RangeScope(PoolScope p, StreamScope s, int64_t of) : pools(p), streams(s), stream(of) {}
  bool covers(const ReservedRange& r) const;
};

/// The allocator state of one device, advanced one trace event at a time.
class Replay {
 public:
  /// Labels a block when it becomes live: (alloc event or -1, its frames).
  using Labeler = std::function<BlockLabel(int64_t alloc_event, StackId frames)>;

  /// Builds the state at the start of device `device`'s trace. `config`
  /// gives the rounding rules (roundup_power2_divisions). `sites` is the
  /// number of site labels the labeler can return.
  Replay(const Snapshot& snapshot, int device, const alloc_rules::AllocatorConfig& config, Labeler labeler, int sites);

  /// Applies trace event `index` (events must be applied in order).
  void apply(size_t index);
  /// Events applied so far.
  size_t applied() const { return next_; }

  int64_t allocated_bytes() const { return allocated_; }  ///< bytes in allocated blocks
  int64_t requested_bytes() const { return requested_; }  ///< bytes requested by their callers
  int64_t reserved_bytes() const { return reserved_; }    ///< bytes in segments
  /// Bytes in the segments of one pool (large or small).
  int64_t reserved_bytes(alloc_rules::Pool pool) const;
  /// Bytes in free (inactive) blocks of a pool, in the ranges `scope` names.
  int64_t free_bytes(alloc_rules::Pool pool, const RangeScope& scope = {}) const;
  /// Largest free block of a pool in the ranges `scope` names, bytes (0 when none).
  int64_t largest_free_block(alloc_rules::Pool pool, const RangeScope& scope = {}) const;
  /// Bytes reserved in the ranges `scope` names, and how many ranges
  /// (segments) they are.
  int64_t reserved_bytes_in(const RangeScope& scope) const;
  int64_t segments_in(const RangeScope& scope) const;
  /// Bytes held in segments of `scope` whose blocks are all free (what
  /// empty_cache or garbage collection could return to CUDA: the default
  /// pool's; a live CUDA graph keeps its private pool's).
  int64_t fully_free_segment_bytes(const RangeScope& scope = {}) const;
  /// The reserved range holding `addr`, or nullptr when none does.
  const ReservedRange* range_at(int64_t addr) const;
  /// Allocated bytes per label category / per site.
  const std::vector<int64_t>& allocated_by_category() const { return by_category_; }
  const std::vector<int64_t>& allocated_by_site() const { return by_site_; }
  /// Bytes allocated before recording began (at the start of the trace).
  int64_t initial_allocated_bytes() const { return initial_allocated_; }
  /// Of those, bytes in dumped blocks that carry frames: allocated while
  /// history was recorded, their alloc events not in the trace (a ring
  /// buffer's older events, or _record_memory_history(enabled="state"),
  /// which keeps blocks' stacks and no events).
  int64_t initial_allocated_with_frames_bytes() const { return initial_allocated_with_frames_; }
  int64_t initial_reserved_bytes() const { return initial_reserved_; }
  /// Frees in the trace of blocks allocated before it began (a cut trace).
  int64_t orphan_frees() const { return orphan_frees_; }
  /// Events that did not fit the reconstructed state.
  int64_t inconsistencies() const { return inconsistencies_; }

  /// Allocated blocks now, keyed by address.
  const std::map<int64_t, LiveBlock>& live() const { return live_; }
  /// Reserved address ranges (segments) now, keyed by start address.
  const std::map<int64_t, ReservedRange>& ranges() const { return ranges_; }

 private:
  void add_range(int64_t addr, const ReservedRange& range);
  void remove_range(int64_t addr, int64_t size);
  void insert_live(int64_t addr, LiveBlock block);
  void release(std::map<int64_t, LiveBlock>::iterator it);
  /// Block size for a request of `requested` bytes placed at `addr`.
  int64_t block_size_at(int64_t addr, int64_t requested) const;
  /// The dumped segment holding `addr` (its pool and size class), or nullptr.
  const Segment* dumped_segment_at(int64_t addr) const;  // binary search of dumped_by_address_
  bool pool_of_range_is_large(int64_t addr, int64_t size) const;
  bool range_is_private(int64_t addr) const;

  std::vector<const Segment*> dumped_by_address_;  // the snapshot's segments, by address
  const Snapshot* snapshot_;
  const std::vector<TraceEvent>* trace_;
  alloc_rules::AllocatorConfig config_;
  Labeler labeler_;
  std::map<int64_t, ReservedRange> ranges_;
  std::map<int64_t, LiveBlock> live_;
  std::map<int64_t, int64_t> exact_size_;  // addr -> dumped size, for the last alloc at addr
  std::vector<bool> last_alloc_;           // per event: this alloc's block is in the dump (a bit an event)
  std::vector<int64_t> by_category_;
  std::vector<int64_t> by_site_;
  int64_t allocated_ = 0;
  int64_t requested_ = 0;
  int64_t reserved_ = 0;
  bool release_at_request_ = false;  // the trace has no free_completed (see the rules above)
  int64_t initial_allocated_ = 0;
  int64_t initial_allocated_with_frames_ = 0;
  int64_t initial_reserved_ = 0;
  int64_t inconsistencies_ = 0;
  int64_t orphan_frees_ = 0;
  size_t next_ = 0;
};

/// should_split() as PyTorch 2.x implements it (CUDACachingAllocator.cpp):
/// small pool or expandable: remaining >= kMinBlockSize; large pool:
/// request < max_split_size and remaining > kSmallSize.
bool block_would_split(bool is_large, bool expandable, int64_t block_bytes, int64_t rounded_bytes,
                       int64_t max_split_size);

}  // namespace oomtune::diagnose
