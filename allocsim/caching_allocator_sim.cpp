// The CUDA caching-allocator simulator. The rules are listed at the top of
// caching_allocator_sim.h; each function below names the PyTorch function it
// mirrors (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator, PyTorch
// 2.x; the same code is c10/core/CachingDeviceAllocator.h in 2.9+).
//
// Note [Streams in the simulator]
// Rationale: PyTorch keys free blocks by (stream, size, address) and only
// reuses a block on the stream that allocated it (get_free_block:
// `(*it)->stream != p.stream()`): a segment belongs to the stream that
// made it, and so does each expandable segment (find_expandable_block
// searches the request's stream's unmapped ranges). Memory a side stream
// (an FSDP all-gather, a prefetch under torch.cuda.stream) cached serves
// no request of the compute stream until a flush returns it to CUDA.
// Approach: every block carries its stream (StreamId: the cudaStream_t as
// an integer, kDefaultStream for the CPU tracker's events, which see no
// streams); the comparators order by stream first as PyTorch's do, and
// every search stays on the request's stream: best fit, the expandable
// walk, release_available_cached_blocks. Flushes (release_cached_blocks,
// empty_cache, garbage collection) take every stream's blocks.
// Limitations: record_stream's deferred free is the caller's to replay (a
// free at free_completed, when the block's events completed); no events.
//
// Note [Synthetic addresses]
// Rationale: best fit breaks ties between equal-size blocks by address
// (BlockComparatorSize), so a replay needs addresses.
// Approach: each new segment gets the next address above all earlier ones
// (aligned to 2 MiB; start 1 TiB), so older segments win ties. In
// real-address mode (use_segment_addresses) new segments take the addresses
// a snapshot trace recorded for its segment_alloc events, in order, and then
// every block lands where the real allocator put it.
// Limitations: real cudaMalloc addresses are not monotone (in the
// fragmentation fixture the second segment lies below the first), so
// synthetic tie-breaks can pick a different segment than CUDA did; sizes,
// reserved and OOMs rarely depend on it.
//
// Note [Reserved peak]
// The peak is taken after the malloc that raised reserved, as PyTorch's
// reserved_bytes.peak is; "fragmentation at the peak" and "largest free block
// at the peak" are read at that first moment (the new segment already holds
// the request that caused it).
//
// Note [Expandable segments in the simulator]
// Approach: as PyTorch: one virtual range per pool, 1 1/8 × device memory
// long, mapped page by page (2 MiB small pool, 20 MiB large pool); free
// mapped blocks live in the pool's `blocks`, unmapped ranges in `unmapped`
// (by address). alloc_block checks the budget against get_allocation_size()
// as PyTorch does, then maps the pages the request needs at the lowest
// address with room (find_expandable_block); a flush unmaps whole free pages
// (unmap_block) and drops a segment once nothing in it is mapped.
// Limitations: a failed map (cuMemCreate out of memory) happens only past
// device_total_bytes.

#include "allocsim/caching_allocator_sim.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "common/error.h"

namespace oomtune::allocsim {

namespace rules = alloc_rules;

namespace {

constexpr std::uint64_t kSyntheticBase = std::uint64_t{1} << 40;  // Note [Synthetic addresses]
constexpr int64_t kSegmentAlignment = rules::kRoundLarge;         // cudaMalloc aligns to 2 MiB
constexpr int64_t kAssumedDeviceTotal = int64_t{80} << 30;        // H100 80GB when nothing is known

struct BlockPool;
struct ExpandableSegment;

/// Block: a piece of a segment (CUDACachingAllocator.cpp `struct Block`).
struct Block {
  StreamId stream = kDefaultStream;  // the stream whose requests it serves
  std::uint64_t ptr = 0;             // address
  int64_t size = 0;                  // bytes
  int64_t requested_size = 0;        // bytes as asked (allocated blocks)
  std::uint64_t id = 0;              // allocation id (allocated blocks)
  BlockPool* pool = nullptr;         // owning pool
  Block* prev = nullptr;             // neighbours in the segment
  Block* next = nullptr;
  ExpandableSegment* expandable_segment = nullptr;
  int64_t gc_count_base = 0;  // pool's get_free_blocks_call_count when cached
  bool allocated = false;
  bool mapped = true;  // false only for unmapped expandable ranges

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

/// BlockComparatorSize: stream, size, then address (Note [Streams in the simulator]).
struct BlockComparatorSize {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

/// BlockComparatorAddress: stream, then address.
struct BlockComparatorAddress {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->ptr < b->ptr;
  }
};

/// BlockPool: the cached free blocks of the small or the large pool.
struct BlockPool {
  BlockPool(bool small, PoolId owner) : is_small(small), memory_pool(owner) {}
  bool is_small;
  PoolId memory_pool;                            // kDefaultPool, or the private pool (owner_PrivatePool) it belongs to
  std::set<Block*, BlockComparatorSize> blocks;  // free, mapped
  std::set<Block*, BlockComparatorAddress> unmapped;  // expandable ranges not backed by pages
  int64_t get_free_blocks_call_count = 0;             // age clock of garbage collection

