#pragma once
// The size rules of PyTorch's CUDA caching allocator, as plain functions.
//
// Source: c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x; the constants have
// been stable since 1.x): kMinBlockSize, kSmallSize, kSmallBuffer,
// kLargeBuffer, kMinLargeAlloc, kRoundLarge, round_size(),
// roundup_power2_next_division(), get_allocation_size(), should_split(), the
// oversize rules of get_free_block(), and the pool choice in get_pool()
// ("size <= kSmallSize" goes to the small pool). In PyTorch 2.9+ the same
// code lives in c10/core/CachingDeviceAllocator.h (get_round_size(),
// get_allocation_size()) and the options in c10/core/AllocatorConfig.{h,cpp}
// (AcceleratorAllocatorConfig). Checked against both.
//
// No libtorch needed: both the allocator simulator (probes/) and `diagnose`
// (diagnose/) use these. Header-only on purpose.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace oomtune::alloc_rules {

constexpr int64_t kMinBlockSize = 512;        // every block is a multiple of 512 bytes
constexpr int64_t kSmallSize = 1 << 20;       // largest "small" request: 1 MiB
constexpr int64_t kSmallBuffer = 2 << 20;     // small-pool segments are 2 MiB
constexpr int64_t kLargeBuffer = 20 << 20;    // large requests < 10 MiB share 20 MiB segments
constexpr int64_t kMinLargeAlloc = 10 << 20;  // requests >= 10 MiB get their own segment
constexpr int64_t kRoundLarge = 2 << 20;      // ... rounded up to a multiple of 2 MiB

/// max_split_size when PYTORCH_CUDA_ALLOC_CONF does not set max_split_size_mb:
/// "no limit" (PyTorch: std::numeric_limits<size_t>::max(); AllocatorConfig.cpp).
constexpr int64_t kNoMaxSplitSize = std::numeric_limits<int64_t>::max();

/// Default of max_non_split_rounding_mb: an oversize cached block may serve a
/// request at most this much smaller than itself (PyTorch 2.5+:
/// AcceleratorAllocatorConfig::max_non_split_rounding_size_, = kLargeBuffer;
/// older 2.x hard-coded kLargeBuffer in get_free_block()).
constexpr int64_t kDefaultMaxNonSplitRoundingSize = kLargeBuffer;

/// roundup_power2_divisions has one entry per power-of-two interval, starting
/// at 1 MiB and ending at 64 GiB: 16 intervals (AllocatorConfig.cpp:
/// kRoundUpPowerOfTwoIntervals, kRoundUpPowerOfTwoStart, kRoundUpPowerOfTwoEnd).
constexpr std::size_t kRoundUpPowerOfTwoIntervals = 16;
constexpr int kRoundUpPowerOfTwoStartLog2 = 20;  // 1 MiB

/// Page size by which expandable segments grow: 2 MiB for the small pool,
/// kLargeBuffer (20 MiB) for the large pool (find_expandable_block():
/// "segment_size = pool->is_small ? kSmallBuffer : kLargeBuffer"; Note
/// [Expandable Segments]: "we use 2MiB pages for our small pool and 20MiB
/// pages for our large pool").
constexpr int64_t kExpandablePageSmall = kSmallBuffer;
constexpr int64_t kExpandablePageLarge = kLargeBuffer;

/// The allocator options of PYTORCH_CUDA_ALLOC_CONF (PYTORCH_ALLOC_CONF in
/// 2.9+) that change where memory goes. Defaults are PyTorch's.
struct AllocatorConfig {
  /// Bytes; blocks of this size or more are never split, and requests below
  /// it never take them (max_split_size_mb × 1 MiB). Default: no limit.
  int64_t max_split_size = kNoMaxSplitSize;
  /// Bytes; a request >= max_split_size takes an oversize cached block only
  /// if the block is smaller than request + this (max_non_split_rounding_mb).
  int64_t max_non_split_rounding_size = kDefaultMaxNonSplitRoundingSize;
  /// Divisions per power-of-two interval [2^(20+i), 2^(21+i)) bytes, i = 0..15
  /// (interval 0 also covers everything below 2 MiB, the last everything
  /// above 32 GiB). 0 or 1: plain 512-byte rounding.
  std::array<int64_t, kRoundUpPowerOfTwoIntervals> roundup_power2_divisions{};
  /// Fraction of the budget (0, 1): when reserved passes it, cached segments
  /// are freed oldest-first before a new cudaMalloc. 0: off. Only active when
  /// a budget (set_per_process_memory_fraction) is set.
  double garbage_collection_threshold = 0.0;
  /// Segments grow by pages instead of one cudaMalloc per segment.
  bool expandable_segments = false;
};

/// The pool a request of `bytes` is served from.
enum class Pool { kSmall, kLarge };

