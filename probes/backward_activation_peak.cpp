#include "probes/backward_activation_peak.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

#include "allocsim/interchangeable_allocations.h"
#include "probes/device_stream.h"

namespace oomtune {
namespace {

// Note [Kernel output order]
// Rationale: which of its equal-size outputs a kernel makes first is the
// kernel's choice. On a CPU with AMX, oneDNN's bf16 native_batch_norm_backward
// makes grad_input before grad_weight and grad_bias; capped at AVX512_CORE,
// ATen's kernel makes it after them. The level opened by grad_weight then
// began with grad_input's 8,192 B live or without it, and ResNet-50's bf16
// levels by gradients made differed by that much at nine levels between the
// two (tests/autotune/machine_independence_test.cpp), every other figure
// equal.
// Approach: replay the events in the order the allocator simulator takes
// them (allocsim::interchangeable_order): equal-size allocations of one
// kernel call, no free between them, in the order they are freed. The
// same order on every CPU path and on meta; a CUDA trial's too, so its
// levels compare with the CPU's and meta's.

// For each position of `events`, the index of the event that takes it:
// device events in allocsim::interchangeable_order, host events in place.
std::vector<std::size_t> interchangeable_positions(const std::vector<TrackedEvent>& events) {
  std::vector<std::size_t> device;  // the device events' positions, as device_stream takes them
  for (std::size_t i = 0; i < events.size(); ++i)
    if (events[i].pool == MemoryPool::kDevice) device.push_back(i);
  const std::vector<std::size_t> order = allocsim::interchangeable_order(device_stream(events, 0, events.size()));
  std::vector<std::size_t> positions(events.size());
  std::iota(positions.begin(), positions.end(), std::size_t{0});
  for (std::size_t k = 0; k < device.size(); ++k) positions[device[k]] = device[order[k]];
  return positions;
}

}  // namespace

BackwardActivationPeak find_backward_activation_peak(const std::vector<TrackedEvent>& events, std::size_t begin,
                                                     std::size_t end, int64_t live_at_begin,
                                                     const std::unordered_set<uint64_t>& gradient_blocks) {
  if (begin > end || end > events.size()) throw std::out_of_range("find_backward_activation_peak: bad event range");
  // Note [Kernel output order]
  const std::vector<std::size_t> positions = interchangeable_positions(events);
  auto at = [&](std::size_t i) -> const TrackedEvent& { return events[positions[i]]; };
  // The allocation that made each gradient block; earlier ones at its
  // address were freed within the range.
  std::unordered_map<uint64_t, std::size_t> gradient_allocation;
  for (std::size_t i = begin; i < end; ++i) {
    const TrackedEvent& e = at(i);
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
    const TrackedEvent& e = at(i);
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