  /// insert_into_blocks(): cache a free block and stamp its age.
  void insert_into_blocks(Block* block) {
    block->gc_count_base = get_free_blocks_call_count;
    blocks.insert(block);
  }
  rules::Pool kind() const { return is_small ? rules::Pool::kSmall : rules::Pool::kLarge; }
  bool is_private() const { return memory_pool != kDefaultPool; }
};

/// PrivatePool: a CUDA graph's or a torch.cuda.MemPool's own small and large
/// pools (CUDACachingAllocator.cpp `struct PrivatePool`).
struct PrivatePool {
  explicit PrivatePool(PoolId id) : large_blocks(false, id), small_blocks(true, id) {}
  BlockPool large_blocks;
  BlockPool small_blocks;
};

/// ExpandableSegment: a virtual range of `num_pages` pages of `page_size`.
struct ExpandableSegment {
  std::uint64_t base = 0;
  int64_t page_size = 0;
  int64_t num_pages = 0;
  std::vector<bool> page_mapped;

  int64_t size() const { return page_size * num_pages; }
};

/// Recycles Block objects: a replay creates and deletes millions.
class BlockArena {
 public:
  Block* make() {
    if (!free_.empty()) {
      Block* block = free_.back();
      free_.pop_back();
      *block = Block{};
      return block;
    }
    storage_.emplace_back();
    return &storage_.back();
  }
  void release(Block* block) { free_.push_back(block); }

 private:
  std::deque<Block> storage_;
  std::vector<Block*> free_;
};

int64_t align_up(int64_t bytes, int64_t alignment) { return (bytes + alignment - 1) / alignment * alignment; }

void validate(const SimOptions& options) {
  const rules::AllocatorConfig& config = options.config;
  if (config.max_split_size < rules::kLargeBuffer) {
    throw ConfigError(
        fmt::format("allocator config: max_split_size must be >= {} bytes (max_split_size_mb >= 20), got {}",
                    rules::kLargeBuffer, config.max_split_size));
  }
  if (config.max_non_split_rounding_size < rules::kLargeBuffer) {
    throw ConfigError(
        fmt::format("allocator config: max_non_split_rounding_size must be >= {} bytes "
                    "(max_non_split_rounding_mb >= 20), got {}",
                    rules::kLargeBuffer, config.max_non_split_rounding_size));
  }
  for (std::size_t i = 0; i < config.roundup_power2_divisions.size(); ++i) {
    const int64_t divisions = config.roundup_power2_divisions[i];
    if (divisions != 0 && !rules::is_power_of_two(divisions)) {
      throw ConfigError(fmt::format(
          "allocator config: roundup_power2_divisions[{}] has to be a power of 2 or 0, got {}", i, divisions));
    }
  }
  if (!(config.garbage_collection_threshold >= 0.0 && config.garbage_collection_threshold < 1.0)) {
    throw ConfigError(fmt::format("allocator config: garbage_collection_threshold must be in [0, 1), got {}",
                                  config.garbage_collection_threshold));
  }
  if (options.budget_bytes < 0 || options.device_total_bytes < 0) {
    throw ConfigError(fmt::format("simulator: budget_bytes and device_total_bytes must be >= 0, got {} and {}",
                                  options.budget_bytes, options.device_total_bytes));
  }
}

}  // namespace

struct CachingAllocatorSim::Impl {
  explicit Impl(SimOptions options) : options_(std::move(options)), config_(options_.config) {
    validate(options_);
    live_.reserve(1 << 12);
  }

  ~Impl() = default;

  // ---- events -------------------------------------------------------------

  bool apply(const AllocEvent& event) {
    if (static_cast<std::size_t>(event.phase) >= kNumPhases) {
      throw InputError(fmt::format("allocation event {}: phase {} is not a phase of a step", result_.num_events,
                                   static_cast<int>(event.phase)));
    }
    phase_ = event.phase;
    op_ = &event.op;
    bool ok = true;
    if (event.kind == AllocEventKind::kAlloc) {
      ok = malloc(event.id, event.bytes, kDefaultPool, kDefaultStream);
    } else {
      free(event.id);
    }
    op_ = nullptr;
    return ok;
  }

