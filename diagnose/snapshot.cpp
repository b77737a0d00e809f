#include "diagnose/snapshot.h"

#include <algorithm>
#include <array>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "diagnose/fx_trace.h"
#include "diagnose/pickle_reader.h"

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace oomtune::diagnose {
namespace {

/// Asks for transparent huge pages on the 2 MiB-aligned interior of a large
/// buffer (fewer page faults while filling a 10^6-event trace).
void advise_huge_pages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

/// A trace recorded with _record_memory_history(skip_actions=
/// ["free_requested"]) (PyTorch 2.11, torch/cuda/memory.py) has
/// free_completed events and no free_requested: each free_completed is
/// read as free_requested, the tensor's free (it comes later only where
/// another stream still used the block), so every analysis sees the frees.
/// True when it relabeled any.
bool read_completions_as_requests(std::vector<TraceEvent>& trace) {
  bool completed = false;
  for (const TraceEvent& e : trace) {
    if (e.action == TraceAction::kFreeRequested) return false;
    completed = completed || e.action == TraceAction::kFreeCompleted;
  }
  if (!completed) return false;
  for (TraceEvent& e : trace) {
    if (e.action == TraceAction::kFreeCompleted) e.action = TraceAction::kFreeRequested;
  }
  return true;
}

/// A path into the pickle for error messages: "segments[3].blocks[7].size".
struct Path {
  const Path* parent = nullptr;
  std::string_view key;  // a dict key, or empty for a list index
  int64_t index = -1;

  Path child(std::string_view k) const { return Path{this, k, -1}; }
  Path item(int64_t i) const { return Path{this, {}, i}; }
  std::string str() const {
    std::string head = parent ? parent->str() : std::string();
    if (index >= 0) return head + fmt::format("[{}]", index);
    if (key.empty()) return head;
    return head.empty() ? std::string(key) : head + "." + std::string(key);
  }
};

// Field ids of the dict keys the model reads.
enum Field : int {
  kFUnknown = 0,
  // segment
  kFDevice,
  kFAddress,
  kFTotalSize,
  kFAllocatedSize,
  kFActiveSize,
  kFRequestedSize,
  kFStream,
  kFSegmentType,
  kFSegmentPoolId,
  kFIsExpandable,
  kFFrames,
  kFBlocks,
  // block
  kFSize,
  kFState,
  kFHistory,
  kFRealSize,
  // trace
  kFAction,
  kFAddr,
  kFTimeUs,
  kFDeviceFree,
  kFCompileContext,
  kFUserMetadata,
  // frame
  kFFilename,
  kFName,
  kFLine,
  kFFxOriginalTrace,
  kNumFields
};

constexpr std::pair<std::string_view, Field> kFieldNames[] = {
    {"device", kFDevice},
    {"address", kFAddress},
    {"total_size", kFTotalSize},
    {"allocated_size", kFAllocatedSize},
    {"active_size", kFActiveSize},
    {"requested_size", kFRequestedSize},
    {"stream", kFStream},
    {"segment_type", kFSegmentType},
    {"segment_pool_id", kFSegmentPoolId},
    {"is_expandable", kFIsExpandable},
    {"frames", kFFrames},
    {"blocks", kFBlocks},
    {"size", kFSize},
    {"state", kFState},
    {"history", kFHistory},
    {"real_size", kFRealSize},
    {"action", kFAction},
    {"addr", kFAddr},
    {"time_us", kFTimeUs},
    {"device_free", kFDeviceFree},
    {"compile_context", kFCompileContext},
    {"user_metadata", kFUserMetadata},
    {"filename", kFFilename},
    {"name", kFName},
    {"line", kFLine},
    {"fx_original_trace", kFFxOriginalTrace},
};

constexpr int64_t kMaxBytes = int64_t{1} << 52;
constexpr int64_t kMaxAddress = int64_t{1} << 60;
constexpr int64_t kMaxTimeUs = int64_t{1} << 62;

/// Field of a dict key. Keys are memoized strings, so one ValueRef per key
/// name: a direct-mapped cache on the ref's bits avoids comparing text.
class FieldCache {
 public:
  Field of(const ValueStore& s, ValueRef key) {
    const size_t slot = (key.bits() * 2654435761u) >> (32 - kBits);
    Entry& entry = entries_[slot];
    if (entry.valid && entry.bits == key.bits()) return entry.field;
    Field f = kFUnknown;
    const std::string_view text = s.as_text(key);
    for (const auto& [n, id] : kFieldNames) {
      if (n == text) f = id;
    }
    entry = Entry{key.bits(), f, true};
    return f;
  }

 private:
  struct Entry {
    uint32_t bits = 0;
    Field field = kFUnknown;
    bool valid = false;
  };
  static constexpr int kBits = 8;
  std::array<Entry, 1 << kBits> entries_{};
};

/// The trace action PyTorch names `text`; kOther for names it does not know.
TraceAction action_named(std::string_view text) {
  TraceAction a = TraceAction::kOther;
  for (int i = 0; i < kNumTraceActions; ++i) {
    if (text == action_name(static_cast<TraceAction>(i))) a = static_cast<TraceAction>(i);
  }
  return a;
}

/// A string's or bytes' text; "" for any other value.
std::string_view text_or_empty(const ValueStore& s, ValueRef v) {
  const ValueKind k = s.kind(v);
  return k == ValueKind::kString || k == ValueKind::kBytes ? s.as_text(v) : std::string_view();
}

/// The values of an event's tag keys as read (None when absent), for
/// TagTable::note.
struct TagRefs {
  ValueRef compile_context;
  ValueRef user_metadata;
  bool operator==(const TagRefs& o) const {
    return compile_context == o.compile_context && user_metadata == o.user_metadata;
  }
};

/// Numbers the distinct EventTags of a snapshot and keeps each trace's runs
/// (Snapshot::event_tags, tag_runs). A value that is no string counts as
/// none: the tag only labels events, nothing is computed from it.
class TagTable {
  struct TagText {
    std::string_view compile_context;
    std::string_view user_metadata;
  };

 public:
  /// Event `event` of the trace whose runs are `runs` has the tag whose
  /// values in `s` are `refs`; `last` holds the refs of the trace's event
  /// before (None, None before its first). Events are noted in order.
  void note(const ValueStore& s, std::vector<TagRun>& runs, size_t event, TagRefs refs, TagRefs* last) {
    if (refs == *last) return;  // the same values: the same tag (most events share both with the one before)
    *last = refs;
    TagText text{text_or_empty(s, refs.compile_context), text_or_empty(s, refs.user_metadata)};
    if (text.compile_context == "N/A") text.compile_context = {};  // PyTorch's "none"
    const uint32_t current = runs.empty() ? 0 : runs.back().tag;
    const EventTag& now = tags_[current];
    if (now.compile_context == text.compile_context && now.user_metadata == text.user_metadata) return;
    runs.push_back(TagRun{event, id_of(text)});
  }
  /// The table, [0] the empty tag; the TagTable is empty afterwards.
  std::vector<EventTag> take() { return std::exchange(tags_, {EventTag{}}); }

 private:
  uint32_t id_of(TagText text) {
    const std::pair<std::string, std::string> key{text.compile_context, text.user_metadata};
    auto it = ids_.find(key);
    if (it != ids_.end()) return it->second;
    const auto id = static_cast<uint32_t>(tags_.size());
    tags_.push_back(EventTag{key.first, key.second});
    ids_.emplace(key, id);
    return id;
  }

  std::vector<EventTag> tags_{EventTag{}};
  std::map<std::pair<std::string, std::string>, uint32_t> ids_{{{"", ""}, 0}};
};

/// Reads one trace event, a dict of the keys of PyTorch's TraceEntry
/// (CUDACachingAllocator.h; torch/cuda/_memory_viz.py reads the same). The
/// one place that says which key sets which TraceEvent field, for both reads:
/// the plain one (Builder) and the streamed one (TraceStream) differ only in
/// how `rules` converts a value and what a bad value does (an error naming its
/// path; giving up, so that a plain read says it). `for_each_pair(fn)` calls
/// fn(Field, ValueRef value) for each key. Rules has action, address, bytes,
/// stream, time_us, device_free and frames (ValueRef -> the field's value)
/// and repeated(Field) for a key given twice (the last value counts). The tag's
/// values go to `tag`.
template <typename Rules, typename ForEachPair>
TraceEvent read_trace_event(Rules& rules, TagRefs* tag, ForEachPair&& for_each_pair) {
  TraceEvent e;
  int64_t device_free = -1;
  uint32_t seen = 0;
  for_each_pair([&](Field f, ValueRef v) {
    switch (f) {
      case kFAction:
        e.action = rules.action(v);
        break;
      case kFAddr:
        e.addr = rules.address(v);
        break;
      case kFSize:
        e.size = rules.bytes(v);
        break;
      case kFStream:
        e.stream = rules.stream(v);
        break;
      case kFTimeUs:
        e.time_us = rules.time_us(v);
        break;
      case kFDeviceFree:
        device_free = rules.device_free(v);
        break;
      case kFFrames:
        e.frames = rules.frames(v);
        break;
      case kFCompileContext:
        tag->compile_context = v;
        break;
      case kFUserMetadata:
        tag->user_metadata = v;
        break;
      default:
        return;  // keys the model does not read
    }
    if (seen & (1u << f)) rules.repeated(f);
    seen |= 1u << f;
  });
  if (e.action == TraceAction::kOom) e.addr = device_free;  // an OOM event's addr is CUDA's free bytes
  return e;
}

/// The ItemSink of load_snapshot (pickle_reader.h): reads each dict of a
/// list under "device_traces" into a TraceEvent while the pickle is read
/// (read_trace_event), so the store never holds the events (~60 bytes an
/// event, then copied into the 32-byte records). An event the plain read
/// would refuse (or that needs more than these rules: a field given twice,
/// > 65535 streams) makes it give up: a plain read then says what is wrong.
/// Frames and streams are numbered later, by the Builder in its reading
/// order, so their ids are a plain read's: until then an event's `frames`
/// holds the frames value's ValueRef bits, `stream` 1 + an index into the
/// trace's stream values (0: no stream key).
class TraceStream : public ItemSink {
 public:
  struct Trace {
    ValueRef list;
    std::vector<TraceEvent> events;
    std::vector<int64_t> streams;                      // stream values, first seen first
    std::unordered_map<int64_t, uint16_t> stream_ids;  // value -> 1 + index in streams
    uint16_t last_stream = 0;
    std::vector<TagRun> tag_runs;  // numbered by TraceStream::tags()
    TagRefs last_tag;              // the last event's, for TagTable::note
    bool saw_time_us = false;
    bool delivered = false;            // moved out by the Builder
    int64_t bytes_left_at_first = -1;  // input left when item 0 was opened
  };

  bool claim(std::string_view key, ValueRef list) override {
    if (key != "device_traces") return false;
    traces_.emplace_back();
    traces_.back().list = list;
    return true;
  }

  void open_item(int64_t bytes_left) override {
    Trace& t = traces_.back();
    if (t.bytes_left_at_first < 0) t.bytes_left_at_first = bytes_left;
    if (t.events.size() == t.events.capacity()) reserve_more(t, bytes_left);
    t.events.emplace_back();
  }

  void set_items(const ValueStore& s, size_t item, const ValueRef* pairs, size_t count) override {
    Trace& t = traces_.back();
    EventRules rules{*this, s, t};
    TagRefs tag;
    t.events[item] = read_trace_event(rules, &tag, [&](auto&& fn) {
      for (size_t i = 0; i + 1 < count; i += 2) fn(fields_.of(s, pairs[i]), pairs[i + 1]);
    });
    tags_.note(s, t.tag_runs, item, tag, &t.last_tag);
  }

  /// The tags of the events streamed so far; the Builder goes on numbering
  /// with it.
  TagTable& tags() { return tags_; }

  /// True once a list was claimed (placeholders may have been made).
  bool claimed_any() const { return !traces_.empty(); }
  /// True once the Builder took a streamed trace.
  bool delivered_any() const {
    for (const Trace& t : traces_) {
      if (t.delivered) return true;
    }
    return false;
  }
  /// The trace read into `list`, or nullptr.
  Trace* find(ValueRef list) {
    for (Trace& t : traces_) {
      if (t.list == list) return &t;
    }
    return nullptr;
  }

 private:
  [[noreturn]] static void give_up() { throw SinkAbandoned("a trace event needs the plain read"); }

  /// read_trace_event's rules for a streamed event: a value the plain read
  /// would refuse gives up. Frames and streams are numbered later, in the
  /// Builder's reading order (see the class comment).
  struct EventRules {
    TraceStream& ts;
    const ValueStore& s;
    Trace& t;

    TraceAction action(ValueRef v) { return ts.action_of(s, v); }
    int64_t address(ValueRef v) { return int_in(s, v, 0, kMaxAddress); }
    int64_t bytes(ValueRef v) { return int_in(s, v, 0, kMaxBytes); }
    uint16_t stream(ValueRef v) { return stream_of(t, int_in(s, v, INT64_MIN, INT64_MAX)); }
    int64_t time_us(ValueRef v) {
      t.saw_time_us = true;
      return int_in(s, v, 0, kMaxTimeUs);
    }
    int64_t device_free(ValueRef v) { return int_in(s, v, INT64_MIN, INT64_MAX); }
    StackId frames(ValueRef v) {
      const ValueKind k = s.kind(v);
      if (k != ValueKind::kNone && k != ValueKind::kList && k != ValueKind::kTuple) give_up();
      return v.bits();  // None is 0: no frames
    }
    /// The plain read would number the first value's frames or stream too.
    [[noreturn]] void repeated(Field) { give_up(); }
  };

  TraceAction action_of(const ValueStore& s, ValueRef v) {
    for (const auto& [bits, action] : action_cache_) {
      if (bits == v.bits()) return action;
    }
    const ValueKind k = s.kind(v);
    if (k != ValueKind::kString && k != ValueKind::kBytes) give_up();
    const TraceAction a = action_named(s.as_text(v));
    if (action_cache_.size() < 64) action_cache_.emplace_back(v.bits(), a);
    return a;
  }

  static int64_t int_in(const ValueStore& s, ValueRef v, int64_t lo, int64_t hi) {
    const ValueKind k = s.kind(v);
    if (k != ValueKind::kInt && k != ValueKind::kBool) give_up();
    const int64_t n = s.as_int(v);
    if (n < lo || n > hi) give_up();
    return n;
  }

  static uint16_t stream_of(Trace& t, int64_t stream) {
    if (t.last_stream != 0 && t.streams[t.last_stream - 1u] == stream) return t.last_stream;
    auto it = t.stream_ids.find(stream);
    if (it != t.stream_ids.end()) return t.last_stream = it->second;
    if (t.streams.size() >= UINT16_MAX - 1) give_up();  // the plain read shares the last index past 65535
    t.streams.push_back(stream);
    t.stream_ids.emplace(stream, static_cast<uint16_t>(t.streams.size()));
    return t.last_stream = static_cast<uint16_t>(t.streams.size());
  }

  /// Room for the rest of the trace at once, at the input rate of its items
  /// so far plus a quarter: growing by doubling would copy the events and
  /// touch twice the memory. Reserved pages never written cost nothing.
  static void reserve_more(Trace& t, int64_t bytes_left) {
    const size_t n = t.events.size();
    double want = std::max<double>(4096, 2.0 * static_cast<double>(n));
    const int64_t used = t.bytes_left_at_first - bytes_left;
    if (n >= 4096 && used > 0) {
      const double rest = 1.25 * static_cast<double>(bytes_left) * static_cast<double>(n) / static_cast<double>(used);
      want = std::max(want, static_cast<double>(n) + rest);
    }
    want = std::min(want, static_cast<double>(n) + static_cast<double>(bytes_left) + 1);  // >= 1 byte an item
    t.events.reserve(static_cast<size_t>(want));
    advise_huge_pages(t.events.data(), t.events.capacity() * sizeof(TraceEvent));
  }

  FieldCache fields_;
  std::vector<std::pair<uint32_t, TraceAction>> action_cache_;
  std::vector<Trace> traces_;
  TagTable tags_;
};

class Builder {
 public:
  /// `stream`: the sink the pickle was read with, if any (its traces replace
  /// the lists it took).
  Builder(const ValueStore& store, std::string name, TraceStream* stream = nullptr)
      : s_(store), name_(std::move(name)), stream_(stream) {
    out_.frames.reserve(64);
    out_.stacks.push_back({});
  }

  Snapshot build(ValueRef root) {
    const Path top;
    const ValueKind kind = s_.kind(root);
    if (kind == ValueKind::kList) {  // 1.13: torch.cuda.memory_snapshot()
      out_.layout = SnapshotLayout::kV1_13;
      read_segments(root, top.child("<segments>"));
      return std::move(out_);
    }
    if (kind != ValueKind::kDict) {
      fail(top, fmt::format("expected a dict with 'segments' (a memory snapshot), got {}", kind_name(kind)));
    }
    bool have_segments = false;
    bool have_settings = false;
    bool have_annotations = false;
    s_.for_each_pair(root, [&](ValueRef k, ValueRef v) {
      const std::string_view key = s_.as_text(k);
      if (key == "segments") {
        have_segments = true;
        read_segments(v, top.child("segments"));
      } else if (key == "device_traces") {
        read_traces(v, top.child("device_traces"));
      } else if (key == "allocator_settings") {
        have_settings = s_.kind(v) != ValueKind::kNone;
        read_settings(v, top.child("allocator_settings"));
      } else if (key == "external_annotations") {
        have_annotations = true;
        if (s_.kind(v) == ValueKind::kList) {
          out_.external_annotations = static_cast<int64_t>(s_.size(v));
          read_annotations(v, top.child("external_annotations"));
        }
      }
    });
    if (!have_segments) {
      fail(top, "no 'segments' key: not a memory snapshot (expected what torch.cuda.memory._dump_snapshot writes)");
    }
    if (have_annotations) {
      out_.layout = SnapshotLayout::kV2_5;
    } else if (have_settings) {
      out_.layout = SnapshotLayout::kV2_4;
    } else if (saw_time_us_) {
      out_.layout = SnapshotLayout::kV2_2;
    } else if (saw_history_ || !saw_block_address_) {
      out_.layout = SnapshotLayout::kV2_0;
    } else {
      out_.layout = SnapshotLayout::kV2_1;
    }
    for (auto& trace : out_.device_traces) {
      if (read_completions_as_requests(trace)) out_.free_requested_skipped = true;
    }
    out_.event_tags = tags().take();
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const Path& path, const std::string& what) const {
    const std::string where = path.str();
    throw SnapshotError(fmt::format("{}: {}{}", name_, where.empty() ? "" : where + ": ", what));
  }

  [[noreturn]] void wrong_type(const Path& path, const char* expected, ValueRef v) const {
    fail(path, fmt::format("expected {}, got {}", expected, kind_name(s_.kind(v))));
  }

  Field field_of(ValueRef key) { return fields_.of(s_, key); }

  int64_t to_int(ValueRef v, const Path& path) const {
    const ValueKind k = s_.kind(v);
    if (k == ValueKind::kInt || k == ValueKind::kBool) return s_.as_int(v);
    wrong_type(path, "int", v);
  }

  /// A byte count: 0 <= v <= 2^52 (4 PiB), so sums and ends never overflow.
  int64_t to_bytes(ValueRef v, const Path& path) const {
    const int64_t n = to_int(v, path);
    if (n < 0 || n > kMaxBytes) fail(path, fmt::format("expected a size of 0 to 2^52 bytes, got {}", n));
    return n;
  }

  /// A device address: 0 <= v <= 2^60.
  int64_t to_address(ValueRef v, const Path& path) const {
    const int64_t n = to_int(v, path);
    if (n < 0 || n > kMaxAddress) fail(path, fmt::format("expected an address of 0 to 2^60, got {}", n));
    return n;
  }

  bool to_bool(ValueRef v, const Path& path) const {
    const ValueKind k = s_.kind(v);
    if (k == ValueKind::kBool || k == ValueKind::kInt) return s_.as_int(v) != 0;
    wrong_type(path, "bool", v);
  }

  std::string_view to_text(ValueRef v, const Path& path) const {
    const ValueKind k = s_.kind(v);
    if (k == ValueKind::kString || k == ValueKind::kBytes) return s_.as_text(v);
    wrong_type(path, "str", v);
  }

  void expect(ValueRef v, ValueKind kind, const Path& path) const {
    if (s_.kind(v) != kind) wrong_type(path, kind_name(kind), v);
  }

  void expect_sequence(ValueRef v, const Path& path) const {
    const ValueKind k = s_.kind(v);
    if (k != ValueKind::kList && k != ValueKind::kTuple) wrong_type(path, "list", v);
  }

  // Marks with a time; anything else in an entry (other metadata, an entry
  // that is not a dict) is not ours to judge and is skipped.
  void read_annotations(ValueRef list, const Path& path) {
    int64_t i = 0;
    s_.for_each_item(list, [&](ValueRef entry) {
      const Path at = path.item(i++);
      if (s_.kind(entry) != ValueKind::kDict) return;
      Annotation a;
      bool timed = false;
      s_.for_each_pair(entry, [&](ValueRef k, ValueRef v) {
        const ValueKind key_kind = s_.kind(k);
        if (key_kind != ValueKind::kString && key_kind != ValueKind::kBytes) return;
        const std::string_view key = s_.as_text(k);
        const ValueKind kind = s_.kind(v);
        const bool text = kind == ValueKind::kString || kind == ValueKind::kBytes;
        if (key == "name" && text) {
          a.name = std::string(s_.as_text(v));
        } else if (key == "stage" && text) {
          a.stage = std::string(s_.as_text(v));
        } else if (key == "device") {
          a.device = to_int(v, at.child("device"));
        } else if (key == "time_us") {
          a.time_us = to_int(v, at.child("time_us"));
          timed = true;
        }
      });
      if (timed) out_.annotations.push_back(std::move(a));
    });
  }

  uint32_t intern_frame(ValueRef frame, const Path& path) {
    auto cached = frame_cache_.find(frame.bits());
    if (cached != frame_cache_.end()) return cached->second;
    expect(frame, ValueKind::kDict, path);
    Frame f;
    std::string_view fx_trace;
    s_.for_each_pair(frame, [&](ValueRef k, ValueRef v) {
      switch (field_of(k)) {
        case kFFilename:
          f.filename = std::string(to_text(v, path.child("filename")));
          break;
        case kFName:
          f.name = std::string(to_text(v, path.child("name")));
          break;
        case kFLine:
          f.line = to_int(v, path.child("line"));
          break;
        case kFFxOriginalTrace:
          fx_trace = to_text(v, path.child("fx_original_trace"));
          break;
        default:
          break;
      }
    });
    const uint32_t id = intern_frame_content(std::move(f));
    if (!fx_trace.empty() && fx_source_.count(id) == 0) {
      std::vector<uint32_t> source;
      for (Frame& original : frames_of_fx_trace(fx_trace)) source.push_back(intern_frame_content(std::move(original)));
      if (!source.empty()) {
        fx_source_.emplace(id, std::move(source));
        ++out_.fx_traced_frames;
      }
    }
    frame_cache_.emplace(frame.bits(), id);
    return id;
  }

  /// The index of a frame equal to `f` in out_.frames, added when new.
  uint32_t intern_frame_content(Frame f) {
    std::string key = fmt::format("{}\n{}\n{}", f.filename, f.name, f.line);
    auto [it, inserted] = frame_by_content_.emplace(std::move(key), static_cast<uint32_t>(out_.frames.size()));
    if (inserted) out_.frames.push_back(std::move(f));
    return it->second;
  }

  StackId intern_stack(ValueRef frames, const Path& path) {
    if (s_.kind(frames) == ValueKind::kNone) return 0;
    expect_sequence(frames, path);
    // PyTorch writes one frames list per allocation, so caching by list
    // identity would grow by one entry per event: cache by content instead
    // (lists with equal items share their run in the store, items_key), in
    // a fixed direct-mapped table; a miss only costs the interning below.
    uint64_t key = 0;
    if (!s_.items_key(frames, &key)) key = uint64_t{0xFFFFFFFF} << 32 | frames.bits();
    StackCacheEntry& entry = stack_cache_[(key * 0x9E3779B97F4A7C15ull) >> (64 - kStackCacheBits)];
    if (entry.valid && entry.key == key) return entry.stack;
    std::vector<uint32_t>& ids = stack_ids_;
    ids.clear();
    int64_t i = 0;
    s_.for_each_item(frames, [&](ValueRef f) {
      const uint32_t id = intern_frame(f, path.item(i++));
      ids.push_back(id);
      // An FX node's model source, innermost first, right outside its generated frame (fx_trace.h).
      if (!fx_source_.empty()) {
        auto source = fx_source_.find(id);
        if (source != fx_source_.end()) ids.insert(ids.end(), source->second.begin(), source->second.end());
      }
    });
    StackId id = 0;
    if (!ids.empty()) {
      std::string content(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint32_t));
      auto [it, inserted] = stack_by_content_.emplace(std::move(content), static_cast<StackId>(out_.stacks.size()));
      if (inserted) out_.stacks.push_back(ids);
      id = it->second;
    }
    entry = StackCacheEntry{key, id, true};
    return id;
  }

  BlockState to_state(ValueRef v, const Path& path) const {
    const std::string_view t = to_text(v, path);
    if (t == "active_allocated") return BlockState::kActiveAllocated;
    if (t == "active_pending_free" || t == "active_awaiting_free") return BlockState::kActivePendingFree;
    if (t == "inactive") return BlockState::kInactive;
    fail(path, fmt::format("expected 'active_allocated', 'active_pending_free' or 'inactive', got '{}'",
                           std::string(t.substr(0, 60))));
  }

  void read_segments(ValueRef list, const Path& path) {
    expect_sequence(list, path);
    out_.segments.reserve(s_.size(list));
    int64_t i = 0;
    s_.for_each_item(list, [&](ValueRef seg) { read_segment(seg, path.item(i++)); });
  }

  void read_segment(ValueRef v, const Path& path) {
    expect(v, ValueKind::kDict, path);
    Segment seg;
    ValueRef blocks;
    bool have_blocks = false;
    bool have_allocated = false;
    s_.for_each_pair(v, [&](ValueRef k, ValueRef val) {
      const Field f = field_of(k);
      switch (f) {
        case kFDevice:
          seg.device = to_int(val, path.child("device"));
          break;
        case kFAddress:
          seg.address = to_address(val, path.child("address"));
          break;
        case kFTotalSize:
          seg.total_size = to_bytes(val, path.child("total_size"));
          break;
        case kFAllocatedSize:
          seg.allocated_size = to_bytes(val, path.child("allocated_size"));
          have_allocated = true;
          break;
        case kFActiveSize:
          seg.active_size = to_bytes(val, path.child("active_size"));
          break;
        case kFRequestedSize:
          seg.requested_size = to_bytes(val, path.child("requested_size"));
          break;
        case kFStream:
          seg.stream = to_int(val, path.child("stream"));
          break;
        case kFSegmentType:
          seg.is_large = to_text(val, path.child("segment_type")) != "small";
          break;
        case kFSegmentPoolId: {
          const Path p = path.child("segment_pool_id");
          expect_sequence(val, p);
          int64_t j = 0;
          s_.for_each_item(val, [&](ValueRef x) {
            const int64_t n = to_int(x, p.item(j));
            if (j == 0) seg.pool_id.first = n;
            if (j == 1) seg.pool_id.second = n;
            ++j;
          });
          break;
        }
        case kFIsExpandable:
          seg.is_expandable = to_bool(val, path.child("is_expandable"));
          break;
        case kFFrames:
          seg.frames = intern_stack(val, path.child("frames"));
          if (seg.frames != 0) out_.has_block_frames = true;
          break;
        case kFBlocks:
          blocks = val;
          have_blocks = true;
          break;
        default:
          break;
      }
    });
    if (have_blocks) {
      const Path bp = path.child("blocks");
      expect_sequence(blocks, bp);
      seg.blocks.reserve(s_.size(blocks));
      int64_t j = 0;
      int64_t next_address = seg.address;
      s_.for_each_item(blocks, [&](ValueRef b) {
        Block block = read_block(b, bp.item(j++), next_address);
        next_address = block.address + block.size;
        seg.blocks.push_back(block);
      });
    }
    if (!have_allocated) {
      for (const Block& b : seg.blocks) {
        if (b.state == BlockState::kActiveAllocated) seg.allocated_size += b.size;
      }
    }
    out_.segments.push_back(std::move(seg));
  }

  Block read_block(ValueRef v, const Path& path, int64_t default_address) {
    expect(v, ValueKind::kDict, path);
    Block b;
    b.address = default_address;  // 2.0 and older: blocks follow each other
    bool have_requested = false;
    s_.for_each_pair(v, [&](ValueRef k, ValueRef val) {
      switch (field_of(k)) {
        case kFAddress:
          b.address = to_address(val, path.child("address"));
          saw_block_address_ = true;
          break;
        case kFSize:
          b.size = to_bytes(val, path.child("size"));
          break;
        case kFRequestedSize:
          b.requested_size = to_bytes(val, path.child("requested_size"));
          have_requested = true;
          break;
        case kFState:
          b.state = to_state(val, path.child("state"));
          break;
        case kFFrames:
          b.frames = intern_stack(val, path.child("frames"));
          if (b.frames != 0) out_.has_block_frames = true;
          break;
        case kFHistory: {
          // 2.0: [{addr, real_size, frames}], most recent allocation first.
          saw_history_ = true;
          const Path hp = path.child("history");
          expect_sequence(val, hp);
          bool first = true;
          int64_t j = 0;
          s_.for_each_item(val, [&](ValueRef h) {
            const Path p = hp.item(j++);
            expect(h, ValueKind::kDict, p);
            if (!first) return;
            first = false;
            s_.for_each_pair(h, [&](ValueRef hk, ValueRef hv) {
              const Field f = field_of(hk);
              if (f == kFRealSize && !have_requested) b.requested_size = to_bytes(hv, p.child("real_size"));
              if (f == kFFrames) {
                b.frames = intern_stack(hv, p.child("frames"));
                if (b.frames != 0) out_.has_block_frames = true;
              }
            });
          });
          break;
        }
        default:
          break;
      }
    });
    if (b.size < 0) fail(path.child("size"), fmt::format("expected a size >= 0, got {}", b.size));
    if (!have_requested && b.requested_size == 0) b.requested_size = b.size;
    return b;
  }

  void read_traces(ValueRef list, const Path& path) {
    if (s_.kind(list) == ValueKind::kNone) return;
    expect_sequence(list, path);
    int64_t d = 0;
    s_.for_each_item(list, [&](ValueRef trace) {
      const Path tp = path.item(d++);
      expect_sequence(trace, tp);
      if (s_.is_taken(trace)) {
        out_.device_traces.push_back(streamed_trace(trace, tp));
        return;
      }
      std::vector<TraceEvent> events;
      std::vector<TagRun> runs;
      TagRefs last_tag;
      events.reserve(s_.size(trace));
      advise_huge_pages(events.data(), events.capacity() * sizeof(TraceEvent));
      s_.for_each_item(trace, [&](ValueRef e) {
        TagRefs tag;
        events.push_back(read_event(e, tp.item(static_cast<int64_t>(events.size())), &tag));
        tags().note(s_, runs, events.size() - 1, tag, &last_tag);
      });
      out_.device_traces.push_back(std::move(events));
      out_.tag_runs.push_back(std::move(runs));
    });
  }

  /// A trace the TraceStream read while the pickle was read: its frames and
  /// streams are numbered here, event by event, as read_event numbers them.
  std::vector<TraceEvent> streamed_trace(ValueRef list, const Path& path) {
    TraceStream::Trace* t = stream_ != nullptr ? stream_->find(list) : nullptr;
    if (t == nullptr || t->delivered || t->events.size() != s_.size(list)) {
      throw SinkAbandoned("a streamed trace listed twice");  // load_snapshot reads plainly
    }
    t->delivered = true;
    std::vector<TraceEvent> events = std::move(t->events);
    out_.tag_runs.push_back(std::move(t->tag_runs));
    if (t->saw_time_us) saw_time_us_ = true;
    for (size_t i = 0; i < events.size(); ++i) {
      TraceEvent& e = events[i];
      if (e.frames != 0) {
        e.frames = intern_stack(ValueRef::from_bits(e.frames), path.item(static_cast<int64_t>(i)).child("frames"));
      }
      if (e.stream != 0) e.stream = stream_index(t->streams[e.stream - 1u]);
    }
    return events;
  }

  TraceAction to_action(ValueRef v, const Path& path) {
    for (const auto& [bits, action] : action_cache_) {
      if (bits == v.bits()) return action;
    }
    const TraceAction a = action_named(to_text(v, path));
    if (action_cache_.size() < 64) action_cache_.emplace_back(v.bits(), a);
    return a;
  }

  uint16_t stream_index(int64_t stream) {
    if (!out_.streams.empty() && out_.streams[last_stream_] == stream) return last_stream_;
    auto it = stream_ids_.find(stream);
    if (it != stream_ids_.end()) return last_stream_ = it->second;
    if (out_.streams.size() < UINT16_MAX) {
      out_.streams.push_back(stream);
      stream_ids_.emplace(stream, static_cast<uint16_t>(out_.streams.size() - 1));
    }
    return last_stream_ = static_cast<uint16_t>(out_.streams.size() - 1);
  }

  /// read_trace_event's rules for a plain read: a bad value is an error
  /// naming its path; frames and streams are numbered as they are read.
  struct EventRules {
    Builder& b;
    const Path& path;

    TraceAction action(ValueRef v) { return b.to_action(v, path.child("action")); }
    int64_t address(ValueRef v) { return b.to_address(v, path.child("addr")); }
    int64_t bytes(ValueRef v) { return b.to_bytes(v, path.child("size")); }
    uint16_t stream(ValueRef v) { return b.stream_index(b.to_int(v, path.child("stream"))); }
    int64_t time_us(ValueRef v) {
      const int64_t n = b.to_int(v, path.child("time_us"));
      if (n < 0 || n > kMaxTimeUs) {
        b.fail(path.child("time_us"), fmt::format("expected 0 to 2^62 microseconds, got {}", n));
      }
      b.saw_time_us_ = true;
      return n;
    }
    int64_t device_free(ValueRef v) { return b.to_int(v, path.child("device_free")); }
    StackId frames(ValueRef v) { return b.intern_stack(v, path.child("frames")); }
    void repeated(Field) {}
  };

  TraceEvent read_event(ValueRef v, const Path& path, TagRefs* tag) {
    expect(v, ValueKind::kDict, path);
    EventRules rules{*this, path};
    return read_trace_event(
        rules, tag, [&](auto&& fn) { s_.for_each_pair(v, [&](ValueRef k, ValueRef val) { fn(field_of(k), val); }); });
  }

  /// The stream's table when there is one (its traces were numbered there).
  TagTable& tags() { return stream_ != nullptr ? stream_->tags() : own_tags_; }

  /// roundup_power2_divisions entry: 0 (off) or a power of two up to 2^16
  /// (AllocatorConfig.cpp requires a power of two).
  int64_t to_divisions(ValueRef v, const Path& path) const {
    const int64_t n = to_int(v, path);
    if (n < 0 || n > (int64_t{1} << 16) || (n & (n - 1)) != 0) {
      fail(path, fmt::format("expected 0 or a power of two up to 65536, got {}", n));
    }
    return n;
  }

  void read_settings(ValueRef v, const Path& path) {
    if (s_.kind(v) == ValueKind::kNone) return;
    expect(v, ValueKind::kDict, path);
    AllocatorSettings& a = out_.allocator_settings;
    a.present = true;
    s_.for_each_pair(v, [&](ValueRef k, ValueRef val) {
      const std::string_view key = s_.as_text(k);
      if (key == "PYTORCH_CUDA_ALLOC_CONF" || key == "PYTORCH_ALLOC_CONF") {
        if (s_.kind(val) != ValueKind::kNone) a.conf = std::string(to_text(val, path.child(key)));
      } else if (key == "max_split_size") {
        a.max_split_size = to_int(val, path.child(key));
        if (a.max_split_size > kMaxBytes) a.max_split_size = -1;
      } else if (key == "garbage_collection_threshold") {
        const ValueKind kind = s_.kind(val);
        if (kind != ValueKind::kFloat && kind != ValueKind::kInt) wrong_type(path.child(key), "float", val);
        a.garbage_collection_threshold = s_.as_float(val);
      } else if (key == "expandable_segments") {
        a.expandable_segments = to_bool(val, path.child(key));
      } else if (key == "roundup_power2_divisions") {
        const Path p = path.child(key);
        if (s_.kind(val) == ValueKind::kDict) {
          // {"1": d, "2": d, "4": d, ...}: interval i has key 2^i.
          s_.for_each_pair(val, [&](ValueRef dk, ValueRef dv) {
            const std::string_view text = s_.as_text(dk);
            int64_t n = 0;
            for (char c : text) n = (c >= '0' && c <= '9' && n < (int64_t{1} << 40)) ? n * 10 + (c - '0') : -1;
            int index = 0;
            while (index < 16 && (int64_t{1} << index) != n) ++index;
            if (index < 16) a.roundup_power2_divisions[static_cast<size_t>(index)] = to_divisions(dv, p.child(text));
          });
        } else if (s_.kind(val) == ValueKind::kList) {
          size_t index = 0;
          s_.for_each_item(val, [&](ValueRef dv) {
            if (index < 16) a.roundup_power2_divisions[index] = to_divisions(dv, p.item(static_cast<int64_t>(index)));
            ++index;
          });
        }
      }
    });
  }

  const ValueStore& s_;
  std::string name_;
  TraceStream* stream_ = nullptr;
  Snapshot out_;
  FieldCache fields_;
  std::vector<std::pair<uint32_t, TraceAction>> action_cache_;
  std::unordered_map<uint32_t, uint32_t> frame_cache_;
  std::unordered_map<std::string, uint32_t> frame_by_content_;
  std::unordered_map<uint32_t, std::vector<uint32_t>> fx_source_;  // generated frame -> its model source's frames
  struct StackCacheEntry {
    uint64_t key = 0;
    StackId stack = 0;
    bool valid = false;
  };
  static constexpr int kStackCacheBits = 12;
  std::vector<StackCacheEntry> stack_cache_ = std::vector<StackCacheEntry>(size_t{1} << kStackCacheBits);
  std::vector<uint32_t> stack_ids_;  // scratch for intern_stack
  std::unordered_map<std::string, StackId> stack_by_content_;
  uint16_t last_stream_ = 0;
  std::unordered_map<int64_t, uint16_t> stream_ids_;
  bool saw_history_ = false;
  bool saw_block_address_ = false;
  bool saw_time_us_ = false;
  TagTable own_tags_;  // without a stream
};

}  // namespace

