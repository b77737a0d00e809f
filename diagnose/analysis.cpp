// The analyses of `oomtune diagnose`.
//
// Rules:
//   - Device: the one whose trace has the last oom event; else the longest trace.
//   - Timeline: replay.h gives allocated and reserved after every event; the
//     timeline keeps the highest point of each of ~800 equal event buckets,
//     and every oom.
//   - Caught: an oom event that a successful allocation follows is an error
//     the program survived (caught_oom.h): listed, never judged. The rules
//     below are about the oom events that ended the run.
//   - OOM: the state just before the oom event. Rounded request and pool
//     follow round_size() / get_pool() (allocsim/allocator_rules.h). Verdict
//     *fragmentation* when reserved - allocated - pending frees >= the
//     request but the largest free block of the request's pool is smaller
//     than the rounded request. Otherwise the verdict follows the phase of
//     the failing call: forward -> activations_in_forward, backward ->
//     backward_peak, optimizer -> optimizer_state_allocation, else capacity.
//   - Peak: the event after which allocated bytes were highest; what was
//     alive then, grouped by site and category (attribution.h).
//   - Leak suspects: at each iteration start, live bytes per site. A site
//     whose live bytes never drop and grow over at least 3 iterations (each
//     step growing, >= 1 MiB in all) keeps what it allocates: a leak.
//   - No oom: verdicts come from the peak's phase and the leaks.
//   The verdicts' order and evidence: verdict_rules.cpp.

#include <algorithm>
#include <future>
#include <limits>
#include <map>
#include <set>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "common/byte_size.h"
#include "common/error.h"
#include "diagnose/caught_oom.h"
#include "diagnose/diagnosis.h"
#include "diagnose/fx_trace.h"
#include "diagnose/replay.h"
#include "diagnose/setting_replay.h"
#include "diagnose/verdict_rules.h"

namespace oomtune::diagnose {
namespace {

namespace ar = alloc_rules;

// Note [Private memory pools]
// Rationale: CUDA graphs allocate from a private memory pool of their own
// (torch.cuda.graph, torch.compile's mode="reduce-overhead" CUDA graph
// trees), and torch.cuda.MemPool makes one on request; the caching
// allocator serves each request from the pool it targets only
// (CUDACachingAllocator.cpp, get_pool), and keeps a live graph's pool
// reserved. The free blocks of private pools counted as free for any
// request read as fragmentation (free memory, no block fits) or left a
// free block "large enough" beside a request that failed.
// Approach: the dump names each segment's pool (segment_pool_id, (0, 0)
// the default one; replay.h). An out-of-memory's free figures count the
// default pool's ranges only, unless its frames show a CUDA graph being
// recorded (then the request targeted a private pool, and all ranges
// count as before); the private pools' segments, reserved and free bytes
// are reported beside them (the private_pools verdict and fix).
// Limits: a segment freed before the dump has no pool on record (default);
// a MemPool made with use_on_oom=True serves other requests when they
// fail (torch/cuda/memory.py, MemPool): not modelled. (The replays under
// other allocator settings keep each pool apart: Note [Allocator settings
// replayed].)

// Note [Memory on other streams]
// Rationale: the caching allocator caches a freed block for the stream
// that allocated its segment and serves a request from blocks of the
// request's stream only (CUDACachingAllocator.cpp get_free_block:
// `(*it)->stream != p.stream()`). Before it reports an out-of-memory it
// returns every stream's wholly free segments to CUDA
// (release_cached_blocks), so what stays reserved on another stream is
// free blocks beside live ones: a side stream's tensor (an FSDP or DDP
// communication buffer, a prefetch made under torch.cuda.stream) pins its
// segment. Counted as free for any request, such blocks read as "a free
// block large enough" beside a request that failed.
// Approach: each reserved range carries its stream (replay.h). The largest
// free block is the request's stream's; the free byte figures still count
// every stream's, as the out-of-memory message's "reserved but
// unallocated" does, and fragmentation is those bytes against a largest
// block of the request's own stream: defragmented (expandable segments,
// whose free pages go back to CUDA at the out-of-memory whatever their
// stream), they serve it. The other streams' segments, reserved and free
// bytes are reported beside them (the other_streams verdict and fix), and
// the replays under other allocator settings keep each stream's blocks
// apart (allocsim, Note [Streams in the simulator]).
// Limits: a trace without streams (none recorded) is one stream; memory a
// block keeps after its tensor is freed until another stream's work on it
// completes (record_stream) is released at free_completed, as recorded.

/// fn() on a thread of its own, or on this one at get() when none can start.
template <typename Fn>
auto run_beside(Fn fn) -> std::future<decltype(fn())> {
  try {
    return std::async(std::launch::async, fn);
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, std::move(fn));
  }
}

constexpr int kTimelineBuckets = 800;
constexpr size_t kMaxLeakSamples = 256;
constexpr int64_t kMinLeakGrowth = kMiB;  // total growth below this is noise
constexpr int kMinLeakIterations = 3;
constexpr size_t kMaxOoms = 64;         // oom events reported in detail
constexpr int kOtherStreamHolders = 3;  // sites named as keeping other streams' segments

ar::AllocatorConfig config_of(const AllocatorSettings& s) {
  ar::AllocatorConfig c;
  if (s.max_split_size > 0) c.max_split_size = s.max_split_size;
  c.garbage_collection_threshold = s.garbage_collection_threshold;
  c.expandable_segments = s.expandable_segments;
  c.roundup_power2_divisions = s.roundup_power2_divisions;
  return c;
}

/// Every device the snapshot holds trace events or segments of, by index.
std::vector<DeviceContent> device_contents(const Snapshot& snapshot) {
  std::map<int, DeviceContent> by_device;
  for (size_t d = 0; d < snapshot.device_traces.size(); ++d) {
    const auto& trace = snapshot.device_traces[d];
    if (trace.empty()) continue;
    DeviceContent& c = by_device[static_cast<int>(d)];
    c.events = static_cast<int64_t>(trace.size());
    c.ooms =
        std::count_if(trace.begin(), trace.end(), [](const TraceEvent& e) { return e.action == TraceAction::kOom; });
  }
  for (const Segment& s : snapshot.segments) {
    DeviceContent& c = by_device[static_cast<int>(s.device)];
    c.reserved_bytes += s.total_size;
    c.allocated_bytes += s.allocated_size;
  }
  std::vector<DeviceContent> contents;
  for (auto& [device, c] : by_device) {
    c.device = device;
    contents.push_back(c);
  }
  return contents;
}

/// The device a diagnosis is about: the one asked for, else the first that
/// ran out of memory, else the one with the most trace events, else the one
/// with the most reserved bytes (a snapshot dumped without a trace).
int choose_device(const std::vector<DeviceContent>& contents, int asked, const std::string& file) {
  if (asked >= 0) {
    const bool held =
        std::any_of(contents.begin(), contents.end(), [&](const DeviceContent& c) { return c.device == asked; });
    if (held || contents.empty()) return asked;
    std::vector<std::string> names;
    for (const DeviceContent& c : contents) names.push_back(std::to_string(c.device));
    throw SnapshotError(
        fmt::format("{}: device {} has no trace events and no segments in this snapshot; it holds "
                    "device{} {}",
                    file, asked, names.size() == 1 ? "" : "s", fmt::join(names, ", ")));
  }
  for (const DeviceContent& c : contents) {
    if (c.ooms > 0) return c.device;
  }
  const DeviceContent* best = nullptr;
  for (const DeviceContent& c : contents) {
    // Strictly greater: of equals, the lowest index.
    if (best == nullptr ||
        std::make_pair(c.events, c.reserved_bytes) > std::make_pair(best->events, best->reserved_bytes))
      best = &c;
  }
  return best == nullptr ? 0 : best->device;
}

/// Site table: one entry per (layer, call site) pair seen, plus placeholders.
/// Replay sums live bytes per entry; the reports merge entries by layer or
/// by call site (GroupBy).
class Sites {
 public:
  enum Placeholder { kBeforeRecording = 0, kBackwardCpp, kNoUserFrame, kNoFrames, kNumPlaceholders };

