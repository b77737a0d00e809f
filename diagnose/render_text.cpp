#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "common/byte_size.h"
#include "diagnose/render.h"

namespace oomtune::diagnose {
namespace {

std::string categories_line(const CategoryBytes& c) {
  std::string out;
  for (int i = 0; i < kNumCategories; ++i) {
    const int64_t b = c[static_cast<size_t>(i)];
    if (b == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", category_name(static_cast<Category>(i)), format_bytes(b));
  }
  return out.empty() ? "nothing" : out;
}

// "other devices in the snapshot: device 1 (381 trace events, 1 out-of-memory,
// 7.90 GiB reserved); --device N diagnoses one"
std::string other_devices_line(const std::vector<DeviceContent>& others) {
  std::string list;
  for (const DeviceContent& c : others) {
    std::vector<std::string> parts;
    if (c.events > 0) parts.push_back(fmt::format("{} trace event{}", c.events, c.events == 1 ? "" : "s"));
    if (c.ooms > 0) parts.push_back(fmt::format("{} out-of-memory", c.ooms));
    if (c.reserved_bytes > 0) parts.push_back(fmt::format("{} reserved", format_bytes(c.reserved_bytes)));
    list += fmt::format("{}device {} ({})", list.empty() ? "" : ", ", c.device, fmt::join(parts, ", "));
  }
  return fmt::format("other device{} in the snapshot: {}; --device N diagnoses one", others.size() == 1 ? "" : "s",
                     list);
}

void sites_table(std::string& out, const std::vector<SiteBytes>& sites, GroupBy group_by) {
  for (const SiteBytes& s : sites) {
    const std::string& other = group_by == GroupBy::kLayer ? s.call_site : s.layer;
    std::string via;
    if (!other.empty() && other != s.site) {
      via = fmt::format("; {} {}{}", group_by == GroupBy::kLayer ? "called from" : "layer", other,
                        s.others > 0 ? fmt::format(" and {} more", s.others) : "");
    }
    out += fmt::format("    {:>12}  {:<16} {} ({} block{}{})\n", format_bytes(s.bytes), category_name(s.category),
                       s.site, s.blocks, s.blocks == 1 ? "" : "s", via);
  }
}

// The tables of live bytes by user metadata and by torch.compile region
// (event_tags.h) `moment` ("at the peak"), for the kinds the trace has.
void tags_tables(std::string& out, const TaggedBytes& tags, const std::string& moment) {
  auto table = [&](const std::vector<TagBytes>& v, const char* by) {
    if (v.empty()) return;
    out += fmt::format("  alive {}, by {}:\n", moment, by);
    for (const TagBytes& b : v) {
      out += fmt::format("    {:>12}  {} ({} block{})\n", format_bytes(b.bytes), b.tag, b.blocks,
                         b.blocks == 1 ? "" : "s");
    }
  };
  table(tags.user_metadata, "user metadata (torch.cuda.memory._set_memory_metadata)");
  table(tags.compile_contexts, "torch.compile region (_record_memory_history(compile_context=True))");
  table(tags.record_functions, "the innermost record_function open at the allocation");
}

// "user metadata \"eval\"; in torch.compile region \"...\"" for a failing
// call's tags, "" when it has none.
std::string tags_of_call(const OomReport& o) {
  std::vector<std::string> parts;
  if (!o.user_metadata.empty()) parts.push_back(fmt::format("user metadata \"{}\"", o.user_metadata));
  if (!o.compile_context.empty()) parts.push_back(fmt::format("in torch.compile region \"{}\"", o.compile_context));
  if (!o.record_functions.empty()) {
    parts.push_back(fmt::format("inside record_function \"{}\"", fmt::join(o.record_functions, "\" > \"")));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

// What may have caught an out-of-memory error the run survived; "" when its
// frames name nothing that does.
std::string catcher_text(const CaughtOom& c) {
  std::vector<std::string> who;
  if (c.in_convolution)
    who.push_back(
        "in a convolution: on CUDA, cuDNN catches the error of its workspace and runs another, slower engine "
        "(aten/src/ATen/native/cudnn/Conv_v8.cpp)");
  if (c.batch_size_finder == BatchSizeFinder::kAccelerate)
    who.push_back("under accelerate's find_executable_batch_size, which retries with half the batch");
  if (c.batch_size_finder == BatchSizeFinder::kLightning)
    who.push_back("under Lightning's batch-size finder, which retries with a smaller batch");
  return fmt::format("{}", fmt::join(who, "; "));
}

// The verdict's line about the errors the run survived.
std::string caught_line(const Diagnosis& d) {
  const size_t n = d.caught_ooms.size();
  const bool convolutions =
      std::all_of(d.caught_ooms.begin(), d.caught_ooms.end(), [](const CaughtOom& c) { return c.in_convolution; });
  return fmt::format("  {}{} caught, and the program went on allocating after {} (below): {} ended nothing{}.\n",
                     d.ooms.empty() ? "" : "Before the out-of-memory that ended the run, ",
                     n == 1 ? std::string("1 out-of-memory error was") : fmt::format("{} out-of-memory errors were", n),
                     n == 1 ? "it" : "each", n == 1 ? "it" : "they",
                     !convolutions ? ""
                     : n == 1      ? "; it came from a convolution, whose cuDNN workspace gives way to a slower engine"
                              : "; each came from a convolution, whose cuDNN workspace gives way to a slower engine");
}

}  // namespace

std::string render_text(const Diagnosis& d) {
  std::string out;
  out += fmt::format("oomtune diagnose: {}\n", d.file);
  out += fmt::format("  snapshot layout: {}; device {}; {} trace events", d.layout, d.trace.device, d.trace.events);
  if (d.trace.duration_us > 0) out += fmt::format(" over {:.1f} ms", static_cast<double>(d.trace.duration_us) / 1000.0);
  out += "\n";
  if (!d.other_devices.empty()) out += fmt::format("  {}\n", other_devices_line(d.other_devices));
  if (d.allocator_settings.present) {
    out += fmt::format("  PYTORCH_CUDA_ALLOC_CONF: \"{}\" (expandable_segments {}, max_split_size {})\n",
                       d.allocator_settings.conf, d.allocator_settings.expandable_segments ? "on" : "off",
                       d.allocator_settings.max_split_size < 0 ? std::string("unlimited")
                                                               : format_bytes(d.allocator_settings.max_split_size));
  }

  out += "\nVerdict\n";
  if (d.verdicts.empty() && d.trace.events == 0) {
    out += fmt::format(
        "  No trace events on device {}: {}, so no out-of-memory or leak can be seen; below is what was alive when "
        "it was dumped.\n",
        d.trace.device,
        !d.trace.layout_has_traces
            ? "torch.cuda.memory_snapshot() holds segments only (torch.cuda.memory._dump_snapshot() writes the "
              "trace too, after _record_memory_history())"
        : d.trace.allocated_before_trace_with_frames_bytes > 0
            ? "its blocks carry stacks but it holds no alloc/free history (recorded with "
              "_record_memory_history(enabled=\"state\"), or taken with include_traces=False)"
            : "the snapshot was dumped without torch.cuda.memory._record_memory_history (or it recorded nothing "
              "there)");
  } else if (d.verdicts.empty()) {
    out += d.caught_ooms.empty() ? "  No out-of-memory and no leak found.\n"
                                 : "  No out-of-memory ended the run, and no leak found.\n";
  }
  if (!d.caught_ooms.empty()) out += caught_line(d);
  for (size_t i = 0; i < d.verdicts.size(); ++i) {
    const VerdictKind& kind = verdict_kind(d.verdicts[i].id);
    out += fmt::format("  {}. {} [{}]\n     {}\n", i + 1, kind.title, kind.name, d.verdicts[i].evidence);
  }

  if (!d.ooms.empty()) {
    out += fmt::format("\nOut-of-memory event{} ({})\n", d.ooms.size() == 1 ? "" : "s", d.ooms.size());
    for (const OomReport& o : d.ooms) {
      out += fmt::format("  event {}: requested {} (rounded {}, {} pool, needs a {} segment) in {}{}{}\n",
                         o.event_index, format_bytes(o.requested_bytes), format_bytes(o.rounded_bytes),
                         o.large_pool ? "large" : "small", format_bytes(o.segment_bytes), phase_prose(o.phase),
                         o.recomputing              ? ", recomputing a checkpointed block's forward,"
                         : o.inference()            ? " without autograd (inference),"
                         : o.eval_outputs.at_concat ? ", concatenating evaluation outputs,"
                                                    : "",
                         o.layer.empty() ? "" : " at " + o.layer);
      if (!o.call_site.empty() && o.call_site != o.layer) out += fmt::format("    called from {}\n", o.call_site);
      if (const std::string tags = tags_of_call(o); !tags.empty()) out += fmt::format("    tagged: {}\n", tags);
      out +=
          fmt::format("    allocated {}, reserved {}, reserved but unallocated {}\n", format_bytes(o.allocated_bytes),
                      format_bytes(o.reserved_bytes), format_bytes(o.reserved_free_bytes));
      out += fmt::format("    {} {} ({} free in that pool){}\n", largest_block_text(o),
                         format_bytes(o.largest_free_block_bytes), format_bytes(o.pool_free_bytes),
                         o.device_free_bytes >= 0
                             ? fmt::format("; CUDA reported {} free on the device", format_bytes(o.device_free_bytes))
                             : "");
      if (o.private_pool_segments > 0) {
        out += fmt::format(
            "    private memory pools (CUDA graphs, torch.cuda.MemPool): {} segment{}, {} reserved, {} free{}\n",
            o.private_pool_segments, o.private_pool_segments == 1 ? "" : "s",
            format_bytes(o.private_pool_reserved_bytes), format_bytes(o.private_pool_free_bytes),
            o.captures_cuda_graph
                ? " (the failing call recorded a CUDA graph, so it asked a private pool: the free figures above "
                  "count every pool)"
                : " (none of it usable by this request: the free figures above are the default pool's)");
      }
      if (o.other_stream_segments > 0) {
        out += fmt::format(
            "    other streams: {} segment{}, {} reserved, {} free, largest free block of the {} pool {} (none of "
            "it usable by this request, on {})\n",
            o.other_stream_segments, o.other_stream_segments == 1 ? "" : "s",
            format_bytes(o.other_stream_reserved_bytes), format_bytes(o.other_stream_free_bytes),
            o.large_pool ? "large" : "small", format_bytes(o.other_stream_largest_free_block_bytes),
            stream_text(o.stream));
        std::string holders;
        for (const SiteBytes& s : o.other_stream_holders) {
          holders += fmt::format("{}{} {} ({} block{})", holders.empty() ? "" : "; ", format_bytes(s.bytes), s.site,
                                 s.blocks, s.blocks == 1 ? "" : "s");
        }
        if (!holders.empty()) out += fmt::format("      kept reserved by the tensors alive in them: {}\n", holders);
      }
      if (o.memory_cap)
        out += fmt::format("    the device had room for the segment: this process's memory cap was the limit ({})\n",
                           cap_bounds_text(o));
      out += fmt::format("    alive: {}\n", categories_line(o.live_by_category));
    }
    if (d.need.known) {
      out += fmt::format("  {} still needed {}{} ({})\n", need_prose(d.need), d.need.lower_bound ? "at least " : "",
                         format_bytes(d.need.still_needed_bytes), d.need.estimate);
    }
    if (!d.oom_sites.empty()) {
      out += fmt::format("  alive at the last out-of-memory, by {}:\n",
                         d.group_by == GroupBy::kLayer ? "layer" : "call site");
      sites_table(out, d.oom_sites, d.group_by);
    }
    tags_tables(out, d.oom_tags, "at the last out-of-memory");
  }

  if (!d.caught_ooms.empty()) {
    out += fmt::format("\nOut-of-memory error{} caught ({}): the program went on allocating after {}\n",
                       d.caught_ooms.size() == 1 ? "" : "s", d.caught_ooms.size(),
                       d.caught_ooms.size() == 1 ? "it" : "each");
    for (const CaughtOom& c : d.caught_ooms) {
      out += fmt::format("  event {}: requested {} in {}{}; {} allocation{} followed\n", c.event_index,
                         format_bytes(c.requested_bytes), phase_prose(c.phase), c.layer.empty() ? "" : " at " + c.layer,
                         c.allocations_after, c.allocations_after == 1 ? "" : "s");
      if (!c.call_site.empty() && c.call_site != c.layer) out += fmt::format("    called from {}\n", c.call_site);
      out += fmt::format("    allocated {}, reserved {}\n", format_bytes(c.allocated_bytes),
                         format_bytes(c.reserved_bytes));
      if (const std::string who = catcher_text(c); !who.empty()) out += fmt::format("    {}\n", who);
    }
  }

  out += "\nTimeline\n";
  out += fmt::format("  peak allocated {} (reserved {}) {}\n", format_bytes(d.peak.allocated_bytes),
                     format_bytes(d.peak.reserved_bytes),
                     d.peak.event_index >= 0
                         ? fmt::format("at event {} in {}", d.peak.event_index, phase_prose(d.peak.phase))
                     : d.trace.events == 0 ? std::string("when the snapshot was dumped (no trace events)")
                                           : std::string("before the first trace event"));
  out += fmt::format("    alive: {}\n", categories_line(d.peak.by_category));
  if (!d.peak.sites.empty()) {
    out += fmt::format("  alive at the peak, by {}:\n", d.group_by == GroupBy::kLayer ? "layer" : "call site");
    sites_table(out, d.peak.sites, d.group_by);
  }
  tags_tables(out, d.peak.tags, "at the peak");
  const int64_t with_frames = d.trace.allocated_before_trace_with_frames_bytes;
  out += fmt::format(
      "  iterations seen: {}; {}: {}{}\n", d.trace.iterations,
      with_frames > 0 ? "allocated without an alloc event in the trace" : "allocated before recording began",
      format_bytes(d.trace.allocated_before_recording_bytes),
      with_frames > 0 ? fmt::format(" ({} of it allocated while recording, with stacks)", format_bytes(with_frames))
                      : "");
  if (d.trace.empty_cache_calls > 0) {
    out += fmt::format("  torch.cuda.empty_cache() calls while recording: {} (segment_free events with its stack)\n",
                       d.trace.empty_cache_calls);
  }
  if (!d.trace.frames_note.empty()) out += fmt::format("  frames: {}\n", d.trace.frames_note);
  if (!d.trace.actions_note.empty()) out += fmt::format("  actions: {}\n", d.trace.actions_note);
  if (d.as_recorded_replay.replayed && !d.ooms.empty()) {
    const int64_t oom_event = d.ooms.back().event_index;
    const bool reproduced = d.as_recorded_replay.reproduces(oom_event);
    out += fmt::format("  {}under this snapshot's own allocator settings the replayed trace {}{}\n",
                       reproduced ? "allocator-settings replay checked: " : "note: ",
                       as_recorded_clause(d.as_recorded_replay, oom_event),
                       reproduced ? ""
                                  : ": the replays under other settings below are approximate (an empty_cache() "
                                    "recorded without context=\"all\", and frees that record_stream delayed in "
                                    "a trace without free_completed, are not replayed)");
  }
  if (!d.trace.replay_matches_dump) {
    out += fmt::format(
        "  note: replaying the trace does not end exactly at the dumped state ({} allocated / {} "
        "reserved dumped; {} events did not fit): numbers at earlier moments are estimates\n",
        format_bytes(d.trace.dumped_allocated_bytes), format_bytes(d.trace.dumped_reserved_bytes),
        d.trace.inconsistencies);
  }

  if (!d.leaks.empty()) {
    out += "\nLeak suspects\n";
    for (const LeakSuspect& l : d.leaks) {
      out += fmt::format("  {}: +{} per iteration over {} iterations ({} -> {}), {} alive at the end\n", l.site.site,
                         format_bytes(l.growth_per_iteration_bytes), l.iterations, format_bytes(l.first_live_bytes),
                         format_bytes(l.last_live_bytes), format_bytes(l.site.bytes));
    }
  }

  out += !d.need.known ? "\nRecommendations (in the order to try them)\n"
         : d.need.lower_bound && d.need.block_bytes > 0
             ? "\nRecommendations (enough ones first, those enough for the most blocks first)\n"
         : d.need.method == NeedMethod::kRequest
             ? "\nRecommendations (only the failing request is known of the phase's need: those that free the most "
               "first)\n"
             : "\nRecommendations (enough ones first, least cost first)\n";
  if (d.recommendations.empty()) out += "  none\n";
  for (size_t i = 0; i < d.recommendations.size(); ++i) {
    const Recommendation& r = d.recommendations[i];
    const std::string judged = sufficiency_text(r);
    out += fmt::format("  {}. {}{}\n     {}\n", i + 1, r.change, judged.empty() ? "" : ": " + judged, r.reason);
    out += fmt::format("     frees: {} ({})\n", r.frees_bytes > 0 ? format_bytes(r.frees_bytes) : "-", r.estimate);
  }
  return out;
}

}  // namespace oomtune::diagnose