  /// DeviceCachingAllocator::malloc().
  bool malloc(std::uint64_t id, int64_t orig_size, PoolId memory_pool, StreamId stream) {
    const int64_t index = begin_event();
    if (stopped_) {  // SimOptions::stop_at_first_oom: the step is over
      ignorable_.insert(id);
      end_event();
      return true;
    }
    if (live_.count(id) != 0) {
      throw InputError(fmt::format("allocation event {}: id {} is allocated again before it was freed", index, id));
    }
    if (orig_size <= 0) {  // allocate(0) returns a null pointer without calling malloc
      ignorable_.insert(id);
      end_event();
      return true;
    }
    const int64_t size = rules::round_size(orig_size, config_);
    BlockPool& pool = get_pool(size <= rules::kSmallSize ? rules::Pool::kSmall : rules::Pool::kLarge, memory_pool);
    const int64_t alloc_size = rules::segment_size_for(size);

    Block* block = get_free_block(pool, stream, size);
    if (block == nullptr) {
      if (gc_enabled()) garbage_collect_cached_blocks();
      block = alloc_block(pool, stream, size, alloc_size, /*is_retry=*/false);
      if (block == nullptr && release_available_cached_blocks(pool, stream, size)) {
        block = alloc_block(pool, stream, size, alloc_size, /*is_retry=*/false);
      }
      if (block == nullptr) {
        release_cached_blocks();  // always "succeeds", so the retry always happens
        block = alloc_block(pool, stream, size, alloc_size, /*is_retry=*/true);
      }
    }
    if (block == nullptr) {
      record_oom(index, id, orig_size, size, alloc_size);
      ignorable_.insert(id);
      if (options_.stop_at_first_oom) stopped_ = true;
      end_event();
      return false;
    }
    const bool split_remainder = rules::should_split(pool.kind(), block->size, size, config_);
    block = alloc_found_block(block, pool, size, orig_size, split_remainder);
    block->id = id;
    live_.emplace(id, block);
    allocated_bytes_ += block->size;
    requested_bytes_ += orig_size;
    update_peaks(index);
    end_event();
    return true;
  }

  /// DeviceCachingAllocator::free() for a block without stream uses (or
  /// whose uses completed: the caller frees at free_completed).
  void free(std::uint64_t id) {
    const int64_t index = begin_event();
    if (stopped_) {
      end_event();
      return;
    }
    auto it = live_.find(id);
    if (it == live_.end()) {
      if (ignorable_.erase(id) != 0) {
        end_event();
        return;
      }
      throw InputError(
          fmt::format("free event {}: id {} is not a live allocation (never allocated, or freed twice)", index, id));
    }
    Block* block = it->second;
    live_.erase(it);
    block->allocated = false;
    allocated_bytes_ -= block->size;
    requested_bytes_ -= block->requested_size;
    free_block(block);
    end_event();
  }

  void empty_cache() {
    release_cached_blocks();
    sync_current();
  }

  // ---- initial state ------------------------------------------------------

  void add_existing_segment(const ExistingSegment& segment) {
    if (result_.num_events != 0) {
      throw InputError("simulator: existing segments must be added before the first event");
    }
    if (config_.expandable_segments) {
      throw InputError("simulator: existing segments are not supported with expandable_segments");
    }
    if (segment.bytes <= 0) {
      throw InputError(
          fmt::format("existing segment at {:#x}: size must be > 0, got {}", segment.address, segment.bytes));
    }
    BlockPool& pool = get_pool(segment.pool, segment.memory_pool);
    std::vector<ExistingBlock> blocks = segment.allocated_blocks;
    std::sort(blocks.begin(), blocks.end(),
              [](const ExistingBlock& a, const ExistingBlock& b) { return a.address < b.address; });

    const std::uint64_t end = segment.address + static_cast<std::uint64_t>(segment.bytes);
    std::uint64_t cursor = segment.address;
    Block* last = nullptr;
    auto append = [&](std::uint64_t ptr, int64_t size) {
      Block* block = arena_.make();
      block->stream = segment.stream;
      block->ptr = ptr;
      block->size = size;
      block->pool = &pool;
      block->prev = last;
      if (last != nullptr) last->next = block;
      last = block;
      return block;
    };
    std::vector<Block*> free_blocks;
    for (const ExistingBlock& existing : blocks) {
      if (existing.address < cursor || existing.bytes <= 0 ||
          existing.address + static_cast<std::uint64_t>(existing.bytes) > end) {
        throw InputError(
            fmt::format("existing segment at {:#x} ({} bytes): block {:#x} ({} bytes) overlaps another block "
                        "or lies outside the segment",
                        segment.address, segment.bytes, existing.address, existing.bytes));
      }
      if (live_.count(existing.id) != 0) {
        throw InputError(fmt::format("existing segment at {:#x}: id {} is used twice", segment.address, existing.id));
      }
      if (existing.address > cursor) {
        free_blocks.push_back(append(cursor, static_cast<int64_t>(existing.address - cursor)));
      }
      Block* block = append(existing.address, existing.bytes);
      block->allocated = true;
      block->id = existing.id;
      block->requested_size = existing.requested_bytes;
      live_.emplace(existing.id, block);
      allocated_bytes_ += existing.bytes;
      requested_bytes_ += existing.requested_bytes;
      cursor = existing.address + static_cast<std::uint64_t>(existing.bytes);
    }
    if (cursor < end) free_blocks.push_back(append(cursor, static_cast<int64_t>(end - cursor)));
    for (Block* block : free_blocks) pool.insert_into_blocks(block);

    total_allocated_memory_ += segment.bytes;
    next_synthetic_address_ = std::max(
        next_synthetic_address_, static_cast<std::uint64_t>(align_up(static_cast<int64_t>(end), kSegmentAlignment)));
    update_peaks(-1);
    sync_current();
  }

  void use_segment_addresses(std::vector<std::uint64_t> addresses) {
    real_addresses_ = std::move(addresses);
    next_real_address_ = 0;
  }

  // ---- queries ------------------------------------------------------------