  Sites(const Snapshot& snapshot, const FrameIndex& index, GroupBy group_by)
      : snapshot_(snapshot), index_(index), group_by_(group_by) {
    of_stack_.assign(snapshot.stacks.size(), kNoFrames);
    for (size_t s = 1; s < snapshot.stacks.size(); ++s) {
      const auto stack = static_cast<StackId>(s);
      // C++ frames alone (stacks="all") name no site: as a stack without frames.
      if (!index.has_python_frames(stack)) continue;
      const std::pair<int64_t, int64_t> pair{index.layer_frame(stack), index.call_frame(stack)};
      if (pair.first < 0 && pair.second < 0) {
        of_stack_[s] = kNoUserFrame;
        continue;
      }
      auto [it, inserted] = of_pair_.emplace(pair, static_cast<int32_t>(kNumPlaceholders + pairs_.size()));
      if (inserted) pairs_.push_back(pair);
      of_stack_[s] = it->second;
    }
  }
  int size() const { return static_cast<int>(kNumPlaceholders + pairs_.size()); }
  int32_t of(StackId stack, bool before_recording, Phase phase) const {
    if (!index_.has_python_frames(stack)) {
      if (before_recording) return kBeforeRecording;
      return phase == Phase::kBackward ? kBackwardCpp : kNoFrames;
    }
    return of_stack_[stack];
  }
  /// The frame a site is grouped by (its layer or call site); negative keys:
  /// -1 - placeholder, or -1 - kNumPlaceholders for "(no layer)" / "(no call site)".
  int64_t key(int32_t site) const {
    if (site < kNumPlaceholders) return -1 - site;
    const auto& p = pairs_[static_cast<size_t>(site - kNumPlaceholders)];
    const int64_t frame = group_by_ == GroupBy::kLayer ? p.first : p.second;
    return frame >= 0 ? frame : -1 - kNumPlaceholders;
  }
  /// The frame of the other kind (call site when grouped by layer), or -1.
  int64_t other(int32_t site) const {
    if (site < kNumPlaceholders) return -1;
    const auto& p = pairs_[static_cast<size_t>(site - kNumPlaceholders)];
    return group_by_ == GroupBy::kLayer ? p.second : p.first;
  }
  SiteBytes describe(int32_t site) const {
    SiteBytes s;
    switch (site) {
      case kBeforeRecording:
        s.site = "(allocated before recording began)";
        return s;
      case kBackwardCpp:
        s.site = "(no Python frames: autograd engine, C++, during backward)";
        return s;
      case kNoUserFrame:
        s.site = "(no user frame: torch, the standard library or generated code)";
        return s;
      case kNoFrames:
        s.site = "(no Python frames)";
        return s;
      default:
        break;
    }
    const auto& [layer, call] = pairs_[static_cast<size_t>(site - kNumPlaceholders)];
    const int64_t f = key(site);
    if (f >= 0) {
      const Frame& fr = snapshot_.frames[static_cast<size_t>(f)];
      s.site = index_.describe(f);
      s.filename = fr.filename;
      s.line = fr.line;
      s.function = fr.name;
    } else {
      s.site = group_by_ == GroupBy::kLayer ? "(no layer)" : "(no call site)";
    }
    if (layer >= 0) s.layer = index_.describe(layer);
    if (call >= 0) s.call_site = index_.describe(call);
    return s;
  }

