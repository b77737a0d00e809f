#include "probes/backward_activation_peak.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

namespace oomtune {

BackwardActivationPeak find_backward_activation_peak(const std::vector<TrackedEvent>& events, std::size_t begin,
                                                     std::size_t end, int64_t live_at_begin,
                                                     const std::unordered_set<uint64_t>& gradient_blocks) {
  if (begin > end || end > events.size()) throw std::out_of_range("find_backward_activation_peak: bad event range");
  // The allocation that made each gradient block; earlier ones at its
  // address were freed within the range.
  std::unordered_map<uint64_t, std::size_t> gradient_allocation;
  for (std::size_t i = begin; i < end; ++i) {
    const TrackedEvent& e = events[i];
    if (e.kind == TrackedEvent::Kind::kAlloc && e.pool == MemoryPool::kDevice && gradient_blocks.count(e.address))
      gradient_allocation[e.address] = i;
  }
  BackwardActivationPeak peak;
  peak.live_bytes = peak.accumulating_bytes = live_at_begin;
  peak.by_gradients = {{0, live_at_begin, live_at_begin}};
  int64_t live = live_at_begin, gradients = 0;
  // A later micro-batch holds the gradients of the node running now (its
  // frame run) until the node finishes; those of earlier nodes are in the
  // stored ones by then.
  int64_t pending = 0;
  uint32_t run = 0;
  for (std::size_t i = begin; i < end; ++i) {
    const TrackedEvent& e = events[i];
    if (e.pool != MemoryPool::kDevice) continue;
    if (e.kind == TrackedEvent::Kind::kFree) {
      live -= e.bytes;
      continue;
    }
    if (e.frame_run != run) pending = 0;
    run = e.frame_run;
    live += e.bytes;
    const auto made = gradient_allocation.find(e.address);
    if (made != gradient_allocation.end() && made->second == i) {
      gradients += e.bytes;
      pending += e.bytes;
      peak.by_gradients.push_back({gradients, live, live - gradients + pending});
    }
    GradientLevel& level = peak.by_gradients.back();
    level.live_bytes = std::max(level.live_bytes, live);
    level.accumulating_bytes = std::max(level.accumulating_bytes, live - gradients + pending);
    if (live - gradients > peak.live_bytes - peak.gradient_bytes) {
      peak.live_bytes = live;
      peak.gradient_bytes = gradients;
    }
    peak.accumulating_bytes = std::max(peak.accumulating_bytes, live - gradients + pending);
  }
  return peak;
}

}  // namespace oomtune