  std::optional<std::uint64_t> address_of(std::uint64_t id) const {
    auto it = live_.find(id);
    if (it == live_.end()) return std::nullopt;
    return it->second->ptr;
  }

  /// cache_info(): the largest cached free block, of any stream.
  int64_t largest_free_block() const {
    return std::max(largest_free_block(small_blocks_), largest_free_block(large_blocks_));
  }

  /// snapshot(): one entry per segment (per mapped range of an expandable
  /// segment), blocks in address order.
  std::vector<SegmentInfo> snapshot() const {
    std::vector<const Block*> heads;
    auto consider = [&heads](const Block* b) {
      if (b->prev == nullptr || !b->prev->mapped) heads.push_back(b);
    };
    for (const Block* b : small_blocks_.blocks) consider(b);
    for (const Block* b : large_blocks_.blocks) consider(b);
    for (const auto& [id, pool] : private_pools_) {
      for (const Block* b : pool->small_blocks.blocks) consider(b);
      for (const Block* b : pool->large_blocks.blocks) consider(b);
    }
    for (const auto& entry : live_) consider(entry.second);
    std::vector<SegmentInfo> segments;
    segments.reserve(heads.size());
    for (const Block* head : heads) {
      SegmentInfo segment;
      segment.address = head->ptr;
      segment.pool = head->pool->kind();
      segment.is_expandable = head->expandable_segment != nullptr;
      segment.memory_pool = head->pool->memory_pool;
      segment.stream = head->stream;
      for (const Block* b = head; b != nullptr && b->mapped; b = b->next) {
        BlockInfo info;
        info.address = b->ptr;
        info.bytes = b->size;
        info.allocated = b->allocated;
        info.requested_bytes = b->allocated ? b->requested_size : 0;
        info.id = b->allocated ? b->id : 0;
        segment.bytes += b->size;
        segment.blocks.push_back(info);
      }
      segments.push_back(std::move(segment));
    }
    std::sort(segments.begin(), segments.end(),
              [](const SegmentInfo& a, const SegmentInfo& b) { return a.address < b.address; });
    return segments;
  }

  int64_t reserved_bytes() const { return total_allocated_memory_; }
  int64_t allocated_bytes() const { return allocated_bytes_; }
  const SimResult& result() const { return result_; }

 private:
  // ---- bookkeeping ----------------------------------------------------------

  int64_t begin_event() { return result_.num_events; }

  void end_event() {
    ++result_.num_events;
    sync_current();
    int64_t& phase_peak = result_.peak_reserved_by_phase[static_cast<std::size_t>(phase_)];
    phase_peak = std::max(phase_peak, total_allocated_memory_);
  }

  void sync_current() {
    result_.reserved_bytes = total_allocated_memory_;
    result_.allocated_bytes = allocated_bytes_;
  }

  /// Note [Reserved peak].
  void update_peaks(int64_t index) {
    if (total_allocated_memory_ > result_.peak_reserved_bytes) {
      result_.peak_reserved_bytes = total_allocated_memory_;
      result_.fragmentation_at_peak_bytes = total_allocated_memory_ - allocated_bytes_;
      result_.largest_free_block_at_peak_bytes = largest_free_block();
      result_.peak_reserved_event_index = index;
      if (op_ != nullptr) {
        result_.peak_reserved_op = *op_;
      } else {
        result_.peak_reserved_op.clear();
      }
    }
    result_.peak_allocated_bytes = std::max(result_.peak_allocated_bytes, allocated_bytes_);
    result_.peak_requested_bytes = std::max(result_.peak_requested_bytes, requested_bytes_);
  }

  void record_oom(int64_t index, std::uint64_t id, int64_t orig_size, int64_t size, int64_t alloc_size) {
    OomRecord record;
    record.event_index = index;
    record.id = id;
    record.requested_bytes = orig_size;
    record.rounded_bytes = size;
    record.segment_bytes = alloc_size;
    record.reserved_bytes = total_allocated_memory_;
    record.allocated_bytes = allocated_bytes_;
    if (op_ != nullptr) record.op = *op_;
    result_.ooms.push_back(record);
    ++result_.num_ooms;
    if (!result_.oom) {
      result_.oom = true;
      result_.first_oom_event_index = index;
    }
  }

  void log_segment(SegmentAction action, std::uint64_t address, int64_t bytes) {
    if (!options_.record_segment_log) return;
    SegmentLogEntry entry;
    entry.action = action;
    entry.event_index = result_.num_events;
    entry.address = address;
    entry.bytes = bytes;
    result_.segment_log.push_back(entry);
  }

  bool gc_enabled() const { return options_.budget_bytes > 0 && config_.garbage_collection_threshold > 0.0; }

  bool over_device(int64_t extra) const {
    return options_.device_total_bytes > 0 && total_allocated_memory_ + extra > options_.device_total_bytes;
  }

  std::uint64_t next_synthetic(int64_t bytes) {
    const std::uint64_t address = next_synthetic_address_;
    next_synthetic_address_ += static_cast<std::uint64_t>(align_up(bytes, kSegmentAlignment));
    return address;
  }