 private:
  const Snapshot& snapshot_;
  const FrameIndex& index_;
  GroupBy group_by_;
  std::vector<int32_t> of_stack_;
  std::map<std::pair<int64_t, int64_t>, int32_t> of_pair_;
  std::vector<std::pair<int64_t, int64_t>> pairs_;  // (layer frame, call frame)
};

/// Live bytes by site (merged by layer or call site) and category right now,
/// biggest first; with `within`, of the blocks in the ranges it covers only.
std::vector<SiteBytes> sites_now(const Replay& replay, const Sites& sites, int top, CategoryBytes* by_category,
                                 const RangeScope* within = nullptr) {
  struct Acc {
    int64_t bytes = 0;
    int64_t blocks = 0;
    std::array<int64_t, kNumCategories> by_category{};
    std::map<int32_t, int64_t> by_site;  // the (layer, call) entries merged here
  };
  std::map<int64_t, Acc> acc;  // by Sites::key
  if (by_category) by_category->fill(0);
  for (const auto& [addr, b] : replay.live()) {
    if (!b.allocated) continue;
    if (within != nullptr) {
      const ReservedRange* range = replay.range_at(addr);
      if (range == nullptr || !within->covers(*range)) continue;
    }
    Acc& slot = acc[sites.key(b.label.site)];
    slot.bytes += b.size;
    slot.blocks += 1;
    slot.by_category[b.label.category] += b.size;
    slot.by_site[b.label.site] += b.size;
    if (by_category) (*by_category)[b.label.category] += b.size;
  }
  std::vector<SiteBytes> out;
  for (const auto& [key, v] : acc) {
    // Named by its biggest entry; the entries' other frames (call sites of a layer) are counted.
    const auto biggest = std::max_element(v.by_site.begin(), v.by_site.end(),
                                          [](const auto& a, const auto& b) { return a.second < b.second; });
    SiteBytes s = sites.describe(biggest->first);
    std::set<int64_t> others;
    for (const auto& [site, bytes] : v.by_site) others.insert(sites.other(site));
    s.others = static_cast<int64_t>(others.size()) - 1;
    s.bytes = v.bytes;
    s.blocks = v.blocks;
    s.category =
        static_cast<Category>(std::max_element(v.by_category.begin(), v.by_category.end()) - v.by_category.begin());
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const SiteBytes& a, const SiteBytes& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.site < b.site;
  });
  if (top >= 0 && out.size() > static_cast<size_t>(top)) out.resize(static_cast<size_t>(top));
  return out;
}

std::vector<SegmentView> segment_map_now(const Replay& replay) {
  std::vector<SegmentView> out;
  for (const auto& [addr, r] : replay.ranges()) {
    SegmentView v;
    v.address = addr;
    v.size = r.size;
    v.is_large = r.is_large;
    v.is_expandable = r.is_expandable;
    v.private_pool = r.private_pool;
    v.stream = r.stream;
    for (auto it = replay.live().lower_bound(addr); it != replay.live().end() && it->first < addr + r.size; ++it) {
      SegmentView::Piece p;
      p.offset = it->first - addr;
      p.size = std::min(it->second.size, addr + r.size - it->first);
      p.allocated = it->second.allocated;
      p.category = static_cast<Category>(it->second.label.category);
      v.blocks.push_back(p);
    }
    out.push_back(std::move(v));
  }
  return out;
}

TimelinePoint point_now(const Replay& replay, int64_t index, int64_t time_us) {
  TimelinePoint p;
  p.event_index = index;
  p.time_us = time_us;
  p.allocated_bytes = replay.allocated_bytes();
  p.reserved_bytes = replay.reserved_bytes();
  for (int c = 0; c < kNumCategories; ++c)
    p.by_category[static_cast<size_t>(c)] = replay.allocated_by_category()[static_cast<size_t>(c)];
  return p;
}

/// The optimizer (FrameIndex::optimizer: torch.optim's, bitsandbytes') of
/// the latest trace event before `end` whose stack names one; where none
/// does, the class of the latest torch.optim step mark begun by then
/// (`marks`, phase_marks.h; optimizer_of_class); else that of a
/// block of `device` alive when the snapshot was taken (state made before
/// recording began); nullptr when nothing names one.
const OptimizerKind* optimizer_named(const Snapshot& snapshot, int device, const std::vector<TraceEvent>& trace,
                                     const FrameIndex& frames, size_t end, const std::vector<PhaseSpan>& marks) {
  for (size_t i = end; i-- > 0;) {
    if (const OptimizerKind* kind = frames.optimizer(trace[i].frames)) return kind;
  }
  const int64_t until = end > 0 && end <= trace.size() ? trace[end - 1].time_us : 0;
  for (auto it = marks.rbegin(); it != marks.rend() && until > 0; ++it) {
    if (it->source != MarkSource::kOptimizerStep || it->begin_us > until) continue;
    if (const OptimizerKind* kind = optimizer_of_class(it->optimizer_class)) return kind;
    break;
  }
  for (const Segment& s : snapshot.segments) {
    if (s.device != device) continue;
    for (const Block& b : s.blocks) {
      if (const OptimizerKind* kind = frames.optimizer(b.frames)) return kind;
    }
  }
  return nullptr;
}

