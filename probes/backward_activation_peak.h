#pragma once
// Finds backward's activation peak (probes/memory_records.h) in the events a
// MemoryTracker recorded during one backward pass.

#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <vector>

#include "probes/memory_records.h"

namespace oomtune {

/// Replays `events[begin, end)`, the device allocations and frees of one
/// backward pass that began with `live_at_begin` device bytes live, and
/// returns the first moment where live bytes less the gradients created so
/// far were highest. `gradient_blocks` are the addresses (TrackedEvent::
/// address) of the parameters' gradient storages after that backward: a
/// gradient counts from its block's last allocation in the range (an earlier
/// block at the same address, or one a later contribution replaced, was a
/// temporary). Also finds the highest live bytes less the stored gradients
/// of the backward replayed as a later micro-batch of an accumulated step
/// (accumulating_bytes): there a gradient is added into the stored one and
/// freed once the frame run that made it (TrackedEvent::frame_run) has
/// ended, which the replay takes as the next allocation by another run.
/// Also both between each two gradients made (by_gradients: one level
/// before the first, then one per gradient). Host-pool events are skipped.
/// Equal-size allocations of one kernel call (TrackedEvent::op_call) are
/// taken in the order they are freed in `events`, as the allocator
/// simulator takes them (allocsim/interchangeable_allocations.h), not in the
/// order the kernel made them: the figures are the same whichever kernel ran.
/// With an empty range both moments are the start: {live_at_begin, 0,
/// live_at_begin}, one level {0, live_at_begin, live_at_begin}.
/// Throws std::out_of_range when begin > end or end > events.size().
BackwardActivationPeak find_backward_activation_peak(const std::vector<TrackedEvent>& events, std::size_t begin,
                                                     std::size_t end, int64_t live_at_begin,
                                                     const std::unordered_set<uint64_t>& gradient_blocks);

}  // namespace oomtune
