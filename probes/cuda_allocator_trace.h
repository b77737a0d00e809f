#pragma once
// The CUDA caching allocator's blocks as MemoryTracker records (issue #44,
// item 2; CUDA builds only: OOMTUNE_WITH_CUDA). The allocator calls every
// attached trace tracker on each ALLOC, FREE_COMPLETED, SEGMENT_* and OOM
// entry, whether or not history is recorded
// (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator::record_trace
// in PyTorch 2.11: "if (!record_history && trace_trackers_.empty())
// return"). ALLOC carries the requested size (orig_size, before rounding)
// and FREE_COMPLETED the same block's, so the event stream holds the bytes
// the CPU backend's would, and the caching-allocator simulator rounds them
// as the device did.
//
// A tracker cannot be detached (CUDAAllocator has no call for it), so one
// is attached per process, at the first feed, and forwards to the feed
// alive at the time (none: nothing). The callback runs under the
// allocator's per-device lock; MemoryTracker takes only its own mutex and
// never calls the allocator while holding it, so the lock order is fixed.

#include <cstdint>

#include "probes/memory_tracker.h"

namespace oomtune {

/// While alive, every block the caching allocator hands out or frees on
/// `device` reaches `tracker` (device_alloc, device_free), and an
/// out-of-memory entry records the device's free bytes (oom_free_bytes).
/// One at a time per process: a second throws std::logic_error.
/// Initialises CUDA first (at::Context::lazyInitDevice); throws c10::Error
/// from CUDA when it cannot.
class CudaTraceFeed {
 public:
  CudaTraceFeed(MemoryTracker& tracker, int device);
  ~CudaTraceFeed();
  CudaTraceFeed(const CudaTraceFeed&) = delete;
  CudaTraceFeed& operator=(const CudaTraceFeed&) = delete;

  /// Bytes free on the device (cudaMemGetInfo) when the allocator last
  /// raised out of memory while this feed was alive (the OOM entry's
  /// address field); -1 when it has not.
  int64_t oom_free_bytes() const;
};

}  // namespace oomtune
