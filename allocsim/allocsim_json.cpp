#include "allocsim/allocsim_json.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "common/phase.h"

namespace oomtune {
namespace {

// Runs `body`, a reader of one record; a malformed field (nlohmann's
// exception) becomes InputError "WHAT JSON: ...".
template <typename F>
void guarded(const char* what, F&& body) {
  try {
    body();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{} JSON: {}", what, e.what()));
  }
}

}  // namespace

namespace alloc_rules {

void to_json(nlohmann::json& j, const AllocatorConfig& config) {
  j = nlohmann::json{
      {"max_split_size",
       config.max_split_size == kNoMaxSplitSize ? nlohmann::json(nullptr) : nlohmann::json(config.max_split_size)},
      {"max_non_split_rounding_size", config.max_non_split_rounding_size},
      {"roundup_power2_divisions", config.roundup_power2_divisions},
      {"garbage_collection_threshold", config.garbage_collection_threshold},
      {"expandable_segments", config.expandable_segments}};
}

void from_json(const nlohmann::json& j, AllocatorConfig& config) {
  config = AllocatorConfig{};
  guarded("allocator config", [&] {
    if (j.contains("max_split_size")) {
      const auto& v = j.at("max_split_size");
      config.max_split_size = v.is_null() ? kNoMaxSplitSize : v.get<int64_t>();
    }
    config.max_non_split_rounding_size = j.value("max_non_split_rounding_size", config.max_non_split_rounding_size);
    if (j.contains("roundup_power2_divisions")) {
      const auto divisions = j.at("roundup_power2_divisions").get<std::vector<int64_t>>();
      if (divisions.size() != config.roundup_power2_divisions.size()) {
        throw InputError(
            fmt::format("allocator config JSON: roundup_power2_divisions expects {} "
                        "entries, got {}",
                        config.roundup_power2_divisions.size(), divisions.size()));
      }
      std::copy(divisions.begin(), divisions.end(), config.roundup_power2_divisions.begin());
    }
    config.garbage_collection_threshold = j.value("garbage_collection_threshold", config.garbage_collection_threshold);
    config.expandable_segments = j.value("expandable_segments", config.expandable_segments);
  });
}

}  // namespace alloc_rules

namespace allocsim {

namespace {

const char* action_name(SegmentAction action) {
  switch (action) {
    case SegmentAction::kAlloc:
      return "alloc";
    case SegmentAction::kFree:
      return "free";
    case SegmentAction::kMap:
      return "map";
    case SegmentAction::kUnmap:
      return "unmap";
  }
  return "alloc";
}

SegmentAction action_of(const std::string& name) {
  if (name == "alloc") return SegmentAction::kAlloc;
  if (name == "free") return SegmentAction::kFree;
  if (name == "map") return SegmentAction::kMap;
  if (name == "unmap") return SegmentAction::kUnmap;
  throw InputError(
      fmt::format("simulator result JSON: segment_log action must be alloc, free, map or unmap, got '{}'", name));
}

}  // namespace

void to_json(nlohmann::json& j, const SimOptions& options) {
  j = nlohmann::json{{"config", options.config},
                     {"budget_bytes", options.budget_bytes},
                     {"device_total_bytes", options.device_total_bytes},
                     {"record_segment_log", options.record_segment_log},
                     {"stop_at_first_oom", options.stop_at_first_oom}};
}

void from_json(const nlohmann::json& j, SimOptions& options) {
  options = SimOptions{};
  guarded("simulator options", [&] {
    if (j.contains("config")) j.at("config").get_to(options.config);
    options.budget_bytes = j.value("budget_bytes", options.budget_bytes);
    options.device_total_bytes = j.value("device_total_bytes", options.device_total_bytes);
    options.record_segment_log = j.value("record_segment_log", options.record_segment_log);
    options.stop_at_first_oom = j.value("stop_at_first_oom", options.stop_at_first_oom);
  });
}

void to_json(nlohmann::json& j, const OomRecord& oom) {
  j = nlohmann::json{{"event_index", oom.event_index},         {"id", oom.id},
                     {"requested_bytes", oom.requested_bytes}, {"rounded_bytes", oom.rounded_bytes},
                     {"segment_bytes", oom.segment_bytes},     {"reserved_bytes", oom.reserved_bytes},
                     {"allocated_bytes", oom.allocated_bytes}, {"op", oom.op}};
}

void from_json(const nlohmann::json& j, OomRecord& oom) {
  guarded("OOM record", [&] {
    j.at("event_index").get_to(oom.event_index);
    j.at("id").get_to(oom.id);
    j.at("requested_bytes").get_to(oom.requested_bytes);
    j.at("rounded_bytes").get_to(oom.rounded_bytes);
    j.at("segment_bytes").get_to(oom.segment_bytes);
    j.at("reserved_bytes").get_to(oom.reserved_bytes);
    j.at("allocated_bytes").get_to(oom.allocated_bytes);
    oom.op = j.value("op", std::string());
  });
}

void to_json(nlohmann::json& j, const SegmentLogEntry& entry) {
  j = nlohmann::json{{"action", action_name(entry.action)},
                     {"event_index", entry.event_index},
                     {"address", entry.address},
                     {"bytes", entry.bytes}};
}

void from_json(const nlohmann::json& j, SegmentLogEntry& entry) {
  guarded("segment log entry", [&] {
    entry.action = action_of(j.at("action").get<std::string>());
    j.at("event_index").get_to(entry.event_index);
    j.at("address").get_to(entry.address);
    j.at("bytes").get_to(entry.bytes);
  });
}

void to_json(nlohmann::json& j, const SimResult& r) {
  nlohmann::json by_phase = nlohmann::json::object();
  for (std::size_t i = 0; i < kNumPhases; ++i) {
    by_phase[std::string(phase_name(static_cast<Phase>(i)))] = r.peak_reserved_by_phase[i];
  }
  j = nlohmann::json{{"peak_reserved_bytes", r.peak_reserved_bytes},
                     {"reserved_bytes", r.reserved_bytes},
                     {"peak_allocated_bytes", r.peak_allocated_bytes},
                     {"allocated_bytes", r.allocated_bytes},
                     {"peak_requested_bytes", r.peak_requested_bytes},
                     {"fragmentation_at_peak_bytes", r.fragmentation_at_peak_bytes},
                     {"largest_free_block_at_peak_bytes", r.largest_free_block_at_peak_bytes},
                     {"peak_reserved_event_index", r.peak_reserved_event_index},
                     {"peak_reserved_op", r.peak_reserved_op},
                     {"peak_reserved_by_phase", by_phase},
                     {"num_device_alloc", r.num_device_alloc},
                     {"num_device_free", r.num_device_free},
                     {"num_alloc_retries", r.num_alloc_retries},
                     {"num_ooms", r.num_ooms},
                     {"num_events", r.num_events},
                     {"oom", r.oom},
                     {"first_oom_event_index", r.first_oom_event_index},
                     {"ooms", r.ooms}};
  if (!r.segment_log.empty()) j["segment_log"] = r.segment_log;
}

void from_json(const nlohmann::json& j, SimResult& r) {
  r = SimResult{};
  guarded("simulator result", [&] {
    j.at("peak_reserved_bytes").get_to(r.peak_reserved_bytes);
    j.at("reserved_bytes").get_to(r.reserved_bytes);
    j.at("peak_allocated_bytes").get_to(r.peak_allocated_bytes);
    j.at("allocated_bytes").get_to(r.allocated_bytes);
    j.at("peak_requested_bytes").get_to(r.peak_requested_bytes);
    j.at("fragmentation_at_peak_bytes").get_to(r.fragmentation_at_peak_bytes);
    j.at("largest_free_block_at_peak_bytes").get_to(r.largest_free_block_at_peak_bytes);
    j.at("peak_reserved_event_index").get_to(r.peak_reserved_event_index);
    r.peak_reserved_op = j.value("peak_reserved_op", std::string());
    for (const auto& [name, value] : j.at("peak_reserved_by_phase").items()) {
      std::size_t i = 0;
      while (i < kNumPhases && phase_name(static_cast<Phase>(i)) != name) ++i;
      if (i == kNumPhases) {
        throw InputError(
            fmt::format("simulator result JSON: unknown phase '{}' in "
                        "peak_reserved_by_phase (expected load, forward, loss, "
                        "backward or optimizer)",
                        name));
      }
      r.peak_reserved_by_phase[i] = value.get<int64_t>();
    }
    j.at("num_device_alloc").get_to(r.num_device_alloc);
    j.at("num_device_free").get_to(r.num_device_free);
    j.at("num_alloc_retries").get_to(r.num_alloc_retries);
    j.at("num_ooms").get_to(r.num_ooms);
    j.at("num_events").get_to(r.num_events);
    j.at("oom").get_to(r.oom);
    j.at("first_oom_event_index").get_to(r.first_oom_event_index);
    j.at("ooms").get_to(r.ooms);
    if (j.contains("segment_log")) j.at("segment_log").get_to(r.segment_log);
  });
}

}  // namespace allocsim
}  // namespace oomtune