  /// Note [Synthetic addresses].
  std::uint64_t next_segment_address(int64_t bytes) {
    if (next_real_address_ < real_addresses_.size()) return real_addresses_[next_real_address_++];
    return next_synthetic(bytes);
  }

  // ---- finding and carving blocks -------------------------------------------

  /// get_pool(): the small or large pool (`kind`) of the default pool or of
  /// private pool `memory_pool` (made on its first use, as
  /// beginAllocateToPool makes a PrivatePool).
  BlockPool& get_pool(rules::Pool kind, PoolId memory_pool) {
    const bool small = kind == rules::Pool::kSmall;
    if (memory_pool == kDefaultPool) return small ? small_blocks_ : large_blocks_;
    std::unique_ptr<PrivatePool>& pool = private_pools_[memory_pool];
    if (pool == nullptr) pool = std::make_unique<PrivatePool>(memory_pool);
    return small ? pool->small_blocks : pool->large_blocks;
  }

  /// The largest cached free block of `pool`, of any stream: the set is
  /// ordered by stream first, so each stream's largest is the last before
  /// the next stream's first.
  static int64_t largest_free_block(const BlockPool& pool) {
    int64_t largest = 0;
    auto end = pool.blocks.end();
    while (end != pool.blocks.begin()) {
      const Block* last = *std::prev(end);
      largest = std::max(largest, last->size);
      Block key;
      key.stream = last->stream;
      key.size = 0;
      end = pool.blocks.lower_bound(&key);  // the stream's first block
    }
    return largest;
  }

  /// get_free_block(): best fit on `stream` by size then address, with the
  /// expandable and max_split_size rules.
  Block* get_free_block(BlockPool& pool, StreamId stream, int64_t size) {
    if (gc_enabled()) ++pool.get_free_blocks_call_count;
    Block key;
    key.stream = stream;
    key.size = size;
    key.ptr = 0;
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
    if ((*it)->expandable_segment != nullptr) {
      if (config_.expandable_segments) {
        // Best fit counts the unmapped room after a block as part of its size.
        auto expandable_size = [](const Block* b) {
          return b->size + (b->next != nullptr && !b->next->mapped ? b->next->size : 0);
        };
        auto next = std::next(it);
        while ((*it)->expandable_segment != nullptr && next != pool.blocks.end() && (*next)->stream == stream &&
               expandable_size(*next) < expandable_size(*it)) {
          it = next++;
        }
      } else {
        do {
          ++it;
        } while (it != pool.blocks.end() && (*it)->expandable_segment != nullptr && (*it)->stream == stream);
        if (it == pool.blocks.end() || (*it)->stream != stream) return nullptr;
      }
    }
    if (!rules::may_reuse_block((*it)->size, size, config_)) return nullptr;
    Block* block = *it;
    pool.blocks.erase(it);
    return block;
  }

  /// alloc_found_block(): split off the remainder when should_split() says so.
  Block* alloc_found_block(Block* block, BlockPool& pool, int64_t size, int64_t orig_size, bool split_remainder) {
    if (split_remainder) {
      Block* remaining = block;
      block = arena_.make();
      block->stream = remaining->stream;
      block->ptr = remaining->ptr;
      block->size = size;
      block->pool = &pool;
      block->expandable_segment = remaining->expandable_segment;
      block->prev = remaining->prev;
      if (block->prev != nullptr) block->prev->next = block;
      block->next = remaining;
      remaining->prev = block;
      remaining->ptr += static_cast<std::uint64_t>(size);
      remaining->size -= size;
      pool.insert_into_blocks(remaining);
    }
    block->allocated = true;
    block->requested_size = orig_size;
    return block;
  }

  /// try_merge_blocks(): absorb `src` into `dst` when it is free (and mapped
  /// alike). Returns the bytes absorbed.
  int64_t try_merge_blocks(Block* dst, Block* src) {
    if (src == nullptr || src->allocated || dst->mapped != src->mapped) return 0;
    if (dst->prev == src) {  // [src dst]
      dst->ptr = src->ptr;
      dst->prev = src->prev;
      if (dst->prev != nullptr) dst->prev->next = dst;
    } else {  // [dst src]
      dst->next = src->next;
      if (dst->next != nullptr) dst->next->prev = dst;
    }
    const int64_t subsumed = src->size;
    dst->size += subsumed;
    BlockPool& pool = *src->pool;
    if (src->mapped) {
      pool.blocks.erase(src);
    } else {
      pool.unmapped.erase(src);
    }
    arena_.release(src);
    return subsumed;
  }

  /// free_block(): merge with free neighbours, then cache.
  void free_block(Block* block) {
    try_merge_blocks(block, block->prev);
    try_merge_blocks(block, block->next);
    block->pool->insert_into_blocks(block);
  }

  // ---- getting memory from CUDA ---------------------------------------------

