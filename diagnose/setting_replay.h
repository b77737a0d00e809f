#pragma once
// Would an allocator setting have avoided the out-of-memory? The snapshot's
// trace replayed through the caching-allocator simulator under the setting.
//
// Note [Allocator settings replayed]
// Rationale: the reserved-but-free bytes at an out-of-memory are not what
// expandable_segments frees. An expandable segment maps and unmaps whole
// pages (2 MiB small pool, 20 MiB large pool: c10/cuda/
// CUDACachingAllocator.cpp, Note [Expandable Segments], unmap_block), so a
// hole narrower than a page, between live tensors, stays reserved. On the
// real fragmentation snapshot (9.5 MiB tensors, every other one freed, then
// a 512 MiB request under a 4 GiB cap) each hole is 9.5 MiB and each 20 MiB
// page holds part of a live tensor: the 2.08 GiB reserved but free would
// not have been released, and "expandable_segments: enough" was wrong.
// max_split_size_mb likewise changes where every earlier tensor goes.
// Approach: replay the device's trace from its start through
// allocsim::CachingAllocatorSim with the setting: the blocks alive when
// recording began allocated first (address order), then each alloc and
// free_completed; an earlier out-of-memory's request is tried and, if it
// fits, freed again (the program went on without it). At the judged
// out-of-memory the request is made, then the rest of what the failing
// phase still needed (PhaseNeed) as requests of the same size. The limit
// is the cap's lower bound (the most reserved before the out-of-memory)
// when a cap refused it, else what the device had: reserved plus CUDA's
// free bytes. A cap is known only to lie between that and reserved plus the
// segment the request needed; where the replay fits under the upper end
// but not the lower, the smallest cap that serves it is found by bisection
// and the fix is "enough with a cap of at least" that. Without expandable
// segments the replay starts from the segments reserved when recording
// began, as they were (initial_segments), and gives new segments the
// trace's segment_alloc addresses in order, so that best fit breaks ties
// as the real allocator did; under expandable_segments the blocks from
// before recording are packed as if allocated in address order. The same
// replay under the snapshot's own settings (replay_as_recorded) must fail
// at the judged request as the real allocator did: that is the check on
// the answers. Packing the blocks from before recording in every replay,
// two of the 13 H200 recordings (a 1 MiB small-pool request with no free
// 1 MiB block) were served by it. Each request is made on its event's
// stream, and the blocks from before recording on their range's
// (Note [Memory on other streams]): a block cached on one stream serves no
// other; replayed as one stream, a side stream's free block served the
// compute stream's failing request.
//
// Private memory pools (CUDA graphs, torch.cuda.MemPool) are replayed as
// pools of their own (allocsim's rules): an alloc inside a dumped segment
// of a private pool goes to that pool in the simulator, whose segments are
// never expandable and never flushed, so the graph's free blocks serve no
// other request under any setting. Replayed as one pool, the graph's
// cached segments were released or packed into the expandable segment and
// "expandable_segments: enough" could rest on memory the graph keeps.
// The program's own torch.cuda.empty_cache() calls are replayed too
// (empty_cache_at): the trace shows them as segment_free events whose
// stack is empty_cache's (FrameIndex::calls_empty_cache); the flushes the
// allocator makes itself, the simulator makes where the setting needs them.
// Without them, segments the program had returned stayed cached in the
// replay and served later requests: on forward_holes_combined.pickle the
// replay under the snapshot's own settings then failed one request before
// the real out-of-memory. Recorded with context="state" or "alloc", the
// segment_free events carry the segment's allocation stack instead, and
// the calls are not seen.
// Segments freed before the dump have no pool on record: their allocs go
// to the default pool. The judged request, and the rest of the need,
// target the default pool unless the failing call was recording a graph:
// then the pool of the last alloc before it that went to a private pool.

#include <cstdint>
#include <string>
#include <vector>

#include "allocsim/allocator_rules.h"
#include "allocsim/caching_allocator_sim.h"
#include "diagnose/frames.h"
#include "diagnose/replay.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// A dumped segment of a private memory pool (segment_pool_id other than
/// (0, 0)): allocs inside [address, address + bytes) target `pool`.
struct PrivatePoolRange {
  int64_t address = 0;  ///< bytes
  int64_t bytes = 0;
  allocsim::PoolId pool = allocsim::kDefaultPool;  ///< from 1, one per segment_pool_id
};

/// A block alive when recording began.
struct InitialBlock {
  int64_t address = 0;  ///< bytes
  int64_t bytes = 0;    ///< block bytes
  int64_t stream = 0;   ///< its segment's stream (cudaStream_t as an integer)
};

