#pragma once
// The result of `oomtune diagnose`: plain records the renderers (text,
// JSON, SVG) only read. All byte fields are int64_t bytes, times µs.

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "diagnose/attribution.h"
#include "diagnose/eval_outputs.h"
#include "diagnose/event_tags.h"
#include "diagnose/fixes.h"
#include "diagnose/frames.h"
#include "diagnose/nothing_saved.h"
#include "diagnose/phase_need.h"
#include "diagnose/setting_replay.h"
#include "diagnose/snapshot.h"
#include "diagnose/verdicts.h"

namespace oomtune::diagnose {

/// Bytes per category (Category order).
using CategoryBytes = std::array<int64_t, kNumCategories>;

/// How sites are grouped: by layer (innermost model-code frame) or by call
/// site (the training script's line); see frames.h.
enum class GroupBy : uint8_t { kLayer, kCall };

/// "layer", "call".
const char* group_by_name(GroupBy group_by);

/// Live bytes grouped by allocation site: its layer or its call site
/// (DiagnoseOptions::group_by).
struct SiteBytes {
  std::string site;      ///< the grouping frame, "train.py:35 in forward", or a "(...)" placeholder
  std::string filename;  ///< full path of the grouping frame; empty for placeholders
  int64_t line = 0;
  std::string function;
  std::string layer;      ///< innermost model-code frame ("" for placeholders)
  std::string call_site;  ///< the call site holding most of these bytes ("" for placeholders)
  /// COUNT: other call sites (grouped by layer) or other layers (grouped by
  /// call) merged into this entry besides the one named.
  int64_t others = 0;
  int64_t bytes = 0;                            ///< SUM: allocated block bytes
  int64_t blocks = 0;                           ///< COUNT
  Category category = Category::kUnattributed;  ///< the category holding most of its bytes
};

/// One out-of-memory event, with the allocator state replayed to it.
struct OomReport {
  int64_t event_index = 0;
  int64_t time_us = 0;                   ///< 0 when the layout has no times
  int64_t requested_bytes = 0;           ///< what the failing call asked for
  int64_t rounded_bytes = 0;             ///< round_size() of the request
  bool large_pool = true;                ///< request > 1 MiB
  int64_t segment_bytes = 0;             ///< the cudaMalloc the allocator needed (get_allocation_size)
  int64_t device_free_bytes = -1;        ///< what CUDA reported free (-1: not recorded)
  int64_t allocated_bytes = 0;           ///< replayed
  int64_t reserved_bytes = 0;            ///< replayed
  int64_t reserved_free_bytes = 0;       ///< reserved - allocated - pending frees
  int64_t pool_free_bytes = 0;           ///< free bytes in the request's pool
  int64_t largest_free_block_bytes = 0;  ///< in the request's pool, on its stream
  int64_t fully_free_segment_bytes = 0;
  /// The failing call's CUDA stream (cudaStream_t as an integer; 0, the
  /// default stream, where the trace records none), and the segments of
  /// every other stream then, in the pools the free figures above count:
  /// their number, reserved and free bytes, and the largest free block of
  /// the request's pool among them. The allocator serves a request from
  /// blocks of its own stream only, so largest_free_block leaves them out;
  /// the free byte figures above count them (an expandable segment's free
  /// pages go back to CUDA at an out-of-memory, whatever their stream:
  /// Note [Memory on other streams]).
  int64_t stream = 0;
  int64_t other_stream_segments = 0;
  int64_t other_stream_reserved_bytes = 0;
  int64_t other_stream_free_bytes = 0;
  int64_t other_stream_largest_free_block_bytes = 0;
  /// The tensors alive in those segments, which keep them reserved, by site
  /// (as the report groups sites), biggest first, at most 3.
  std::vector<SiteBytes> other_stream_holders;
  /// Private memory pools (CUDA graphs' pools, torch.cuda.MemPool; replay.h)
  /// then: their segments, reserved and free bytes. When the failing call
  /// was no CUDA graph capture (captures_cuda_graph), the free figures above
  /// (reserved_free, pool_free, largest_free_block, fully_free_segment)
  /// leave them out: an ordinary request cannot use them, and neither
  /// empty_cache nor garbage collection returns a live graph's pool (Note
  /// [Private memory pools]).
  int64_t private_pool_segments = 0;
  int64_t private_pool_reserved_bytes = 0;
  int64_t private_pool_free_bytes = 0;
  bool captures_cuda_graph = false;  ///< the failing call recorded a CUDA graph (FrameIndex::captures_cuda_graph)
  bool fragmentation = false;        ///< reserved_free >= request but no free block of its stream fits
  /// CUDA had room for the segment (device_free >= segment_bytes), so the
  /// caching allocator's own cap refused it: set_per_process_memory_fraction
  /// makes alloc_block fail when reserved + segment > the cap, before any
  /// cudaMalloc (c10/cuda/CUDACachingAllocator.cpp, alloc_block). The cap is
  /// then in [cap_low_bytes, cap_high_bytes).
  bool memory_cap = false;
  /// With memory_cap: the most the trace reserved up to this error (the
  /// allocator never reserves past its cap), at least reserved_bytes.
  int64_t cap_low_bytes = 0;
  /// With memory_cap: the least reserved + segment of this error and of
  /// every earlier one the cap refused, caught ones included (caught_oom.h).
  int64_t cap_high_bytes = 0;
  Phase phase = Phase::kUnknown;
  std::string layer;          ///< innermost model-code frame of the failing call ("" if none)
  std::string call_site;      ///< its call site ("" if none; frames.h)
  std::string model_forward;  ///< outermost model-code "forward" frame, if any
  /// The failing call's tag (Snapshot::event_tags): what
  /// torch.cuda.memory._set_memory_metadata() had set, and the torch.compile
  /// region that ran it ("" for none).
  std::string user_metadata;
  std::string compile_context;
  /// The user's record_function marks open at the failing call, outermost
  /// first (RecordFunctions, event_tags.h).
  std::vector<std::string> record_functions;
  /// The failing call reran a checkpointed block's forward in backward
  /// (FrameIndex::recomputes): torch.utils.checkpoint's recomputation.
  bool recomputing = false;
  /// What ran the failing call in a forward without autograd: a
  /// torch.no_grad()/inference_mode() decorator, Hugging Face's generate()
  /// or a framework's evaluation loop (FrameIndex::inference_kind); kNone
  /// outside such a forward. Nothing is kept for backward.
  InferenceKind inference_kind = InferenceKind::kNone;
  /// The failing call ran in a forward without autograd (inference_kind).
  bool inference() const { return inference_kind != InferenceKind::kNone; }
  /// Why inference_kind is kNothingSaved (Note [Blocks that kept nothing]);
  /// all zero otherwise.
  NothingSaved nothing_saved;
  EvalOutputs eval_outputs;  ///< all zero outside Hugging Face Trainer's evaluation
  CategoryBytes live_by_category{};
};

/// An out-of-memory error the run survived: the program went on allocating
/// after it (caught_oom.h). It ended nothing, so no verdict is drawn from it.
struct CaughtOom {
  int64_t event_index = 0;
  int64_t time_us = 0;          ///< 0 when the layout has no times
  int64_t requested_bytes = 0;  ///< what the call asked for
  int64_t allocated_bytes = 0;  ///< replayed, at the error
  int64_t reserved_bytes = 0;   ///< replayed, at the error
  Phase phase = Phase::kUnknown;
  std::string layer;      ///< as OomReport's
  std::string call_site;  ///< as OomReport's
  /// A convolution made the request (FrameIndex::runs_convolution): on
  /// CUDA, cuDNN catches the error of its workspace and runs another,
  /// slower engine (aten/src/ATen/native/cudnn/Conv_v8.cpp, try_configs).
  bool in_convolution = false;
  /// The batch-size finder it ran under, which retries with a smaller batch.
  BatchSizeFinder batch_size_finder = BatchSizeFinder::kNone;
  int64_t allocations_after = 0;  ///< COUNT: alloc events after it, to the next oom or the trace's end
};

/// A moment of the timeline (downsampled: the highest point of each bucket).
struct TimelinePoint {
  int64_t event_index = 0;
  int64_t time_us = 0;
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  CategoryBytes by_category{};
};

/// The moment allocated memory was highest, and what was alive then.
struct Peak {
  int64_t event_index = -1;  ///< -1: before the first event
  int64_t time_us = 0;
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  Phase phase = Phase::kUnknown;
  CategoryBytes by_category{};
  std::vector<SiteBytes> sites;  ///< biggest first, at most --top
  TaggedBytes tags;              ///< by the blocks' tags (event_tags.h)
};

/// A site whose live bytes grow from iteration to iteration.
struct LeakSuspect {
  SiteBytes site;  ///< bytes = live at the end of the trace
  int64_t growth_per_iteration_bytes = 0;
  int64_t iterations = 0;  ///< iterations the growth was seen over
  int64_t first_live_bytes = 0;
  int64_t last_live_bytes = 0;
};

/// What one CUDA device of a snapshot holds. A process that drives several
/// GPUs (Accelerate's device_map="auto", DataParallel, pipeline stages)
/// dumps one trace per device (torch/cuda/memory.py, _snapshot); one is
/// diagnosed, the others are named with these counts.
struct DeviceContent {
  int device = 0;
  int64_t events = 0;           ///< trace events recorded on it
  int64_t ooms = 0;             ///< out-of-memory events among them
  int64_t reserved_bytes = 0;   ///< its segments' bytes as dumped
  int64_t allocated_bytes = 0;  ///< of those, in allocated blocks as dumped
};

/// What the trace covers and how far it can be trusted.
struct TraceSummary {
  int device = 0;                 ///< the CUDA device diagnosed (DiagnoseOptions::device)
  bool layout_has_traces = true;  ///< false: PyTorch 1.13's memory_snapshot(), segments only
  int64_t events = 0;
  int64_t duration_us = 0;
  int64_t iterations = 0;            ///< iteration starts seen
  int64_t events_per_iteration = 0;  ///< median-free: events / iterations
  bool truncated = false;            ///< began after allocations were made (ring buffer or late start)
  /// Bytes in blocks alive before the trace's first event (no alloc event).
  int64_t allocated_before_recording_bytes = 0;
  /// Of those, bytes in blocks that carry frames: allocated while history
  /// was recorded (a ring buffer's dropped events, or enabled="state").
  int64_t allocated_before_trace_with_frames_bytes = 0;
  int64_t reserved_before_recording_bytes = 0;
  int64_t alloc_events = 0;
  int64_t alloc_events_without_frames = 0;
  int64_t bytes_without_frames = 0;
  int64_t frameless_inferred_backward = 0;
  int64_t alloc_events_in_marked_phases = 0;     ///< COUNT: allocs placed by oomtune's phase marks
  int64_t frameless_in_optimizer_marks = 0;      ///< COUNT: frameless allocs placed by torch.optim's step mark
  int64_t alloc_events_with_user_metadata = 0;   ///< COUNT: allocs tagged by _set_memory_metadata()
  int64_t alloc_events_in_compiled_regions = 0;  ///< COUNT: allocs with a compile_context
  bool cpp_frames = false;                       ///< C++ frames in the stacks (stacks="all"): skipped
  bool generated_frames = false;                 ///< torch.compile's generated code in the stacks: skipped
  int64_t fx_traced_frames = 0;                  ///< COUNT: generated frames with their model source's stack
  int64_t empty_cache_calls = 0;                 ///< COUNT: the program's torch.cuda.empty_cache() calls (by stack)
  bool fx_frames_without_source = false;         ///< fx_generated__*.py frames with no fx_original_trace
  int64_t forward_alloc_events = 0;              ///< COUNT: allocations in the forward phase
  int64_t checkpointed_forward_allocs = 0;       ///< COUNT: of those, inside torch.utils.checkpoint
  int64_t recomputed_backward_allocs = 0;        ///< COUNT: allocs in backward recomputing a checkpointed block
  int64_t inconsistencies = 0;                   ///< events that did not fit the replayed state
  bool replay_matches_dump = true;               ///< replayed allocated at the end == dumped
  int64_t dumped_allocated_bytes = 0;
  int64_t dumped_reserved_bytes = 0;
  std::string frames_note;  ///< why frames are missing, when they are
  /// Free actions the trace was recorded without (_record_memory_history(
  /// skip_actions=[...]), PyTorch 2.11): no free_requested (its
  /// free_completed read as the frees: Snapshot::free_requested_skipped), or
  /// frees with no free_completed (a freed block reusable at once: replay.h).
  bool free_requested_skipped = false;
  bool free_completed_skipped = false;
  std::string actions_note;  ///< what those skipped actions change, when any
};

/// One conclusion, with its evidence (the kinds: verdicts.h).
struct Verdict {
  VerdictId id = VerdictId::kCapacity;
  std::string evidence;
};

/// Whether a fix frees what the failing phase still needed (PhaseNeed).
enum class Sufficiency : uint8_t {
  kUnknown,         ///< no out-of-memory to judge against
  kEnough,          ///< frees >= still needed
  kNotEnough,       ///< frees < still needed
  kNoMemoryEffect,  ///< frees nothing itself (a setting, a better snapshot)
  /// The need is a lower bound (a forward's blocks after the current one
  /// are not counted): enough while the forward has at most
  /// Recommendation::most_blocks blocks in all (Note [Enough for how many
  /// blocks], recommendations.cpp).
  kEnoughUpToBlocks,
  /// Replayed under a memory cap the trace bounds only: enough when the cap
  /// is at least Recommendation::smallest_cap_bytes (Note [Allocator
  /// settings replayed]).
  kEnoughIfCapAtLeast,
  /// The need is the failing request alone (phase_need.h, rule 6): the fix
  /// frees at least that, and what the rest of the phase needs is not in
  /// the snapshot (Note [Enough for the request only], recommendations.cpp).
  kEnoughForRequest,
  /// The need is the rest of a checkpointed block's recomputation in
  /// backward (phase_need.h, rule 5), a lower bound: the fix frees at least
  /// that; the block's backward after it is not counted.
  kEnoughForRecomputation,
  /// The need is the rest of the model's blocks in backward (phase_need.h,
  /// rule 4), a lower bound: the fix frees at least that; what backward
  /// allocates after the blocks is not counted.
  kEnoughForBackwardBlocks,
  /// The need is the rest of a checkpointed block's recomputation and the
  /// recomputations of the blocks after it (phase_need.h, rule 5; Note [The
  /// turns after a recomputed block]), a lower bound: each block's backward
  /// beyond its recomputation is not counted.
  kEnoughForRecomputedBlocks,
};

/// One change to make, what it would free, and whether that is enough.
struct Recommendation {
  Recommendation() = default;
  Recommendation(FixId kind, std::string change_text, std::string reason_text, int64_t frees, std::string how,
                 Sufficiency judged = Sufficiency::kUnknown)
      : id(kind),
        change(std::move(change_text)),
        reason(std::move(reason_text)),
        frees_bytes(frees),
        estimate(std::move(how)),
        sufficiency(judged) {}

