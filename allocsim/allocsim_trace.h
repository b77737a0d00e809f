#pragma once
// A real allocator trace (from a memory snapshot) and its replay through the
// simulator, to check the simulator against what PyTorch actually did.
//
// The trace file is the JSON written by scripts/snapshot_to_events.py from a
// torch.cuda.memory._dump_snapshot() pickle: the allocator settings, the
// segments (and their allocated blocks) when recording began, the trace
// events (c10/cuda/CUDACachingAllocator.cpp TraceEntry: alloc,
// free_completed, segment_alloc, segment_free, segment_map, segment_unmap,
// oom) and the bounds the trace puts on the memory cap.

#include <cstdint>
#include <string>
#include <vector>

#include "allocsim/alloc_event.h"
#include "allocsim/allocator_rules.h"
#include "allocsim/caching_allocator_sim.h"

namespace oomtune::allocsim {

/// TraceEntry::Action values kept in a trace file.
enum class TraceAction : std::uint8_t {
  kAlloc,          ///< a block handed out: address, requested bytes
  kFreeCompleted,  ///< a block returned to the cache: address, requested bytes
  kSegmentAlloc,   ///< cudaMalloc: segment address, bytes
  kSegmentFree,    ///< cudaFree: segment address, bytes
  kSegmentMap,     ///< expandable segment pages mapped
  kSegmentUnmap,   ///< expandable segment pages unmapped
  kOom,            ///< out of memory: bytes = the rounded request (no address)
};

/// One trace event.
struct TraceEvent {
  TraceAction action = TraceAction::kAlloc;
  std::uint64_t address = 0;
  int64_t bytes = 0;
};

/// A snapshot's trace and the allocator state when recording began.
struct SnapshotTrace {
  std::string source;                   ///< the pickle it came from
  alloc_rules::AllocatorConfig config;  ///< the allocator_settings of the snapshot
  std::vector<ExistingSegment> initial_segments;
  std::vector<TraceEvent> events;
  /// The memory cap lies in [budget_lower_bytes, budget_upper_bytes): at least
  /// the largest reserved total reached, and below reserved + the failing
  /// cudaMalloc at every oom. budget_upper_bytes is 0 when there was no oom.
  int64_t budget_lower_bytes = 0;
  int64_t budget_upper_bytes = 0;
  /// The allocator state when the snapshot was dumped (after the trace).
  std::vector<SegmentInfo> final_segments;
  /// Blocks whose size had to be inferred (allocated before recording, freed during it).
  int64_t inferred_block_sizes = 0;
};

/// Reads a trace file. Throws oomtune::SnapshotError naming the file and the
/// field when it cannot be read or does not have the expected shape.
SnapshotTrace load_snapshot_trace(const std::string& path);

/// The trace as simulator input: one alloc per `alloc` (id = address), one
/// free per `free_completed`, and one alloc per `oom` (the failed request,
/// with a fresh id), in trace order. Segment events are dropped: the
/// simulator must reproduce them.
std::vector<AllocEvent> to_alloc_events(const SnapshotTrace& trace);

/// The real allocator's segment events and OOMs, keyed like the simulator's:
/// event_index is the index (in to_alloc_events()) of the request during
/// which they happened.
struct RealOutcome {
  std::vector<SegmentLogEntry> segment_log;
  std::vector<int64_t> oom_event_indices;
  std::vector<int64_t> oom_rounded_bytes;
};

/// Extracts RealOutcome from the trace.
RealOutcome real_outcome(const SnapshotTrace& trace);

/// The result of replaying a trace.
struct TraceReplay {
  SimResult result;  ///< with the segment log
  RealOutcome real;  ///< what PyTorch did
  /// Allocs whose simulated address differs from the recorded one (only
  /// checked with real addresses), and the first such event (-1: none).
  int64_t address_mismatches = 0;
  int64_t first_address_mismatch = -1;
  /// The simulator's state after the replay (compare with final_segments).
  std::vector<SegmentInfo> final_segments;
};

/// Replays a trace from its initial state under `options` (record_segment_log
/// is forced on). With `real_addresses`, new segments take the trace's
/// segment_alloc addresses in order (Note [Synthetic addresses]) and every
/// alloc's address is compared with the recorded one.
TraceReplay replay_trace(const SnapshotTrace& trace, SimOptions options, bool real_addresses);

}  // namespace oomtune::allocsim
