#include "diagnose/event_tags.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

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

TagPresence tags_in_trace(const Snapshot& snapshot, int device) {
  TagPresence p;
  if (device < 0 || static_cast<size_t>(device) >= snapshot.tag_runs.size()) return p;
  for (const TagRun& run : snapshot.tag_runs[static_cast<size_t>(device)]) {
    const EventTag& tag = snapshot.event_tags[run.tag];
    p.user_metadata = p.user_metadata || !tag.user_metadata.empty();
    p.compile_contexts = p.compile_contexts || !tag.compile_context.empty();
  }
  return p;
}

TaggedBytes tagged_bytes_now(const Replay& replay, const Snapshot& snapshot, int device, TagPresence present, int top) {
  TaggedBytes out;
  if (!present.user_metadata && !present.compile_contexts) return out;
  std::map<std::string, TagBytes> metadata, contexts;
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
      continue;
    }
    const EventTag& tag =
        snapshot.event_tags[snapshot.tag_of(static_cast<size_t>(device), static_cast<size_t>(block.alloc_event))];
    if (present.user_metadata) add(metadata, tag.user_metadata.empty() ? kNoTag : tag.user_metadata, block.size);
    if (present.compile_contexts) add(contexts, tag.compile_context.empty() ? kNoTag : tag.compile_context, block.size);
  }
  out.user_metadata = biggest_first(std::move(metadata), top);
  out.compile_contexts = biggest_first(std::move(contexts), top);
  return out;
}

}  // namespace oomtune::diagnose