  /// alloc_block(): a new segment (or mapped pages) of `alloc_size` bytes for
  /// `stream`, or nullptr when the budget or the device has no room.
  Block* alloc_block(BlockPool& pool, StreamId stream, int64_t size, int64_t alloc_size, bool is_retry) {
    if (is_retry) ++result_.num_alloc_retries;
    if (options_.budget_bytes > 0 && total_allocated_memory_ + alloc_size > options_.budget_bytes) {
      return nullptr;
    }
    // alloc_block(): "our checkpointing logic for private pools doesn't
    // support the expandable_segments_ structure yet".
    if (config_.expandable_segments && !pool.is_private()) return try_allocate_expandable_block(pool, stream, size);
    if (over_device(alloc_size)) return nullptr;  // cudaMalloc: cudaErrorMemoryAllocation
    Block* block = arena_.make();
    block->stream = stream;
    block->ptr = next_segment_address(alloc_size);
    block->size = alloc_size;
    block->pool = &pool;
    total_allocated_memory_ += alloc_size;
    ++result_.num_device_alloc;
    log_segment(SegmentAction::kAlloc, block->ptr, alloc_size);
    return block;
  }

  /// release_block(): cudaFree of a whole cached segment.
  void release_block(Block* block) {
    if (block->is_split() || block->expandable_segment != nullptr) {
      throw std::logic_error("allocsim: release_block on a split or expandable block");
    }
    ++result_.num_device_free;
    log_segment(SegmentAction::kFree, block->ptr, block->size);
    total_allocated_memory_ -= block->size;
    block->pool->blocks.erase(block);
    arena_.release(block);
  }

  /// release_available_cached_blocks(): with max_split_size set, free one
  /// oversize cached segment of `stream` large enough for the request, or
  /// else its largest oversize ones until enough is freed.
  bool release_available_cached_blocks(BlockPool& pool, StreamId stream, int64_t size) {
    if (config_.max_split_size == rules::kNoMaxSplitSize) return false;
    Block key;
    key.stream = stream;
    key.size = std::max(size, config_.max_split_size);
    key.ptr = 0;
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != stream || (*it)->expandable_segment != nullptr) {
      if (it == pool.blocks.begin()) return false;
      int64_t total_released = 0;
      --it;  // the largest block of the stream, if it has any
      while (total_released < key.size && (*it)->size >= config_.max_split_size && (*it)->stream == stream) {
        auto cur = it;
        const bool is_first = cur == pool.blocks.begin();
        if (!is_first) --it;
        Block* block = *cur;
        if (block->expandable_segment == nullptr) {
          total_released += block->size;
          release_block(block);
        }
        if (is_first) break;
      }
      if (total_released < key.size) return false;
    } else {
      release_block(*it);
    }
    return true;
  }

  /// release_cached_blocks(): free every unsplit cached segment (large pool,
  /// then small), unmap free expandable pages. Private pools are all taken
  /// as a live graph's, which PyTorch leaves alone (it frees
  /// graph_pools_freeable only).
  void release_cached_blocks() {
    release_blocks(large_blocks_);
    release_blocks(small_blocks_);
  }

  /// release_blocks().
  void release_blocks(BlockPool& pool) {
    std::vector<Block*> to_unmap;
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      Block* block = *it;
      ++it;
      if (block->expandable_segment != nullptr) {
        to_unmap.push_back(block);
      } else if (!block->is_split()) {
        release_block(block);
      }
    }
    for (Block* block : to_unmap) {
      unmap_block(block);
      if (!block->is_split()) release_expandable_segment(block);
    }
  }

