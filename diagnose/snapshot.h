#pragma once
// The memory snapshot that torch.cuda.memory._dump_snapshot() writes, as
// plain records.
//
// Layouts read (sources: torch/cuda/memory.py `_snapshot` docstring and
// torch/csrc/cuda/Module.cpp `THCPModule_memorySnapshot` of each version;
// c10/cuda/CUDACachingAllocator.h TraceEntry / SegmentInfo / BlockInfo):
//   - 1.13: a bare list of segments (torch.cuda.memory_snapshot()); blocks
//     have size, state and `history` [{addr, real_size, frames}]. The public
//     torch.cuda.memory_snapshot() of every later version still returns such
//     a list (its blocks as the dict layout of that version has them), so a
//     list reads as segments only, whatever its version (kV1_13).
//   - 2.0: {segments, device_traces}; blocks keep `history`, have no address
//     (it is the segment address plus the sizes before); state
//     "active_pending_free"; oom trace entries carry `device_free`, not `addr`.
//   - 2.1: blocks gain address, requested_size and frames (history gone);
//     segments gain segment_pool_id, is_expandable, frames; trace actions
//     segment_map / segment_unmap (expandable segments).
//   - 2.2–2.3: trace entries gain time_us.
//   - 2.4+: `allocator_settings`; 2.5+: `external_annotations`; later 2.x:
//     compile_context / user_metadata on trace entries (EventTag).
// Missing optional keys take their defaults; a key of the wrong type is an
// error naming its path, e.g. "segments[3].blocks[7].size: expected int,
// got str".

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "diagnose/pickle_value.h"

namespace oomtune::diagnose {

/// One Python frame of an allocation's stack.
struct Frame {
  std::string filename;
  std::string name;
  int64_t line = 0;
};

/// Index into Snapshot::stacks; 0 is the empty stack (no frames recorded).
using StackId = uint32_t;

/// State of a block at dump time (BlockInfo: allocated / active).
enum class BlockState : uint8_t {
  kActiveAllocated,    ///< in use by a tensor
  kActivePendingFree,  ///< freed, waiting for another stream ("active_awaiting_free" in 2.1+ docs)
  kInactive,           ///< free, cached for reuse
};

/// A piece of a segment.
struct Block {
  int64_t address = 0;         ///< bytes (device address)
  int64_t size = 0;            ///< bytes, rounded as the allocator hands them out
  int64_t requested_size = 0;  ///< bytes the caller asked for (2.0: history real_size)
  BlockState state = BlockState::kInactive;
  StackId frames = 0;  ///< where it was allocated (innermost frame first)
};

/// One cudaMalloc (or one expandable segment's mapped range).
struct Segment {
  int64_t device = 0;
  int64_t address = 0;                        ///< bytes
  int64_t total_size = 0;                     ///< bytes
  int64_t allocated_size = 0;                 ///< bytes in active_allocated blocks (as dumped)
  int64_t active_size = 0;                    ///< bytes allocated or pending free (as dumped)
  int64_t requested_size = 0;                 ///< bytes requested by the blocks' callers
  int64_t stream = 0;                         ///< cudaStream_t as an integer
  bool is_large = true;                       ///< segment_type "large" (requests > 1 MiB)
  std::pair<int64_t, int64_t> pool_id{0, 0};  ///< segment_pool_id; (0,0): default pool
  bool is_expandable = false;
  StackId frames = 0;
  std::vector<Block> blocks;

  /// In a private memory pool: a CUDA graph's (torch.cuda.graph_pool_handle,
  /// torch.compile's CUDA graph trees) or a torch.cuda.MemPool's.
  bool in_private_pool() const { return pool_id.first != 0 || pool_id.second != 0; }
};

/// TraceEntry::Action (c10/cuda/CUDACachingAllocator.h).
enum class TraceAction : uint8_t {
  kAlloc,          ///< a block handed to a tensor; size = requested bytes
  kFreeRequested,  ///< the tensor freed it (allocated stats drop here)
  kFreeCompleted,  ///< the block is reusable (after cross-stream events)
  kSegmentAlloc,   ///< cudaMalloc of a new segment
  kSegmentFree,    ///< cudaFree of a segment
  kSegmentMap,     ///< pages mapped into an expandable segment
  kSegmentUnmap,   ///< pages unmapped from an expandable segment
  kOom,            ///< an allocation failed; size = requested bytes
  kSnapshot,       ///< a snapshot was taken here
  kOther,          ///< anything newer (e.g. "annotate"): kept, ignored
};
constexpr int kNumTraceActions = 10;

/// The action's name as PyTorch writes it ("alloc", "segment_map", ...).
const char* action_name(TraceAction action);

/// One trace entry. 32 bytes: a 10^6-event trace costs 32 MB.
struct TraceEvent {
  int64_t addr = 0;     ///< bytes; for kOom: device_free (bytes CUDA reported free)
  int64_t size = 0;     ///< bytes
  int64_t time_us = 0;  ///< µs since the epoch; 0 when the layout has none (< 2.2)
  StackId frames = 0;
  uint16_t stream = 0;  ///< index into Snapshot::streams
  TraceAction action = TraceAction::kOther;
};

/// Whether a trace holds free_completed events: where it holds none (a
/// recording with skip_actions=["free_completed"], PyTorch 2.11), a block
/// is released for reuse at free_requested.
bool records_free_completed(const std::vector<TraceEvent>& trace);

/// What a trace entry records besides its frames (TraceEntry's
/// compile_context_ and user_metadata_; every entry of the PyTorch 2.11
/// recordings in tests/fixtures/snapshots/h200_recorded/ has both keys).
struct EventTag {
  /// The torch.compile region that was running, as its profiler annotation
  /// names it ("Torch-Compiled Region: 0/0", torch/_dynamo/convert_frame.py),
  /// recorded with _record_memory_history(compile_context=True); "" for
  /// PyTorch's "N/A" (none running, or not recorded).
  std::string compile_context;
  /// What torch.cuda.memory._set_memory_metadata() last set ("" when unset).
  std::string user_metadata;

