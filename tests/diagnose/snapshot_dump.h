#pragma once
// Every field of a Snapshot as text, so tests (and the fuzzer) can check
// that two ways of reading a pickle give the same model, and show where
// they differ.

#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "diagnose/snapshot.h"

namespace oomtune::diagnose::testing {

/// One line per record: layout, settings, frames, stacks, streams, segments
/// with their blocks, every trace event, then the events' tags and their runs.
inline std::string snapshot_dump(const Snapshot& s) {
  std::string out = fmt::format(
      "layout {} annotations {} block_frames {} fx_traced_frames {} free_requested_skipped {} file_bytes {}\n",
      static_cast<int>(s.layout), s.external_annotations, s.has_block_frames, s.fx_traced_frames,
      s.free_requested_skipped, s.file_bytes);
  const AllocatorSettings& a = s.allocator_settings;
  out += fmt::format("settings {} '{}' {} {} {} [{}]\n", a.present, a.conf, a.max_split_size,
                     a.garbage_collection_threshold, a.expandable_segments, fmt::join(a.roundup_power2_divisions, " "));
  for (const Frame& f : s.frames) out += fmt::format("frame {} {} {}\n", f.filename, f.name, f.line);
  for (const auto& stack : s.stacks) out += fmt::format("stack [{}]\n", fmt::join(stack, " "));
  out += fmt::format("streams [{}]\n", fmt::join(s.streams, " "));
  for (const Segment& g : s.segments) {
    out += fmt::format("segment {} {} {} {} {} {} {} {} ({} {}) {} {}\n", g.device, g.address, g.total_size,
                       g.allocated_size, g.active_size, g.requested_size, g.stream, g.is_large, g.pool_id.first,
                       g.pool_id.second, g.is_expandable, g.frames);
    for (const Block& b : g.blocks) {
      out += fmt::format("  block {} {} {} {} {}\n", b.address, b.size, b.requested_size, static_cast<int>(b.state),
                         b.frames);
    }
  }
  for (size_t d = 0; d < s.device_traces.size(); ++d) {
    out += fmt::format("trace {}: {} events\n", d, s.device_traces[d].size());
    for (const TraceEvent& e : s.device_traces[d]) {
      out += fmt::format("  {} {} {} {} {} {}\n", action_name(e.action), e.addr, e.size, e.time_us, e.frames, e.stream);
    }
  }
  for (const EventTag& t : s.event_tags) out += fmt::format("tag '{}' '{}'\n", t.compile_context, t.user_metadata);
  for (size_t d = 0; d < s.tag_runs.size(); ++d) {
    out += fmt::format("tag runs {}:", d);
    for (const TagRun& r : s.tag_runs[d]) out += fmt::format(" {}:{}", r.first_event, r.tag);
    out += "\n";
  }
  return out;
}

}  // namespace oomtune::diagnose::testing
