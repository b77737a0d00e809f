#pragma once
// A MemoryTracker's recorded events as the caching-allocator simulator's
// records (allocsim/alloc_event.h).

#include <cstddef>
#include <string>
#include <vector>

#include "allocsim/alloc_event.h"
#include "probes/memory_records.h"

namespace oomtune {

/// The device-pool events among events[begin, end) (end clamped to
/// events.size()) as the simulator's records, in order: an allocation of
/// TrackedEvent::bytes or a free, keyed by the block's address, with its
/// phase, its position among them (AllocEvent::order, from 0) and its
/// kernel call (AllocEvent::call = TrackedEvent::op_call); with `op_names`
/// (MemoryTracker::op_names), each also names its operator. Host-pool
/// events are skipped: host memory is not the device's pool. Throws
/// nothing.
std::vector<allocsim::AllocEvent> device_stream(const std::vector<TrackedEvent>& events, std::size_t begin,
                                                std::size_t end, const std::vector<std::string>* op_names = nullptr);

}  // namespace oomtune