  bool empty() const { return compile_context.empty() && user_metadata.empty(); }
};

/// From event `first_event` of a device's trace up to the next run, the
/// events carry Snapshot::event_tags[tag].
struct TagRun {
  size_t first_event = 0;
  uint32_t tag = 0;
};

/// PYTORCH_CUDA_ALLOC_CONF as recorded in the snapshot (2.4+).
struct AllocatorSettings {
  bool present = false;         ///< false for layouts without allocator_settings
  std::string conf;             ///< the env string ("" when unset)
  int64_t max_split_size = -1;  ///< bytes; -1: no limit
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  /// roundup_power2_divisions, 16 intervals from 1 MiB (see allocator_rules.h).
  std::array<int64_t, 16> roundup_power2_divisions{};
};

/// One entry of external_annotations (2.5+): a mark with the metadata its
/// recorder gave, the device and the time, as
/// torch/csrc/cuda/memory_snapshot.cpp writes it ({...metadata, "device",
/// "time_us"}). record_function marks carry "name" and "stage" ("START" or
/// "END"); oomtune's CUDA trials mark each training phase so, named
/// "oomtune:forward", "oomtune:loss", "oomtune:backward",
/// "oomtune:optimizer" (trial/cuda_measurement.h).
struct Annotation {
  std::string name;   ///< "" when the entry has none
  std::string stage;  ///< "START", "END", or "" when none
  int64_t device = 0;
  int64_t time_us = 0;
};

/// Which layout the file had (see the list at the top of this file).
enum class SnapshotLayout : uint8_t { kV1_13, kV2_0, kV2_1, kV2_2, kV2_4, kV2_5 };

/// "PyTorch 2.0" etc.: the oldest version whose layout matches.
const char* layout_name(SnapshotLayout layout);

/// A whole snapshot. Frames are interned: `frames` holds each distinct frame
/// once, `stacks[i]` lists frame indices (innermost first); stacks[0] = {}.
struct Snapshot {
  SnapshotLayout layout = SnapshotLayout::kV2_5;
  std::vector<Segment> segments;
  std::vector<std::vector<TraceEvent>> device_traces;  ///< one trace per device
  AllocatorSettings allocator_settings;
  int64_t external_annotations = 0;     ///< count
  std::vector<Annotation> annotations;  ///< those with a time_us, in file order
  std::vector<Frame> frames;
  std::vector<std::vector<uint32_t>> stacks;
  /// cudaStream_t values seen in the trace; TraceEvent::stream indexes it.
  /// Past 65535 distinct streams the last index is shared.
  std::vector<int64_t> streams;
  bool has_block_frames = false;  ///< any block or segment has frames
  /// Frames of FX-generated code that carry their model source's stack
  /// (fx_original_trace, fx_trace.h); each stack holding one lists those
  /// source frames, innermost first, right after it.
  int64_t fx_traced_frames = 0;
  /// A trace had free_completed events and no free_requested
  /// (_record_memory_history(skip_actions=["free_requested"]), PyTorch
  /// 2.11): its free_completed events were read as free_requested.
  bool free_requested_skipped = false;
  int64_t file_bytes = 0;  ///< size of the pickle read
  /// Distinct tags of the trace events; [0] is the empty one.
  std::vector<EventTag> event_tags{EventTag{}};
  /// Per device trace (as device_traces), its events' tags as runs in event
  /// order; empty where every event's tag is empty (events before the first
  /// run have tag 0).
  std::vector<std::vector<TagRun>> tag_runs;

  /// The frames of a stack, innermost first.
  const std::vector<uint32_t>& stack(StackId id) const { return stacks[id]; }
  /// The tag of event `event` of device trace `device`: an index into
  /// event_tags (0: none). O(log runs).
  uint32_t tag_of(size_t device, size_t event) const;
  /// True when some trace event carries a non-empty tag.
  bool has_event_tags() const { return event_tags.size() > 1; }
  /// The cudaStream_t of trace event `e`, as an integer (0, the default
  /// stream, where the trace records none).
  int64_t stream_of(const TraceEvent& e) const {
    return streams.empty() ? 0 : streams[std::min<size_t>(e.stream, streams.size() - 1)];
  }
};

/// Builds the model from a parsed pickle. Throws SnapshotError naming `name`
/// and the path of a wrongly typed key.
Snapshot snapshot_from_pickle(const ValueStore& store, ValueRef root, const std::string& name);

/// Reads and parses a snapshot file: the result, and any SnapshotError, are
/// those of read_pickle_file + snapshot_from_pickle, but the trace events
/// are read while the file is read (an ItemSink, pickle_reader.h) instead of
/// being kept in the value tree first; a file that path cannot take is read
/// again plainly. The value tree is freed before returning.
Snapshot load_snapshot(const std::string& path);

/// load_snapshot from bytes in memory (tests, the fuzzer). `streamed`, when
/// given, tells whether trace events were read while streaming (false when
/// it fell back to a plain read, or the pickle had no trace to stream).
Snapshot load_snapshot_bytes(std::string_view bytes, const std::string& name, bool* streamed = nullptr);

}  // namespace oomtune::diagnose
