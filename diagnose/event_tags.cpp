#include "diagnose/event_tags.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "diagnose/phase_marks.h"

namespace oomtune::diagnose {
namespace {

std::vector<TagBytes> biggest_first(std::map<std::string, TagBytes> by_text, int top) {
  std::vector<TagBytes> out;
  for (auto& [text, bytes] : by_text) out.push_back(std::move(bytes));
  std::stable_sort(out.begin(), out.end(), [](const TagBytes& a, const TagBytes& b) { return a.bytes > b.bytes; });
  const size_t keep = static_cast<size_t>(std::max(top, 1));
  if (out.size() > keep + 1) {
    TagBytes rest{fmt::format("({} more)", out.size() - keep), 0, 0};
    for (size_t i = keep; i < out.size(); ++i) {
      rest.bytes += out[i].bytes;
      rest.blocks += out[i].blocks;
    }
    out.resize(keep);
    out.push_back(std::move(rest));
  }
  return out;
}

}  // namespace

RecordFunctions::RecordFunctions(const Snapshot& snapshot, int device) : snapshot_(snapshot), device_(device) {
  if (device < 0 || static_cast<size_t>(device) >= snapshot.device_traces.size()) return;
  const std::vector<TraceEvent>& trace = snapshot.device_traces[static_cast<size_t>(device)];
  for (const Annotation& a : snapshot.annotations) {
    if (a.device != device || a.name.empty() || a.time_us <= 0 || is_framework_mark(a.name)) continue;
    if (a.stage == "START" || a.stage == "END") marks_.push_back(&a);
  }
  std::stable_sort(marks_.begin(), marks_.end(),
                   [](const Annotation* a, const Annotation* b) { return a->time_us < b->time_us; });
  const std::vector<const Annotation*>& all = marks_;
  if (all.empty() || trace.empty() || trace.front().time_us <= 0) return;
  std::vector<uint32_t> open;  // indices into names_
  std::unordered_map<std::string, uint32_t> ids;
  auto id_of = [&](const std::string& name) {
    auto [it, added] = ids.emplace(name, static_cast<uint32_t>(names_.size()));
    if (added) names_.push_back(name);
    return it->second;
  };
  size_t next = 0;
  uint32_t current = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    for (; next < all.size() && all[next]->time_us <= trace[i].time_us; ++next) {
      const uint32_t id = id_of(all[next]->name);
      if (all[next]->stage == "START") {
        open.push_back(id);
      } else if (auto it = std::find(open.rbegin(), open.rend(), id); it != open.rend()) {
        open.erase(std::next(it).base());
      }
    }
    const uint32_t innermost = open.empty() ? 0 : open.back();
    if (innermost != current) {
      runs_.push_back(TagRun{i, innermost});
      current = innermost;
    }
  }
}

const std::string& RecordFunctions::innermost_at(size_t event) const {
  auto after = std::upper_bound(runs_.begin(), runs_.end(), event,
                                [](size_t e, const TagRun& run) { return e < run.first_event; });
  return names_[after == runs_.begin() ? 0 : std::prev(after)->tag];
}

std::vector<std::string> RecordFunctions::open_at(size_t event) const {
  std::vector<std::string> open;
  const std::vector<TraceEvent>& trace = snapshot_.device_traces[static_cast<size_t>(device_)];
  if (!any() || event >= trace.size()) return open;
  for (const Annotation* a : marks_) {
    if (a->time_us > trace[event].time_us) break;
    if (a->stage == "START") {
      open.push_back(a->name);
    } else if (auto it = std::find(open.rbegin(), open.rend(), a->name); it != open.rend()) {
      open.erase(std::next(it).base());
    }
  }
  return open;
}

TagPresence tags_in_trace(const Snapshot& snapshot, int device, const RecordFunctions& marks) {
  TagPresence p;
  p.record_functions = marks.any();
  if (device < 0 || static_cast<size_t>(device) >= snapshot.tag_runs.size()) return p;
  for (const TagRun& run : snapshot.tag_runs[static_cast<size_t>(device)]) {
    const EventTag& tag = snapshot.event_tags[run.tag];
    p.user_metadata = p.user_metadata || !tag.user_metadata.empty();
    p.compile_contexts = p.compile_contexts || !tag.compile_context.empty();
  }
  return p;
}

TaggedBytes tagged_bytes_now(const Replay& replay, const Snapshot& snapshot, int device, const RecordFunctions& marks,
                             TagPresence present, int top) {
  TaggedBytes out;
  if (!present.user_metadata && !present.compile_contexts && !present.record_functions) return out;
  std::map<std::string, TagBytes> metadata, contexts, functions;
  auto add = [](std::map<std::string, TagBytes>& to, const std::string& text, int64_t bytes) {
    TagBytes& slot = to[text];
    slot.tag = text;
    slot.bytes += bytes;
    slot.blocks += 1;
  };
  for (const auto& [addr, block] : replay.live()) {
    if (!block.allocated) continue;
    if (block.alloc_event < 0) {
      if (present.user_metadata) add(metadata, kBeforeRecording, block.size);
      if (present.compile_contexts) add(contexts, kBeforeRecording, block.size);
      if (present.record_functions) add(functions, kBeforeRecording, block.size);
      continue;
    }
    if (present.record_functions) {
      const std::string& name = marks.innermost_at(static_cast<size_t>(block.alloc_event));
      add(functions, name.empty() ? kNoTag : name, block.size);
    }
    const EventTag& tag =
        snapshot.event_tags[snapshot.tag_of(static_cast<size_t>(device), static_cast<size_t>(block.alloc_event))];
    if (present.user_metadata) add(metadata, tag.user_metadata.empty() ? kNoTag : tag.user_metadata, block.size);
    if (present.compile_contexts) add(contexts, tag.compile_context.empty() ? kNoTag : tag.compile_context, block.size);
  }
  out.user_metadata = biggest_first(std::move(metadata), top);
  out.compile_contexts = biggest_first(std::move(contexts), top);
  out.record_functions = biggest_first(std::move(functions), top);
  return out;
}

}  // namespace oomtune::diagnose
