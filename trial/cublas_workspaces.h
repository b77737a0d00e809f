#pragma once
// The cuBLAS workspaces of a CUDA run, put into a CPU or meta trial's event
// stream for the caching-allocator simulator (probes/attention_model.cpp,
// Note [Library workspaces]; probes/memory_tracker.cpp, Note [cuBLAS calls]).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "probes/memory_records.h"

namespace oomtune {

/// `events` with one device allocation of `workspace_bytes` inserted before
/// events[call.event] for each of `calls`' cuBLAS calls, and one of
/// `lt_workspace_bytes` for each of its cuBLASLt calls (after the cuBLAS
/// one of the same event; none when 0), never freed: where a CUDA run's
/// thread asks the caching allocator for its handle's workspaces, and
/// keeps them. The inserted allocations take addresses no tracked block has
/// (odd ones: tracked blocks are 64-byte aligned), the call's phase and
/// operator `op` (an index into the op names the stream is read with, so
/// that a request that fails names the workspace). `end`, an index into
/// `events`, comes back as the same moment's index in the result (a call at
/// or past it is not inserted: the replay stops there). Throws nothing.
std::vector<TrackedEvent> with_cublas_workspaces(const std::vector<TrackedEvent>& events, const CublasCalls& calls,
                                                 int64_t workspace_bytes, int64_t lt_workspace_bytes, uint32_t op,
                                                 std::size_t& end);

}  // namespace oomtune