uint32_t Snapshot::tag_of(size_t device, size_t event) const {
  if (device >= tag_runs.size()) return 0;
  const std::vector<TagRun>& runs = tag_runs[device];
  auto after = std::upper_bound(runs.begin(), runs.end(), event,
                                [](size_t e, const TagRun& run) { return e < run.first_event; });
  return after == runs.begin() ? 0 : std::prev(after)->tag;
}

const char* action_name(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc:
      return "alloc";
    case TraceAction::kFreeRequested:
      return "free_requested";
    case TraceAction::kFreeCompleted:
      return "free_completed";
    case TraceAction::kSegmentAlloc:
      return "segment_alloc";
    case TraceAction::kSegmentFree:
      return "segment_free";
    case TraceAction::kSegmentMap:
      return "segment_map";
    case TraceAction::kSegmentUnmap:
      return "segment_unmap";
    case TraceAction::kOom:
      return "oom";
    case TraceAction::kSnapshot:
      return "snapshot";
    case TraceAction::kOther:
      return "other";
  }
  return "other";
}

bool records_free_completed(const std::vector<TraceEvent>& trace) {
  return std::any_of(trace.begin(), trace.end(),
                     [](const TraceEvent& e) { return e.action == TraceAction::kFreeCompleted; });
}

const char* layout_name(SnapshotLayout layout) {
  switch (layout) {
    case SnapshotLayout::kV1_13:
      return "segment list (torch.cuda.memory_snapshot(), any version)";
    case SnapshotLayout::kV2_0:
      return "PyTorch 2.0 (block history)";
    case SnapshotLayout::kV2_1:
      return "PyTorch 2.1 (block frames, no time_us)";
    case SnapshotLayout::kV2_2:
      return "PyTorch 2.2-2.3 (time_us, no allocator_settings)";
    case SnapshotLayout::kV2_4:
      return "PyTorch 2.4 (allocator_settings)";
    case SnapshotLayout::kV2_5:
      return "PyTorch 2.5+ (external_annotations)";
  }
  return "?";
}