std::string frames_note(const TraceSummary& t) {
  std::string note;
  if (t.alloc_events_in_marked_phases > 0) {
    note = fmt::format(
        "Phases come from oomtune's phase marks (external_annotations \"oomtune:<phase>\", written by a CUDA trial): "
        "{} of {} allocations lie inside one.",
        t.alloc_events_in_marked_phases, t.alloc_events);
    if (t.alloc_events_without_frames == t.alloc_events)
      note += " No allocation has frames, so sites cannot be named (a C++ trial records no Python stack).";
  } else if (t.alloc_events > 0 && t.alloc_events_without_frames == t.alloc_events) {
    note = fmt::format(
        "No allocation in the trace has frames, so phases and sites cannot be named: record with "
        "torch.cuda.memory._record_memory_history(context=\"all\", stacks=\"python\").");
  } else if (t.alloc_events_without_frames > 0) {
    note = fmt::format(
        "{} of {} allocations ({}) have no frames. {} of them follow forward frames in the trace, so they were "
        "made by the autograd engine's C++ thread during backward: stacks=\"python\" records Python frames only "
        "(pytorch PR #124784); they are counted as backward.",
        t.alloc_events_without_frames, t.alloc_events, format_bytes(t.bytes_without_frames),
        t.frameless_inferred_backward);
  }
  if (t.frameless_in_optimizer_marks > 0) {
    if (!note.empty()) note += " ";
    note += fmt::format(
        "{} allocation{} without frames lie inside an optimizer step's own mark (external_annotations "
        "\"Optimizer.step#<class>.step\", torch.optim's record_function) and count as the optimizer's.",
        t.frameless_in_optimizer_marks, t.frameless_in_optimizer_marks == 1 ? "" : "s");
  }
  if (t.cpp_frames) {
    if (!note.empty()) note += " ";
    note +=
        "The stacks hold C++ frames (stacks=\"all\", _record_memory_history's default): layers, call sites and "
        "phases come from the Python frames, and the autograd engine's C++ frames mark backward. "
        "stacks=\"python\" gives the same report, and its dumps are ~100x faster (torchtitan PR #3628).";
  }
  if (t.fx_traced_frames > 0) {
    if (!note.empty()) note += " ";
    note += fmt::format(
        "{} frame{} of FX-generated code carry the model source's stack (augment_with_fx_traces=True): their "
        "allocations go to the model lines their graph nodes were traced from, a backward node's to the forward "
        "line it differentiates; other generated code (a node without a stack, inductor's output code) names no "
        "layer, and its allocations go to the frame that called the compiled region.",
        t.fx_traced_frames, t.fx_traced_frames == 1 ? "" : "s");
  } else if (t.generated_frames) {
    if (!note.empty()) note += " ";
    note +=
        "Code torch.compile generated (inductor's output code, FX's <eval_with_key>) names no layer: a compiled "
        "region's allocations go to the frame that called it, the compiled module's forward, or in backward the "
        "script's backward line where the engine ran on its thread (TORCH_LOGS=output_code maps the generated "
        "lines back to the model's).";
    if (t.fx_frames_without_source) {
      note +=
          " FX GraphModules' code (fx_generated__*.py: aot_eager's or AOTAutograd's graphs) maps back to the model's "
          "lines: set torch.fx.experimental._config.enrich_profiler_metadata = True before compiling and dump with "
          "torch.cuda.memory._dump_snapshot(augment_with_fx_traces=True) (PyTorch 2.11).";
    }
  }

  const int64_t with_frames = t.allocated_before_trace_with_frames_bytes;
  const int64_t before_recording = t.allocated_before_recording_bytes - with_frames;
  if (before_recording > 0) {
    if (!note.empty()) note += " ";
    note += fmt::format(
        "{} were allocated before recording began (model weights, optimizer state or data created before "
        "_record_memory_history); they have no alloc event{}.",
        format_bytes(before_recording), t.truncated ? " and the trace starts mid-run" : "");
  }
  if (with_frames > 0) {
    if (!note.empty()) note += " ";
    note += fmt::format(
        "{} were allocated while recording but have no alloc event in the trace: their blocks carry stacks, "
        "and {}.",
        format_bytes(with_frames),
        t.events > 0 ? "the trace kept only later events (max_entries keeps the last ones)"
        : t.layout_has_traces
            ? "the snapshot holds no events (_record_memory_history(enabled=\"state\") keeps the stacks of live "
              "blocks and no history; torch.cuda.memory_snapshot(include_traces=False) leaves the history out)"
            : "torch.cuda.memory_snapshot() holds no events");
  }
  return note;
}

}  // namespace

const char* group_by_name(GroupBy group_by) { return group_by == GroupBy::kLayer ? "layer" : "call"; }