  /// garbage_collect_cached_blocks(): past threshold × budget, free unsplit
  /// large cached segments whose age (get_free_block calls on the pool since
  /// they were cached) is at least the average, until reserved is back under
  /// the threshold.
  void garbage_collect_cached_blocks() {
    const auto gc_threshold =
        static_cast<int64_t>(config_.garbage_collection_threshold * static_cast<double>(options_.budget_bytes));
    if (total_allocated_memory_ <= gc_threshold) return;
    const int64_t target_size = total_allocated_memory_ - gc_threshold;
    int64_t gc_reclaimed = 0;
    BlockPool& pool = large_blocks_;
    auto gc_count = [&pool](const Block* b) { return pool.get_free_blocks_call_count - b->gc_count_base; };

    int64_t total_age = 0;
    int64_t freeable_block_count = 0;
    for (const Block* b : pool.blocks) {
      if (!b->is_split()) {
        total_age += gc_count(b);
        ++freeable_block_count;
      }
    }
    if (freeable_block_count == 0) return;

    bool block_freed = true;
    while (gc_reclaimed < target_size && block_freed && freeable_block_count > 0) {
      const double age_threshold = static_cast<double>(total_age) / static_cast<double>(freeable_block_count);
      block_freed = false;
      for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
        Block* block = *it;
        ++it;
        if (!block->is_split() && block->expandable_segment == nullptr &&
            static_cast<double>(gc_count(block)) >= age_threshold) {
          block_freed = true;
          gc_reclaimed += block->size;
          total_age -= gc_count(block);
          --freeable_block_count;
          release_block(block);
        }
      }
    }
  }

  // ---- expandable segments (Note [Expandable segments in the simulator]) ----

  /// find_expandable_block(): the lowest-address free-and-unmapped run of
  /// `stream`'s segments with room for `size`, or a new segment of its own.
  Block* find_expandable_block(BlockPool& pool, StreamId stream, int64_t size) {
    auto allocatable = [](const Block* b) { return b != nullptr && !b->allocated; };
    auto has_available_address_space = [&](const Block* b) {
      int64_t bytes = 0;
      while (bytes < size && allocatable(b)) {
        bytes += b->size;
        b = b->next;
      }
      return bytes >= size;
    };
    Block key;
    key.stream = stream;
    key.ptr = 0;
    for (auto it = pool.unmapped.lower_bound(&key); it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
      Block* c = *it;
      if (allocatable(c->prev)) c = c->prev;
      if (has_available_address_space(c)) return c;
    }
    const int64_t page = pool.is_small ? rules::kExpandablePageSmall : rules::kExpandablePageLarge;
    int64_t device_total = options_.device_total_bytes;
    if (device_total == 0) device_total = std::max(options_.budget_bytes, kAssumedDeviceTotal);
    const int64_t address_space = device_total + device_total / 8;
    auto segment = std::make_unique<ExpandableSegment>();
    segment->page_size = page;
    segment->num_pages = (address_space + page - 1) / page;
    segment->page_mapped.assign(static_cast<std::size_t>(segment->num_pages), false);
    segment->base = next_synthetic(segment->size());
    Block* block = arena_.make();
    block->stream = stream;
    block->ptr = segment->base;
    block->size = segment->size();
    block->pool = &pool;
    block->mapped = false;
    block->expandable_segment = segment.get();
    expandable_segments_.push_back(std::move(segment));
    pool.unmapped.insert(block);
    return block;
  }

  /// try_allocate_expandable_block().
  Block* try_allocate_expandable_block(BlockPool& pool, StreamId stream, int64_t size) {
    Block* candidate = find_expandable_block(pool, stream, size);
    if (!candidate->mapped && !map_block(candidate, std::min(candidate->size, size))) return nullptr;
    while (candidate->size < size) {
      // invariant: free -> unmapped -> *; mapping merges the free block in.
      const int64_t remaining = size - candidate->size;
      Block* new_candidate = candidate->next;
      if (!map_block(new_candidate, std::min(remaining, new_candidate->size))) return nullptr;
      candidate = new_candidate;
    }
    pool.blocks.erase(candidate);
    return candidate;
  }

  /// map_block(): back the first `size` bytes (rounded up to pages) of an
  /// unmapped range with pages, then merge with free neighbours.
  bool map_block(Block* to_map, int64_t size) {
    ExpandableSegment& segment = *to_map->expandable_segment;
    const auto offset = static_cast<int64_t>(to_map->ptr - segment.base);
    const int64_t begin = offset / segment.page_size;
    const int64_t end = (offset + size + segment.page_size - 1) / segment.page_size;
    const int64_t mapped_size = (end - begin) * segment.page_size;
    if (mapped_size == 0 || over_device(mapped_size)) return false;  // cuMemCreate failed
    for (int64_t page = begin; page < end; ++page) {
      segment.page_mapped[static_cast<std::size_t>(page)] = true;
    }
    BlockPool& pool = *to_map->pool;
    pool.unmapped.erase(to_map);
    to_map->mapped = true;
    const std::uint64_t mapped_ptr = to_map->ptr;
    if (mapped_size < to_map->size) {
      Block* remaining = arena_.make();
      remaining->stream = to_map->stream;
      remaining->ptr = to_map->ptr + static_cast<std::uint64_t>(mapped_size);
      remaining->size = to_map->size - mapped_size;
      remaining->pool = &pool;
      remaining->mapped = false;
      remaining->expandable_segment = to_map->expandable_segment;
      remaining->prev = to_map;
      remaining->next = to_map->next;
      if (to_map->next != nullptr) to_map->next->prev = remaining;
      to_map->next = remaining;
      pool.unmapped.insert(remaining);
      to_map->size = mapped_size;
    }
    try_merge_blocks(to_map, to_map->prev);
    try_merge_blocks(to_map, to_map->next);
    pool.insert_into_blocks(to_map);
    total_allocated_memory_ += mapped_size;
    ++result_.num_device_alloc;
    log_segment(SegmentAction::kMap, mapped_ptr, mapped_size);
    return true;
  }

  /// unmap_block(): give back the whole pages inside a free block.
  void unmap_block(Block* block) {
    ExpandableSegment& segment = *block->expandable_segment;
    const auto offset = static_cast<int64_t>(block->ptr - segment.base);
    const int64_t begin = (offset + segment.page_size - 1) / segment.page_size;
    const int64_t end = (offset + block->size) / segment.page_size;
    if (begin >= end) return;
    BlockPool& pool = *block->pool;
    pool.blocks.erase(block);
    const std::uint64_t unmapped_ptr = segment.base + static_cast<std::uint64_t>(begin * segment.page_size);
    const int64_t unmapped_size = (end - begin) * segment.page_size;

    const auto before_size = static_cast<int64_t>(unmapped_ptr - block->ptr);
    if (before_size > 0) {  // prev? -> before_free -> block
      Block* before_free = arena_.make();
      before_free->stream = block->stream;
      before_free->ptr = block->ptr;
      before_free->size = before_size;
      before_free->pool = &pool;
      before_free->expandable_segment = block->expandable_segment;
      before_free->prev = block->prev;
      before_free->next = block;
      if (block->prev != nullptr) block->prev->next = before_free;
      block->prev = before_free;
      pool.insert_into_blocks(before_free);
    }
    const int64_t after_size = block->size - (before_size + unmapped_size);
    if (after_size > 0) {  // block -> after_free -> next?
      Block* after_free = arena_.make();
      after_free->stream = block->stream;
      after_free->ptr = unmapped_ptr + static_cast<std::uint64_t>(unmapped_size);
      after_free->size = after_size;
      after_free->pool = &pool;
      after_free->expandable_segment = block->expandable_segment;
      after_free->prev = block;
      after_free->next = block->next;
      if (block->next != nullptr) block->next->prev = after_free;
      block->next = after_free;
      pool.insert_into_blocks(after_free);
    }
    block->ptr = unmapped_ptr;
    block->size = unmapped_size;
    block->mapped = false;
    for (int64_t page = begin; page < end; ++page) {
      segment.page_mapped[static_cast<std::size_t>(page)] = false;
    }
    try_merge_blocks(block, block->prev);
    try_merge_blocks(block, block->next);
    pool.unmapped.insert(block);
    total_allocated_memory_ -= unmapped_size;
    ++result_.num_device_free;
    log_segment(SegmentAction::kUnmap, unmapped_ptr, unmapped_size);
  }

  /// release_expandable_segment(): drop a segment with nothing mapped.
  void release_expandable_segment(Block* block) {
    if (block->mapped || block->size != block->expandable_segment->size()) {
      throw std::logic_error("allocsim: expandable block disagrees with its segment");
    }
    block->pool->unmapped.erase(block);
    ExpandableSegment* segment = block->expandable_segment;
    expandable_segments_.erase(
        std::find_if(expandable_segments_.begin(), expandable_segments_.end(),
                     [segment](const std::unique_ptr<ExpandableSegment>& s) { return s.get() == segment; }));
    arena_.release(block);
  }

  SimOptions options_;
  const rules::AllocatorConfig& config_;
  BlockArena arena_;
  BlockPool large_blocks_{false, kDefaultPool};
  BlockPool small_blocks_{true, kDefaultPool};
  std::map<PoolId, std::unique_ptr<PrivatePool>> private_pools_;
  std::unordered_map<std::uint64_t, Block*> live_;  // allocated blocks by id
  std::unordered_set<std::uint64_t> ignorable_;     // zero-byte and failed allocations
  std::vector<std::unique_ptr<ExpandableSegment>> expandable_segments_;
  int64_t total_allocated_memory_ = 0;  // reserved bytes
  int64_t allocated_bytes_ = 0;
  int64_t requested_bytes_ = 0;
  std::vector<std::uint64_t> real_addresses_;
  std::size_t next_real_address_ = 0;
  std::uint64_t next_synthetic_address_ = kSyntheticBase;
  Phase phase_ = Phase::kLoad;
  const std::string* op_ = nullptr;  // operator of the event being applied
  bool stopped_ = false;
  SimResult result_;
};