  FixId id = FixId::kRecordMore;  ///< the kind (fixes.h)
  /// Short, for combinations ("8-bit RMSprop"); empty: the kind's label.
  std::string label;
  std::string change;  ///< the concrete change, e.g. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  std::string reason;
  int64_t frees_bytes = 0;  ///< estimated from the snapshot; 0 when it frees nothing itself
  std::string estimate;     ///< how frees_bytes was estimated
  Sufficiency sufficiency = Sufficiency::kUnknown;
  int64_t needs_bytes = 0;  ///< what the failing phase still needed (PhaseNeed), when judged
  /// Of frees_bytes, this share of the still-needed bytes (a fix that
  /// shrinks the activations still to come: checkpointing 0.83, half the
  /// micro-batch 0.5); the rest does not depend on the need.
  double need_share = 0;
  /// Judged by replaying the trace under the setting (Note [Allocator
  /// settings replayed]): enough exactly when replay_fits.
  bool replayed = false;
  bool replay_fits = false;
  int64_t smallest_cap_bytes = 0;  ///< kEnoughIfCapAtLeast: the smallest cap that serves it
  /// kEnoughUpToBlocks: the most forward blocks in all (those done, the
  /// current one and those after it) for which it is enough.
  int64_t most_blocks = 0;
  /// kCombined: the fixes combined and what each frees.
  std::vector<FixId> parts;
  std::vector<int64_t> part_frees_bytes;
};

/// "enough", "not enough alone (frees X, needs Y)", "" for kUnknown / kNoMemoryEffect.
std::string sufficiency_text(const Recommendation& recommendation);

/// A segment as the map draws it.
struct SegmentView {
  int64_t address = 0;
  int64_t size = 0;
  bool is_large = true;
  bool is_expandable = false;
  bool private_pool = false;  ///< in a private memory pool (replay.h): drawn with a dashed outline
  int64_t stream = 0;         ///< the stream whose requests it serves (named in its title when not 0)
  struct Piece {
    int64_t offset = 0;  ///< bytes from the segment start
    int64_t size = 0;
    bool allocated = false;  ///< false: free or pending free
    Category category = Category::kUnattributed;
  };
  std::vector<Piece> blocks;  ///< live blocks only; gaps are free
};

/// Everything `diagnose` found.
struct Diagnosis {
  std::string file;
  GroupBy group_by = GroupBy::kLayer;    ///< how the site lists are grouped
  std::vector<std::string> torch_roots;  ///< torch package roots found in the frames
  int64_t file_bytes = 0;
  std::string layout;
  AllocatorSettings allocator_settings;
  TraceSummary trace;
  /// The snapshot's other devices with trace events or segments, by index.
  std::vector<DeviceContent> other_devices;
  /// The out-of-memory errors that ended the run: the oom events after the
  /// trace's last allocation (caught_oom.h); empty when none did.
  std::vector<OomReport> ooms;
  std::vector<CaughtOom> caught_ooms;  ///< the others, in trace order (at most 64)
  Peak peak;
  std::vector<SiteBytes> oom_sites;  ///< alive at the last oom, biggest first (at most --top)
  TaggedBytes oom_tags;              ///< alive at the last oom, by the blocks' tags (event_tags.h)
  std::vector<TimelinePoint> timeline;
  std::vector<LeakSuspect> leaks;
  PhaseNeed need;  ///< what the phase of the last oom still needed
  /// The optimizer (torch.optim's, bitsandbytes') the trace names at or before the last oom
  /// (the latest such event; else a block alive names it), nullptr: none.
  const OptimizerKind* optimizer = nullptr;
  /// A fragmentation oom replayed under the allocator settings that could
  /// fix it (Note [Allocator settings replayed]); replayed = false: not
  /// tried (no fragmentation, the setting already on) or not replayable.
  SettingReplay expandable_replay;
  int64_t max_split_mb = 0;  ///< max_split_size_mb it would recommend (0: none)
  SettingReplay max_split_replay;
  /// The same replay under the snapshot's own settings, at the lowest cap
  /// (replay_as_recorded): it should fail at the judged request as the real
  /// allocator did; where not (reproduces() false), the replays above are
  /// approximate. replayed = false: not run.
  SettingReplay as_recorded_replay;
  std::vector<Verdict> verdicts;  ///< most important first
  /// Enough ones first, least cost first; then not enough, most freed first; then those with no memory effect.
  std::vector<Recommendation> recommendations;
  std::string map_moment;  ///< "at the last oom" / "at the peak"
  std::vector<SegmentView> segment_map;
};

/// --top and friends.
struct DiagnoseOptions {
  int top = 10;                        ///< sites listed
  GroupBy group_by = GroupBy::kLayer;  ///< how sites are grouped
  /// The CUDA device to diagnose; -1: the first whose trace ran out of
  /// memory, else the one with the most trace events, else the one with the
  /// most reserved bytes. A device the snapshot holds nothing of (no trace
  /// event, no segment) is a SnapshotError.
  int device = -1;
};

/// Runs every analysis on one snapshot (see analysis.cpp for the rules).
/// Throws SnapshotError when options.device names a device the snapshot
/// holds nothing of.
Diagnosis diagnose(const Snapshot& snapshot, const std::string& file, const DiagnoseOptions& options);

/// Fills diagnosis.recommendations from the rest (recommendations.cpp).
void recommend(Diagnosis& diagnosis);

/// Where a memory cap that refused `oom` lies, as the trace bounds it:
/// "between LOW and HIGH", OomReport::cap_low_bytes and cap_high_bytes
/// (alloc_block refuses reserved plus the segment past the cap, and never
/// reserves past it), each saying where it came from when not from this
/// error alone. recommendations.cpp.
std::string cap_bounds_text(const OomReport& oom);

/// A CUDA stream as the report names it: "the default stream" (0) or
/// "stream 0x55d2c4a1b3e0". recommendations.cpp.
std::string stream_text(int64_t stream);

/// "largest free block in the large pool" (or small), "... on stream
/// S" where other streams held segments at `oom` (Note [Memory on other
/// streams]: that block is its stream's). recommendations.cpp.
std::string largest_block_text(const OomReport& oom);

/// max_split_size_mb for a fragmentation oom: just above the 90th
/// percentile of the large-pool blocks in diagnosis.segment_map, in MiB,
/// below the failing request, at least 21 (PyTorch refuses 20 and less:
/// c10/cuda/CUDAAllocatorConfig.cpp, parseMaxSplitSize). 0 when the map has
/// no large-pool block or the request is not above that.
int64_t max_split_mb(const Diagnosis& diagnosis, const OomReport& oom);

}  // namespace oomtune::diagnose