Diagnosis diagnose(const Snapshot& snapshot, const std::string& file, const DiagnoseOptions& options) {
  Diagnosis d;
  d.file = file;
  d.file_bytes = snapshot.file_bytes;
  d.layout = layout_name(snapshot.layout);
  d.allocator_settings = snapshot.allocator_settings;
  const int top = std::max(options.top, 0);

  const std::vector<DeviceContent> contents = device_contents(snapshot);
  const int device = choose_device(contents, options.device, file);
  for (const DeviceContent& c : contents) {
    if (c.device != device) d.other_devices.push_back(c);
  }
  static const std::vector<TraceEvent> kNoEvents;
  const auto& trace = static_cast<size_t>(device) < snapshot.device_traces.size()
                          ? snapshot.device_traces[static_cast<size_t>(device)]
                          : kNoEvents;
  const ar::AllocatorConfig config = config_of(snapshot.allocator_settings);
  const FrameIndex frames(snapshot);
  const std::vector<PhaseSpan> marks = marked_phase_spans(snapshot.annotations, device);
  const Attribution attr = attribute(trace, frames, marks);
  const Sites sites(snapshot, frames, options.group_by);
  d.group_by = options.group_by;
  d.torch_roots = frames.torch_roots();

  auto labeler = [&](int64_t alloc_event, StackId stack) {
    BlockLabel label;
    if (alloc_event >= 0) {
      const auto i = static_cast<size_t>(alloc_event);
      label.category = static_cast<uint8_t>(attr.event_category[i]);
      label.site = sites.of(stack, false, attr.event_phase[i]);
    } else {
      label.category = static_cast<uint8_t>(category_before_recording(stack, frames));
      label.site = sites.of(stack, true, Phase::kUnknown);
    }
    return label;
  };

  // Leak samples: a subset of iteration starts.
  std::vector<size_t> sample_at;
  {
    const auto& starts = attr.iteration_starts;
    const size_t step = std::max<size_t>(1, (starts.size() + kMaxLeakSamples - 1) / kMaxLeakSamples);
    for (size_t i = 0; i < starts.size(); i += step) sample_at.push_back(starts[i]);
  }
  std::vector<std::vector<int64_t>> samples;

  // ---- pass 1: the whole trace
  Replay replay(snapshot, device, config, labeler, sites.size());
  // Where a replay under another allocator setting starts (Note [Allocator settings replayed]).
  std::vector<InitialBlock> initial_blocks;
  for (const auto& [addr, b] : replay.live()) {
    const ReservedRange* range = replay.range_at(addr);
    initial_blocks.push_back({addr, b.size, range != nullptr ? range->stream : 0});
  }
  const std::vector<PrivatePoolRange> private_ranges = private_pool_ranges(snapshot, device);
  std::vector<allocsim::ExistingSegment> initial_segments = existing_segments(replay, private_ranges);
  TraceSummary& t = d.trace;
  t.device = device;
  t.layout_has_traces = snapshot.layout != SnapshotLayout::kV1_13;
  t.events = static_cast<int64_t>(trace.size());
  t.allocated_before_recording_bytes = replay.initial_allocated_bytes();
  t.allocated_before_trace_with_frames_bytes = replay.initial_allocated_with_frames_bytes();
  t.reserved_before_recording_bytes = replay.initial_reserved_bytes();
  t.truncated = replay.orphan_frees() > 0;
  t.iterations = static_cast<int64_t>(attr.iteration_starts.size());
  t.alloc_events = attr.alloc_events;
  t.alloc_events_without_frames = attr.alloc_events_without_frames;
  t.bytes_without_frames = attr.bytes_without_frames;
  t.frameless_inferred_backward = attr.frameless_inferred_backward;
  t.alloc_events_in_marked_phases = attr.alloc_events_in_marked_phases;
  t.frameless_in_optimizer_marks = attr.frameless_in_optimizer_marks;
  const RecordFunctions record_functions(snapshot, device);
  const TagPresence tags_present = tags_in_trace(snapshot, device, record_functions);
  if (tags_present.user_metadata || tags_present.compile_contexts) {
    for (size_t i = 0; i < trace.size(); ++i) {
      if (trace[i].action != TraceAction::kAlloc) continue;
      const EventTag& tag = snapshot.event_tags[snapshot.tag_of(static_cast<size_t>(device), i)];
      if (!tag.user_metadata.empty()) ++t.alloc_events_with_user_metadata;
      if (!tag.compile_context.empty()) ++t.alloc_events_in_compiled_regions;
    }
  }
  t.cpp_frames = frames.has_cpp_frames();
  t.generated_frames = frames.has_generated_frames();
  t.fx_traced_frames = snapshot.fx_traced_frames;
  std::vector<size_t> empty_cache_at = empty_cache_calls(trace, frames);
  t.empty_cache_calls = static_cast<int64_t>(empty_cache_at.size());
  t.fx_frames_without_source = std::count_if(snapshot.frames.begin(), snapshot.frames.end(), [](const Frame& f) {
                                 return is_fx_generated_file(f.filename);
                               }) > t.fx_traced_frames;
  t.forward_alloc_events = attr.forward_alloc_events;
  t.checkpointed_forward_allocs = attr.checkpointed_forward_allocs;
  t.recomputed_backward_allocs = attr.recomputed_backward_allocs;
  if (!trace.empty() && trace.back().time_us > 0 && trace.front().time_us > 0) {
    t.duration_us = trace.back().time_us - trace.front().time_us;
  }
  if (t.iterations >= 2) {
    t.events_per_iteration =
        static_cast<int64_t>(attr.iteration_starts.back() - attr.iteration_starts.front()) / (t.iterations - 1);
  } else {
    t.events_per_iteration = t.events;
  }

  // The oom events that ended the run come after its last allocation.
  const size_t last_alloc = last_alloc_event(trace);
  size_t last_oom = SIZE_MAX;
  for (size_t i = 0; i < trace.size(); ++i) {
    if (trace[i].action == TraceAction::kOom && !oom_caught(i, last_alloc, trace.size())) last_oom = i;
  }
  d.optimizer = optimizer_named(snapshot, device, trace, frames, std::min(last_oom, trace.size()), marks);

  const size_t bucket = std::max<size_t>(1, (trace.size() + kTimelineBuckets - 1) / kTimelineBuckets);
  d.timeline.push_back(point_now(replay, -1, trace.empty() ? 0 : trace.front().time_us));
  TimelinePoint best;
  bool have_best = false;
  int64_t peak_alloc = replay.allocated_bytes();
  int64_t peak_index = -1;
  size_t next_sample = 0;
  PhaseRunTracker runs;
  EvalOutputTracker eval_outputs(frames);  // Note [Evaluation outputs]
  NeedQuery need_query;                    // the last oom reported
  int64_t most_reserved = replay.reserved_bytes();
  // The least reserved + segment that the cap refused so far: its upper bound.
  int64_t cap_refused = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < trace.size(); ++i) {
    const TraceEvent& e = trace[i];
    while (next_sample < sample_at.size() && sample_at[next_sample] == i) {
      samples.push_back(replay.allocated_by_site());
      ++next_sample;
    }
    const bool caught = e.action == TraceAction::kOom && oom_caught(i, last_alloc, trace.size());
    // An oom's segment (the cudaMalloc it needed), and whether the cap refused
    // it: device_free is read after the allocator has released its cached
    // segments and retried, so without a cap it is below the segment.
    const int64_t segment = e.action == TraceAction::kOom ? ar::segment_size_for(ar::round_size(e.size, config)) : 0;
    const bool refused_by_cap = e.action == TraceAction::kOom && e.addr >= segment;
    const int64_t cap_refused_before = cap_refused;
    if (refused_by_cap) cap_refused = std::min(cap_refused, replay.reserved_bytes() + segment);
    if (caught && d.caught_ooms.size() < kMaxOoms) {
      CaughtOom c;
      c.event_index = static_cast<int64_t>(i);
      c.time_us = e.time_us;
      c.requested_bytes = e.size;
      c.allocated_bytes = replay.allocated_bytes();
      c.reserved_bytes = replay.reserved_bytes();
      c.phase = attr.event_phase[i];
      if (frames.layer_frame(e.frames) >= 0) c.layer = frames.describe(frames.layer_frame(e.frames));
      if (frames.call_frame(e.frames) >= 0) c.call_site = frames.describe(frames.call_frame(e.frames));
      c.in_convolution = frames.runs_convolution(e.frames);
      c.batch_size_finder = frames.batch_size_finder(e.frames);
      c.allocations_after = allocations_after(trace, i);
      d.caught_ooms.push_back(std::move(c));
    }
    if (e.action == TraceAction::kOom && !caught && d.ooms.size() < kMaxOoms) {
      OomReport o;
      o.event_index = static_cast<int64_t>(i);
      o.time_us = e.time_us;
      o.requested_bytes = e.size;
      o.rounded_bytes = ar::round_size(e.size, config);
      o.large_pool = ar::pool_of(e.size) == ar::Pool::kLarge;
      o.segment_bytes = segment;
      o.device_free_bytes = e.addr;
      o.allocated_bytes = replay.allocated_bytes();
      o.reserved_bytes = replay.reserved_bytes();
      const ar::Pool pool = o.large_pool ? ar::Pool::kLarge : ar::Pool::kSmall;
      // Note [Private memory pools]
      o.private_pool_segments = replay.segments_in(PoolScope::kPrivatePools);
      o.private_pool_reserved_bytes = replay.reserved_bytes_in(PoolScope::kPrivatePools);
      o.private_pool_free_bytes = replay.free_bytes(ar::Pool::kLarge, PoolScope::kPrivatePools) +
                                  replay.free_bytes(ar::Pool::kSmall, PoolScope::kPrivatePools);
      o.captures_cuda_graph = frames.captures_cuda_graph(e.frames);
      const PoolScope usable =
          o.private_pool_segments > 0 && !o.captures_cuda_graph ? PoolScope::kDefaultPool : PoolScope::kAll;
      o.pool_free_bytes = replay.free_bytes(pool, usable);
      o.reserved_free_bytes = replay.free_bytes(ar::Pool::kLarge, usable) + replay.free_bytes(ar::Pool::kSmall, usable);
      o.fully_free_segment_bytes = replay.fully_free_segment_bytes(usable);
      // Note [Memory on other streams]
      o.stream = snapshot.stream_of(e);
      const RangeScope own(usable, StreamScope::kOnly, o.stream);
      const RangeScope others(usable, StreamScope::kOthers, o.stream);
      o.largest_free_block_bytes = replay.largest_free_block(pool, own);
      o.other_stream_segments = replay.segments_in(others);
      o.other_stream_reserved_bytes = replay.reserved_bytes_in(others);
      o.other_stream_free_bytes =
          replay.free_bytes(ar::Pool::kLarge, others) + replay.free_bytes(ar::Pool::kSmall, others);
      o.other_stream_largest_free_block_bytes = replay.largest_free_block(pool, others);
      if (o.other_stream_segments > 0)
        o.other_stream_holders = sites_now(replay, sites, kOtherStreamHolders, nullptr, &others);
      o.fragmentation = o.reserved_free_bytes >= o.requested_bytes && o.largest_free_block_bytes < o.rounded_bytes;
      o.memory_cap = refused_by_cap;
      if (o.memory_cap) {
        o.cap_low_bytes = std::max(most_reserved, o.reserved_bytes);
        o.cap_high_bytes = std::min(cap_refused_before, o.reserved_bytes + o.segment_bytes);
      }
      o.phase = attr.event_phase[i];
      if (frames.layer_frame(e.frames) >= 0) o.layer = frames.describe(frames.layer_frame(e.frames));
      if (frames.call_frame(e.frames) >= 0) o.call_site = frames.describe(frames.call_frame(e.frames));
      const int64_t mf = frames.model_forward_frame(e.frames);
      if (mf >= 0) o.model_forward = frames.describe(mf);
      o.recomputing = o.phase == Phase::kBackward && frames.recomputes(e.frames);
      const EventTag& tag = snapshot.event_tags[snapshot.tag_of(static_cast<size_t>(device), i)];
      o.user_metadata = tag.user_metadata;
      o.compile_context = tag.compile_context;
      o.record_functions = record_functions.open_at(i);
      if (o.phase == Phase::kForward) o.inference_kind = frames.inference_kind(e.frames);
      for (int c = 0; c < kNumCategories; ++c) {
        o.live_by_category[static_cast<size_t>(c)] = replay.allocated_by_category()[static_cast<size_t>(c)];
      }
      o.eval_outputs = eval_outputs.at_oom(e, o.live_by_category[static_cast<size_t>(Category::kEvalOutputs)]);
      need_query =
          NeedQuery{i, o.phase, o.rounded_bytes, o.allocated_bytes, o.live_by_category, o.inference(), d.optimizer};
      d.ooms.push_back(o);
      d.timeline.push_back(point_now(replay, static_cast<int64_t>(i), e.time_us));
    }
    if (i == last_oom) {
      d.oom_sites = sites_now(replay, sites, top, nullptr);
      d.oom_tags = tagged_bytes_now(replay, snapshot, device, record_functions, tags_present, top);
      d.segment_map = segment_map_now(replay);
      d.map_moment = "at the last out-of-memory";
    }
    runs.before_event(i, attr.event_phase[i], e.action == TraceAction::kOom && !caught, replay.allocated_bytes());
    eval_outputs.observe(e);
    replay.apply(i);
    runs.after_event(replay.allocated_bytes());
    most_reserved = std::max(most_reserved, replay.reserved_bytes());
    if (replay.allocated_bytes() > peak_alloc) {
      peak_alloc = replay.allocated_bytes();
      peak_index = static_cast<int64_t>(i);
    }
    if (!have_best || replay.allocated_bytes() > best.allocated_bytes) {
      best = point_now(replay, static_cast<int64_t>(i), e.time_us);
      have_best = true;
    }
    if ((i + 1) % bucket == 0 || i + 1 == trace.size()) {
      if (have_best) d.timeline.push_back(best);
      have_best = false;
    }
  }
  std::sort(d.timeline.begin(), d.timeline.end(),
            [](const TimelinePoint& a, const TimelinePoint& b) { return a.event_index < b.event_index; });
  // Note [Blocks that kept nothing]: a forward without autograd that no frame names.
  for (OomReport& o : d.ooms) {
    if (o.phase != Phase::kForward || o.inference()) continue;
    o.nothing_saved = blocks_kept_nothing(trace, attr, frames, static_cast<size_t>(o.event_index));
    if (o.nothing_saved.found()) o.inference_kind = InferenceKind::kNothingSaved;
  }
  if (!d.ooms.empty()) {
    need_query.inference = d.ooms.back().inference();
    need_query.generating = d.ooms.back().inference_kind == InferenceKind::kGenerate;
    if (d.ooms.back().nothing_saved.found()) need_query.blocks = &d.ooms.back().nothing_saved;
    d.need = estimate_need(need_query, runs.finish(trace.size()), trace, attr, frames);
  }
  t.inconsistencies = replay.inconsistencies();
  for (const Segment& s : snapshot.segments) {
    if (s.device != device && snapshot.device_traces.size() > 1) continue;
    t.dumped_reserved_bytes += s.total_size;
    for (const Block& b : s.blocks) {
      if (b.state == BlockState::kActiveAllocated) t.dumped_allocated_bytes += b.size;
    }
  }
  t.replay_matches_dump =
      replay.allocated_bytes() == t.dumped_allocated_bytes && replay.reserved_bytes() == t.dumped_reserved_bytes;
  t.frames_note = frames_note(t);
  t.free_requested_skipped = snapshot.free_requested_skipped;
  t.free_completed_skipped = !t.free_requested_skipped && !records_free_completed(trace) &&
                             std::any_of(trace.begin(), trace.end(),
                                         [](const TraceEvent& e) { return e.action == TraceAction::kFreeRequested; });
  if (t.free_requested_skipped) {
    t.actions_note =
        "the trace has no free_requested events (recorded with skip_actions=[\"free_requested\"]): each "
        "free_completed is read as the tensor's free, which comes later than free_requested only where another "
        "stream still used the block.";
  } else if (t.free_completed_skipped) {
    t.actions_note =
        "the trace has no free_completed events (recorded with skip_actions=[\"free_completed\"]): a freed block "
        "is taken as reusable at once, as it is where no other stream still used it.";
  }

  // ---- pass 2: the peak
  {
    Replay again(snapshot, device, config, labeler, sites.size());
    for (int64_t i = 0; i <= peak_index; ++i) again.apply(static_cast<size_t>(i));
    d.peak.event_index = peak_index;
    d.peak.time_us = peak_index >= 0 ? trace[static_cast<size_t>(peak_index)].time_us : 0;
    d.peak.allocated_bytes = again.allocated_bytes();
    d.peak.reserved_bytes = again.reserved_bytes();
    d.peak.phase = peak_index >= 0 ? attr.event_phase[static_cast<size_t>(peak_index)] : Phase::kUnknown;
    d.peak.sites = sites_now(again, sites, top, &d.peak.by_category);
    d.peak.tags = tagged_bytes_now(again, snapshot, device, record_functions, tags_present, top);
    if (d.segment_map.empty()) {
      d.segment_map = segment_map_now(again);
      d.map_moment = peak_index >= 0 ? "at the peak" : "when recording began";
    }
  }

  // ---- leaks
  if (samples.size() >= static_cast<size_t>(kMinLeakIterations)) {
    samples.push_back(replay.allocated_by_site());  // the end of the trace
    const size_t n_sites = samples.front().size();
    for (size_t s = 0; s < n_sites; ++s) {
      if (s == static_cast<size_t>(Sites::kBeforeRecording)) continue;
      bool never_drops = true;
      int grew = 0;
      for (size_t k = 1; k + 1 < samples.size(); ++k) {  // iteration starts only
        if (samples[k][s] < samples[k - 1][s]) never_drops = false;
        if (samples[k][s] > samples[k - 1][s]) ++grew;
      }
      const int64_t first = samples.front()[s];
      const int64_t last = samples[samples.size() - 2][s];
      const int steps = static_cast<int>(samples.size()) - 2;
      if (!never_drops || grew < kMinLeakIterations - 1 || grew * 3 < steps * 2 || last - first < kMinLeakGrowth) {
        continue;
      }
      if (samples.back()[s] < last) continue;  // freed by the end
      LeakSuspect l;
      l.site = sites.describe(static_cast<int32_t>(s));
      l.site.bytes = samples.back()[s];
      l.first_live_bytes = first;
      l.last_live_bytes = last;
      l.iterations = steps;
      l.growth_per_iteration_bytes = steps > 0 ? (last - first) / steps : 0;
      d.leaks.push_back(std::move(l));
    }
    std::sort(d.leaks.begin(), d.leaks.end(), [](const LeakSuspect& a, const LeakSuspect& b) {
      return a.growth_per_iteration_bytes > b.growth_per_iteration_bytes;
    });
    if (d.leaks.size() > static_cast<size_t>(top)) d.leaks.resize(static_cast<size_t>(top));
  }

  // Note [Allocator settings replayed]
  if (!d.ooms.empty() && d.ooms.back().fragmentation && !d.allocator_settings.expandable_segments) {
    const OomReport& o = d.ooms.back();
    SettingReplayInput in;
    in.initial_blocks = std::move(initial_blocks);
    in.initial_segments = std::move(initial_segments);
    for (const TraceEvent& e : trace) {
      if (e.action == TraceAction::kSegmentAlloc) in.segment_addresses.push_back(static_cast<std::uint64_t>(e.addr));
    }
    in.trace = &trace;
    in.snapshot = &snapshot;
    in.oom_index = static_cast<size_t>(o.event_index);
    in.still_needed_bytes = std::max(d.need.still_needed_bytes, o.rounded_bytes);
    in.private_pool_ranges = private_ranges;
    in.request_in_graph_capture = o.captures_cuda_graph;
    in.empty_cache_at = std::move(empty_cache_at);
    in.cap_is_budget = o.memory_cap;
    in.cap_low_bytes = o.memory_cap               ? o.cap_low_bytes
                       : o.device_free_bytes >= 0 ? o.reserved_bytes + o.device_free_bytes
                                                  : 0;
    // Up to where the failing request is served whatever the setting: the
    // smallest cap that serves it is sought below that, wherever the real
    // cap lies (o.cap_high_bytes may be lower).
    in.cap_high_bytes = o.memory_cap ? o.reserved_bytes + o.segment_bytes : in.cap_low_bytes;
    if (in.cap_low_bytes > 0) {
      // The replays share nothing but their input: all but one run on
      // other threads (each is a pass over the whole trace, several while
      // it bisects for a cap).
      ar::AllocatorConfig expandable = config;
      expandable.expandable_segments = true;
      d.max_split_mb = max_split_mb(d, o);
      std::future<SettingReplay> split_replay;
      if (d.max_split_mb > 0) {
        ar::AllocatorConfig split = config;
        split.max_split_size = d.max_split_mb * kMiB;
        split_replay = run_beside([&in, split] { return replay_with_setting(in, split); });
      }
      // The same trace under the snapshot's own settings must run out of
      // memory where the real allocator did for the two answers to hold.
      std::future<SettingReplay> recorded_replay =
          run_beside([&in, &config] { return replay_as_recorded(in, config); });
      d.expandable_replay = replay_with_setting(in, expandable);
      d.as_recorded_replay = recorded_replay.get();
      if (split_replay.valid()) d.max_split_replay = split_replay.get();
    }
  }

  add_verdicts(d);
  recommend(d);
  order_fragmentation_verdict(d);
  return d;
}

}  // namespace oomtune::diagnose
