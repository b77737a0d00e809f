#include "allocsim/allocsim_trace.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"

namespace oomtune::allocsim {

namespace rules = alloc_rules;

namespace {

/// Ids of the failed requests (oom events): far above any device address.
constexpr std::uint64_t kOomIdBase = std::uint64_t{1} << 63;

using Json = nlohmann::json;

template <typename T>
T field(const Json& object, const char* key, const std::string& path, const std::string& where) {
  if (!object.is_object() || !object.contains(key)) {
    throw SnapshotError(fmt::format("{}: {}: missing field '{}'", path, where, key));
  }
  try {
    return object.at(key).get<T>();
  } catch (const Json::exception& e) {
    throw SnapshotError(fmt::format("{}: {}: field '{}' has the wrong type ({})", path, where, key, e.what()));
  }
}

TraceAction action_of(const std::string& name, const std::string& path, std::size_t index) {
  if (name == "alloc") return TraceAction::kAlloc;
  if (name == "free_completed") return TraceAction::kFreeCompleted;
  if (name == "segment_alloc") return TraceAction::kSegmentAlloc;
  if (name == "segment_free") return TraceAction::kSegmentFree;
  if (name == "segment_map") return TraceAction::kSegmentMap;
  if (name == "segment_unmap") return TraceAction::kSegmentUnmap;
  if (name == "oom") return TraceAction::kOom;
  throw SnapshotError(
      fmt::format("{}: events[{}]: unknown action '{}' (expected alloc, free_completed, segment_alloc, "
                  "segment_free, segment_map, segment_unmap or oom)",
                  path, index, name));
}

rules::AllocatorConfig config_of(const Json& settings, const std::string& path) {
  rules::AllocatorConfig config;
  const std::string where = "allocator_settings";
  const auto max_split = field<int64_t>(settings, "max_split_size", path, where);
  config.max_split_size = max_split < 0 ? rules::kNoMaxSplitSize : max_split;
  if (settings.contains("max_non_split_rounding_size")) {
    config.max_non_split_rounding_size = field<int64_t>(settings, "max_non_split_rounding_size", path, where);
  }
  config.garbage_collection_threshold = field<double>(settings, "garbage_collection_threshold", path, where);
  config.expandable_segments = field<bool>(settings, "expandable_segments", path, where);
  const auto divisions = field<std::vector<int64_t>>(settings, "roundup_power2_divisions", path, where);
  if (divisions.size() != config.roundup_power2_divisions.size()) {
    throw SnapshotError(
        fmt::format("{}: allocator_settings.roundup_power2_divisions: expected {} "
                    "entries, got {}",
                    path, config.roundup_power2_divisions.size(), divisions.size()));
  }
  std::copy(divisions.begin(), divisions.end(), config.roundup_power2_divisions.begin());
  return config;
}

}  // namespace

SnapshotTrace load_snapshot_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw SnapshotError(fmt::format("{}: cannot open the trace file", path));
  Json root;
  try {
    in >> root;
  } catch (const Json::exception& e) {
    throw SnapshotError(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
  const auto format = field<std::string>(root, "format", path, "top level");
  if (format != "oomtune-allocsim-trace") {
    throw SnapshotError(fmt::format("{}: format: expected 'oomtune-allocsim-trace', got '{}'", path, format));
  }
  const auto version = field<int>(root, "version", path, "top level");
  if (version != 1) {
    throw SnapshotError(fmt::format("{}: version: expected 1, got {}", path, version));
  }

  SnapshotTrace trace;
  trace.source = root.value("source", path);
  trace.config = config_of(field<Json>(root, "allocator_settings", path, "top level"), path);

  const auto segments = field<Json>(root, "initial_segments", path, "top level");
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Json& s = segments[i];
    const std::string where = fmt::format("initial_segments[{}]", i);
    ExistingSegment segment;
    segment.address = field<std::uint64_t>(s, "address", path, where);
    segment.bytes = field<int64_t>(s, "total_size", path, where);
    const auto type = field<std::string>(s, "segment_type", path, where);
    if (type != "small" && type != "large") {
      throw SnapshotError(fmt::format("{}: {}.segment_type: expected 'small' or 'large', got '{}'", path, where, type));
    }
    segment.pool = type == "small" ? rules::Pool::kSmall : rules::Pool::kLarge;
    if (s.value("is_expandable", false)) {
      throw SnapshotError(
          fmt::format("{}: {}: expandable segments present when recording began cannot be replayed yet", path, where));
    }
    const auto blocks = field<Json>(s, "blocks", path, where);
    for (std::size_t j = 0; j < blocks.size(); ++j) {
      const std::string block_where = fmt::format("{}.blocks[{}]", where, j);
      ExistingBlock block;
      block.address = field<std::uint64_t>(blocks[j], "address", path, block_where);
      block.id = block.address;
      block.bytes = field<int64_t>(blocks[j], "size", path, block_where);
      block.requested_bytes = field<int64_t>(blocks[j], "requested_size", path, block_where);
      if (blocks[j].value("size_inferred", false)) ++trace.inferred_block_sizes;
      segment.allocated_blocks.push_back(block);
    }
    trace.initial_segments.push_back(std::move(segment));
  }

  const auto events = field<Json>(root, "events", path, "top level");
  trace.events.reserve(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    const Json& e = events[i];
    if (!e.is_array() || e.size() != 3) {
      throw SnapshotError(fmt::format("{}: events[{}]: expected [action, address, bytes], got {}", path, i, e.dump()));
    }
    TraceEvent event;
    try {
      event.action = action_of(e[0].get<std::string>(), path, i);
      event.address = e[1].get<std::uint64_t>();
      event.bytes = e[2].get<int64_t>();
    } catch (const Json::exception& ex) {
      throw SnapshotError(fmt::format("{}: events[{}]: {}", path, i, ex.what()));
    }
    trace.events.push_back(event);
  }

  if (root.contains("final_segments")) {
    const auto finals = field<Json>(root, "final_segments", path, "top level");
    for (std::size_t i = 0; i < finals.size(); ++i) {
      const std::string where = fmt::format("final_segments[{}]", i);
      SegmentInfo segment;
      segment.address = field<std::uint64_t>(finals[i], "address", path, where);
      segment.bytes = field<int64_t>(finals[i], "total_size", path, where);
      segment.pool = field<std::string>(finals[i], "segment_type", path, where) == "small" ? rules::Pool::kSmall
                                                                                           : rules::Pool::kLarge;
      segment.is_expandable = finals[i].value("is_expandable", false);
      const auto blocks = field<Json>(finals[i], "blocks", path, where);
      for (const Json& b : blocks) {
        if (!b.is_array() || b.size() != 3) {
          throw SnapshotError(
              fmt::format("{}: {}.blocks: expected [address, size, allocated], got {}", path, where, b.dump()));
        }
        BlockInfo block;
        block.address = b[0].get<std::uint64_t>();
        block.bytes = b[1].get<int64_t>();
        block.allocated = b[2].get<bool>();
        segment.blocks.push_back(block);
      }
      trace.final_segments.push_back(std::move(segment));
    }
  }

  const auto budget = field<Json>(root, "budget", path, "top level");
  trace.budget_lower_bytes = field<int64_t>(budget, "lower", path, "budget");
  trace.budget_upper_bytes =
      budget.contains("upper") && !budget["upper"].is_null() ? budget["upper"].get<int64_t>() : 0;
  return trace;
}

std::vector<AllocEvent> to_alloc_events(const SnapshotTrace& trace) {
  std::vector<AllocEvent> out;
  out.reserve(trace.events.size());
  std::uint64_t next_oom_id = kOomIdBase;
  for (const TraceEvent& event : trace.events) {
    const auto order = static_cast<int64_t>(out.size());
    switch (event.action) {
      case TraceAction::kAlloc:
        out.push_back(alloc_event(event.address, event.bytes, order));
        break;
      case TraceAction::kFreeCompleted:
        out.push_back(free_event(event.address, order));
        out.back().bytes = event.bytes;
        break;
      case TraceAction::kOom:
        out.push_back(alloc_event(next_oom_id++, event.bytes, order));
        break;
      default:
        break;
    }
  }
  return out;
}

RealOutcome real_outcome(const SnapshotTrace& trace) {
  RealOutcome real;
  // Segment events happen inside the malloc whose alloc (or oom) follows them.
  int64_t index = 0;
  for (const TraceEvent& event : trace.events) {
    switch (event.action) {
      case TraceAction::kAlloc:
      case TraceAction::kFreeCompleted:
        ++index;
        break;
      case TraceAction::kOom:
        real.oom_event_indices.push_back(index);
        real.oom_rounded_bytes.push_back(event.bytes);
        ++index;
        break;
      case TraceAction::kSegmentAlloc:
      case TraceAction::kSegmentFree:
      case TraceAction::kSegmentMap:
      case TraceAction::kSegmentUnmap: {
        SegmentLogEntry entry;
        entry.action = event.action == TraceAction::kSegmentAlloc  ? SegmentAction::kAlloc
                       : event.action == TraceAction::kSegmentFree ? SegmentAction::kFree
                       : event.action == TraceAction::kSegmentMap  ? SegmentAction::kMap
                                                                   : SegmentAction::kUnmap;
        entry.event_index = index;
        entry.address = event.address;
        entry.bytes = event.bytes;
        real.segment_log.push_back(entry);
        break;
      }
    }
  }
  return real;
}

TraceReplay replay_trace(const SnapshotTrace& trace, SimOptions options, bool real_addresses) {
  options.record_segment_log = true;
  CachingAllocatorSim sim(options);
  for (const ExistingSegment& segment : trace.initial_segments) sim.add_existing_segment(segment);
  if (real_addresses) {
    std::vector<std::uint64_t> addresses;
    for (const TraceEvent& event : trace.events) {
      if (event.action == TraceAction::kSegmentAlloc) addresses.push_back(event.address);
    }
    sim.use_segment_addresses(std::move(addresses));
  }
  TraceReplay replay;
  const std::vector<AllocEvent> events = to_alloc_events(trace);
  for (std::size_t i = 0; i < events.size(); ++i) {
    const AllocEvent& event = events[i];
    const bool ok = sim.apply(event);
    if (real_addresses && ok && event.kind == AllocEventKind::kAlloc && event.id < kOomIdBase) {
      const auto address = sim.address_of(event.id);
      if (!address || *address != event.id) {
        if (replay.address_mismatches++ == 0) replay.first_address_mismatch = static_cast<int64_t>(i);
      }
    }
  }
  replay.result = sim.result();
  replay.real = real_outcome(trace);
  replay.final_segments = sim.snapshot();
  return replay;
}

}  // namespace oomtune::allocsim