/// Where the replay starts and what it must reach.
struct SettingReplayInput {
  /// Blocks alive when recording began, address order.
  std::vector<InitialBlock> initial_blocks;
  /// The segments reserved when recording began, with the blocks alive in
  /// them (ids: their addresses): a replay without expandable segments
  /// starts from them as they were, and gives the segments it makes the
  /// trace's segment_alloc addresses in order (segment_addresses), so that
  /// best fit breaks ties as the real allocator did; empty when any of them
  /// was expandable (then initial_blocks are packed as above).
  std::vector<allocsim::ExistingSegment> initial_segments;
  std::vector<std::uint64_t> segment_addresses;
  const std::vector<TraceEvent>* trace = nullptr;  ///< the device's trace
  /// The snapshot that holds it, for its events' streams (Snapshot::
  /// stream_of); nullptr: every request on the default stream.
  const Snapshot* snapshot = nullptr;
  size_t oom_index = 0;            ///< the judged out-of-memory event
  int64_t still_needed_bytes = 0;  ///< PhaseNeed::still_needed_bytes (>= the request)
  /// The private pools' dumped segments, sorted by address, not overlapping.
  std::vector<PrivatePoolRange> private_pool_ranges;
  /// Trace indices where the program called torch.cuda.empty_cache() (the
  /// first segment_free of each call), ascending.
  std::vector<size_t> empty_cache_at;
  /// The failing call was recording a CUDA graph (FrameIndex::
  /// captures_cuda_graph): the request targets a private pool (see above).
  bool request_in_graph_capture = false;
  /// A memory cap refused the request (cap_is_budget): it lies in
  /// [cap_low_bytes, cap_high_bytes), the most reserved before the
  /// out-of-memory and reserved plus the segment it needed. Else the device
  /// was full: cap_low_bytes is its memory (reserved plus CUDA's free bytes).
  bool cap_is_budget = true;
  int64_t cap_low_bytes = 0;
  int64_t cap_high_bytes = 0;
};

/// What the replay under one setting found.
struct SettingReplay {
  bool replayed = false;  ///< false: the trace did not fit the simulator (see failure)
  /// The request and the rest of the phase's need were served at the lowest
  /// cap the trace allows (or in the device's memory).
  bool fits = false;
  /// Not `fits`, but served under some cap below cap_high_bytes: the
  /// smallest such cap, bytes, found to 2 MiB (to 1/32 of the cap's range
  /// on traces of more than 100,000 events); 0 otherwise.
  int64_t smallest_cap_bytes = 0;
  // At the lowest cap, when it did not fit:
  int64_t failed_event = -1;    ///< trace index of the first request that still failed; -1 none
  int64_t failed_bytes = 0;     ///< its bytes (requested)
  bool failed_in_need = false;  ///< it was the rest of the need after the request, not a trace event
  int64_t reserved_bytes = 0;   ///< simulated reserved when it failed, or after the need was served
  /// Bytes of the phase's need (the request, then the rest) served before
  /// the failure: 0 when it failed at or before the request,
  /// still_needed_bytes when it fits.
  int64_t served_bytes = 0;
  /// When it fits: the lowest cap (or the device's memory) less reserved
  /// after the need was served, bytes.
  int64_t headroom_bytes = 0;
  std::string failure;  ///< why not replayed

  /// The replay ran out of memory at trace event `oom_event`'s request
  /// itself, as the real allocator did there.
  bool reproduces(int64_t oom_event) const { return replayed && !fits && !failed_in_need && failed_event == oom_event; }
};

/// The dumped segments of `device` in private memory pools, sorted by
/// address, each segment_pool_id numbered from 1 in order of first address.
std::vector<PrivatePoolRange> private_pool_ranges(const Snapshot& snapshot, int device);

/// SettingReplayInput::initial_segments from `replay` as constructed (the
/// state when recording began): each reserved range with the blocks alive
/// in it; empty when a range is expandable or a block lies outside every
/// range (an inconsistent trace: the replay then packs initial_blocks).
std::vector<allocsim::ExistingSegment> existing_segments(const Replay& replay,
                                                         const std::vector<PrivatePoolRange>& private_ranges);

/// The trace indices where the program called torch.cuda.empty_cache():
/// the first of each run of segment_free / segment_unmap events whose stack
/// is empty_cache's (FrameIndex::calls_empty_cache).
std::vector<size_t> empty_cache_calls(const std::vector<TraceEvent>& trace, const FrameIndex& frames);

/// Replays `input` under `config`. Never throws for a trace the simulator
/// cannot follow (an alloc at a live address, a free of an unknown one):
/// returns replayed = false with the reason.
SettingReplay replay_with_setting(const SettingReplayInput& input, const alloc_rules::AllocatorConfig& config);

/// Replays `input` under the snapshot's own settings `config` at the
/// lowest cap only (no search for a cap): a faithful replay fails at the
/// judged request (SettingReplay::reproduces), and that vouches for the
/// replays of the same input under other settings. Never throws for a trace
/// the simulator cannot follow (replayed = false).
SettingReplay replay_as_recorded(const SettingReplayInput& input, const alloc_rules::AllocatorConfig& config);

/// What the as-recorded replay `r` did at out-of-memory event `oom_event`,
/// as a clause: "runs out of memory at the same request, as the real
/// allocator did", "serves the request, which the real allocator
/// refused", "fails already at event N (a X request), before the
/// out-of-memory", or "" when it did not run.
std::string as_recorded_clause(const SettingReplay& r, int64_t oom_event);

/// What still failed in a replay that did not fit, as a phrase: "the 512.00
/// MiB request", "a 9.50 MiB request at event 612, before it", "the rest of
/// the phase's need (a 32.00 MiB request after it)". `oom_event`: the judged
/// out-of-memory's trace index.
std::string failure_phrase(const SettingReplay& replay, int64_t oom_event);

}  // namespace oomtune::diagnose