Snapshot snapshot_from_pickle(const ValueStore& store, ValueRef root, const std::string& name) {
  return Builder(store, name).build(root);
}

namespace {

/// Reads with a TraceStream; when streaming gives up, or anything fails once
/// it claimed a list, reads again without it, so that the result and every
/// error message are exactly those of a plain read. `read(sink)` reads the
/// pickle.
template <typename Read>
Snapshot load_streamed(const Read& read, const std::string& name, bool* streamed) {
  {
    TraceStream stream;
    try {
      Snapshot snapshot;
      {
        PickleDocument doc = read(&stream);
        snapshot = Builder(doc.store, name, &stream).build(doc.root);
        snapshot.file_bytes = doc.bytes_read;
      }  // the value tree is freed here, before any analysis
      if (streamed != nullptr) *streamed = stream.delivered_any();
      return snapshot;
    } catch (const SinkAbandoned&) {
    } catch (const NotInStore&) {  // a taken list read as stored
    } catch (const SnapshotError&) {
      // Without a claimed list the read was a plain one. With one, the plain
      // read names the error (a store limit, say, falls at another byte).
      if (!stream.claimed_any()) throw;
    }
  }  // what the stream read is freed before reading again
  if (streamed != nullptr) *streamed = false;
  Snapshot snapshot;
  {
    PickleDocument doc = read(nullptr);
    snapshot = snapshot_from_pickle(doc.store, doc.root, name);
    snapshot.file_bytes = doc.bytes_read;
  }
  return snapshot;
}

}  // namespace

Snapshot load_snapshot(const std::string& path) {
  return load_streamed([&](ItemSink* sink) { return read_pickle_file(path, sink); }, path, nullptr);
}

Snapshot load_snapshot_bytes(std::string_view bytes, const std::string& name, bool* streamed) {
  return load_streamed([&](ItemSink* sink) { return read_pickle_bytes(bytes, name, sink); }, name, streamed);
}

}  // namespace oomtune::diagnose
