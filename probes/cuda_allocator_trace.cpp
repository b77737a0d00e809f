#include "probes/cuda_allocator_trace.h"

#include <atomic>
#include <mutex>
#include <stdexcept>

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>

namespace oomtune {
namespace {

using c10::cuda::CUDACachingAllocator::TraceEntry;

std::atomic<MemoryTracker*> g_tracker{nullptr};
std::atomic<int> g_device{-1};
std::atomic<int64_t> g_oom_free{-1};
std::once_flag g_attached;

void on_trace(const TraceEntry& entry) {
  MemoryTracker* tracker = g_tracker.load();
  if (!tracker || entry.device_ != g_device.load()) return;
  switch (entry.action_) {
    case TraceEntry::ALLOC:
      tracker->device_alloc(entry.addr_, static_cast<int64_t>(entry.size_));
      break;
    case TraceEntry::FREE_COMPLETED:
      tracker->device_free(entry.addr_);
      break;
    case TraceEntry::OOM:  // addr_ holds the device's free bytes
      g_oom_free.store(static_cast<int64_t>(entry.addr_));
      break;
    default:  // segments are the DeviceStatsSource's; FREE_REQUESTED waits for other streams
      break;
  }
}

}  // namespace

CudaTraceFeed::CudaTraceFeed(MemoryTracker& tracker, int device) {
  // The allocator attaches a tracker to each device allocator it has made,
  // and makes them when CUDA is initialised (lazily in PyTorch 2.x): before
  // that the tracker would be dropped, silently (seen on an H200, 2026-11-29).
  at::globalContext().lazyInitDevice(at::kCUDA);
  std::call_once(g_attached, [] { c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(&on_trace); });
  MemoryTracker* none = nullptr;
  if (!g_tracker.compare_exchange_strong(none, &tracker))
    throw std::logic_error("CudaTraceFeed: another feed is already alive");
  g_device.store(device);
  g_oom_free.store(-1);
}

CudaTraceFeed::~CudaTraceFeed() {
  g_tracker.store(nullptr);
  g_device.store(-1);
}

int64_t CudaTraceFeed::oom_free_bytes() const { return g_oom_free.load(); }

}  // namespace oomtune