CachingAllocatorSim::CachingAllocatorSim(SimOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
CachingAllocatorSim::~CachingAllocatorSim() = default;
CachingAllocatorSim::CachingAllocatorSim(CachingAllocatorSim&&) noexcept = default;
CachingAllocatorSim& CachingAllocatorSim::operator=(CachingAllocatorSim&&) noexcept = default;

void CachingAllocatorSim::add_existing_segment(const ExistingSegment& segment) { impl_->add_existing_segment(segment); }
void CachingAllocatorSim::use_segment_addresses(std::vector<std::uint64_t> addresses) {
  impl_->use_segment_addresses(std::move(addresses));
}
bool CachingAllocatorSim::apply(const AllocEvent& event) { return impl_->apply(event); }
bool CachingAllocatorSim::malloc(std::uint64_t id, int64_t bytes, PoolId memory_pool, StreamId stream) {
  return impl_->malloc(id, bytes, memory_pool, stream);
}
void CachingAllocatorSim::free(std::uint64_t id) { impl_->free(id); }
void CachingAllocatorSim::empty_cache() { impl_->empty_cache(); }
std::optional<std::uint64_t> CachingAllocatorSim::address_of(std::uint64_t id) const { return impl_->address_of(id); }
int64_t CachingAllocatorSim::reserved_bytes() const { return impl_->reserved_bytes(); }
int64_t CachingAllocatorSim::allocated_bytes() const { return impl_->allocated_bytes(); }
int64_t CachingAllocatorSim::largest_free_block() const { return impl_->largest_free_block(); }
std::vector<SegmentInfo> CachingAllocatorSim::snapshot() const { return impl_->snapshot(); }
const SimResult& CachingAllocatorSim::result() const { return impl_->result(); }

SimResult replay(const std::vector<AllocEvent>& events, const SimOptions& options) {
  CachingAllocatorSim sim(options);
  for (const AllocEvent& event : events) sim.apply(event);
  return sim.result();
}

}  // namespace oomtune::allocsim