/// Pool of a request: small when <= kSmallSize. Rounding never moves a
/// request across kSmallSize (1 MiB is a multiple of 512 and a power of two),
/// so the requested and the rounded size give the same pool.
constexpr Pool pool_of(int64_t bytes) { return bytes <= kSmallSize ? Pool::kSmall : Pool::kLarge; }

/// floor(log2(x)) for x > 0.
constexpr int floor_log2(int64_t x) {
  int log = 0;
  while (x > 1) {
    x >>= 1;
    ++log;
  }
  return log;
}

/// True when x is a power of two (x > 0).
constexpr bool is_power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

/// roundup_power2_next_division(): `bytes` rounded up to the next of
/// `divisions` equal steps between the powers of two around it, e.g. 1200
/// with 4 divisions -> 1280 (steps 1024, 1280, 1536, 1792). Powers of two are
/// returned unchanged. `divisions` must be a power of two >= 2.
constexpr int64_t roundup_power2_next_division(int64_t bytes, int64_t divisions) {
  if (is_power_of_two(bytes)) return bytes;
  const int64_t power2_floor = int64_t{1} << floor_log2(bytes);
  const int64_t power2_division = power2_floor >> floor_log2(divisions);
  if (power2_division == 0) return power2_floor << 1;
  const int64_t round_size_floor = bytes & ~(power2_division - 1);
  return round_size_floor == bytes ? bytes : round_size_floor + power2_division;
}

/// AllocatorConfig::roundup_power2_divisions(size): the divisions that apply
/// to a request of `bytes` (interval index log2(bytes) - 20, clamped to 0..15).
constexpr int64_t roundup_power2_divisions_for(const AllocatorConfig& config, int64_t bytes) {
  const int log_size = floor_log2(bytes);
  std::size_t index =
      log_size > kRoundUpPowerOfTwoStartLog2 ? static_cast<std::size_t>(log_size - kRoundUpPowerOfTwoStartLog2) : 0;
  if (index > kRoundUpPowerOfTwoIntervals - 1) index = kRoundUpPowerOfTwoIntervals - 1;
  return config.roundup_power2_divisions[index];
}

/// round_size() without roundup_power2_divisions: bytes rounded up to a
/// multiple of kMinBlockSize, and at least kMinBlockSize.
constexpr int64_t round_size(int64_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((bytes + kMinBlockSize - 1) / kMinBlockSize);
}

/// round_size() with the configured roundup_power2_divisions: when the
/// interval of `bytes` has divisions > 1 and bytes > 512 × divisions, round up
/// to the next division, else to a multiple of 512.
constexpr int64_t round_size(int64_t bytes, const AllocatorConfig& config) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  const int64_t divisions = roundup_power2_divisions_for(config, bytes);
  if (divisions > 1 && bytes > kMinBlockSize * divisions) {
    return roundup_power2_next_division(bytes, divisions);
  }
  return round_size(bytes);
}

/// get_allocation_size(): the size of the segment cudaMalloc'd for a rounded
/// request that no cached block can serve.
constexpr int64_t segment_size_for(int64_t rounded_bytes) {
  if (rounded_bytes <= kSmallSize) return kSmallBuffer;
  if (rounded_bytes < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded_bytes + kRoundLarge - 1) / kRoundLarge);
}

/// should_split(): whether a free block of `block_bytes` serving a rounded
/// request of `rounded_bytes` is split, leaving the rest as a free block. Small
/// pool (and any pool under expandable_segments): when at least 512 bytes are
/// left. Large pool: when the request is below max_split_size and MORE than
/// kSmallSize (1 MiB) is left; otherwise the whole block is handed out.
constexpr bool should_split(Pool pool, int64_t block_bytes, int64_t rounded_bytes, const AllocatorConfig& config) {
  const int64_t remaining = block_bytes - rounded_bytes;
  if (pool == Pool::kSmall || config.expandable_segments) return remaining >= kMinBlockSize;
  return rounded_bytes < config.max_split_size && remaining > kSmallSize;
}

/// The max_split_size rules of get_free_block(): may the best-fitting cached
/// block of `block_bytes` serve a rounded request of `rounded_bytes`? A
/// request below max_split_size never takes an oversize block (>=
/// max_split_size); an oversize request takes one only if the block is
/// smaller than request + max_non_split_rounding_size.
constexpr bool may_reuse_block(int64_t block_bytes, int64_t rounded_bytes, const AllocatorConfig& config) {
  if (rounded_bytes < config.max_split_size && block_bytes >= config.max_split_size) return false;
  if (rounded_bytes >= config.max_split_size &&
      block_bytes - rounded_bytes >= config.max_non_split_rounding_size) {  // no overflow
    return false;
  }
  return true;
}

}  // namespace oomtune::alloc_rules
