#pragma once
// JSON for the simulator's records (nlohmann::json ADL hooks), so a
// SimResult can travel inside a ProbeReport and back. Keys are the field
// names; segment actions are "alloc", "free", "map", "unmap"; per-phase peaks
// are an object keyed by phase_name(). Byte counts are integers.

#include <nlohmann/json_fwd.hpp>

#include "allocsim/allocator_rules.h"
#include "allocsim/caching_allocator_sim.h"

namespace oomtune::alloc_rules {

/// {"max_split_size": bytes or null (no limit), "max_non_split_rounding_size",
///  "roundup_power2_divisions": [16], "garbage_collection_threshold",
///  "expandable_segments"}.
void to_json(nlohmann::json& j, const AllocatorConfig& config);
/// Inverse of to_json; missing keys keep PyTorch's defaults. Throws
/// oomtune::InputError naming the key on a wrong type or a wrong length.
void from_json(const nlohmann::json& j, AllocatorConfig& config);

}  // namespace oomtune::alloc_rules

namespace oomtune::allocsim {

/// SimOptions as JSON ("config", "budget_bytes", "device_total_bytes", ...).
void to_json(nlohmann::json& j, const SimOptions& options);
/// Inverse of to_json; missing keys keep the defaults.
void from_json(const nlohmann::json& j, SimOptions& options);

/// One OOM record.
void to_json(nlohmann::json& j, const OomRecord& oom);
void from_json(const nlohmann::json& j, OomRecord& oom);

/// One segment log entry.
void to_json(nlohmann::json& j, const SegmentLogEntry& entry);
void from_json(const nlohmann::json& j, SegmentLogEntry& entry);

/// A whole result; segment_log only when non-empty.
void to_json(nlohmann::json& j, const SimResult& result);
/// Inverse of to_json. Throws oomtune::InputError naming the key on a wrong
/// type or an unknown phase or action.
void from_json(const nlohmann::json& j, SimResult& result);

}  // namespace oomtune::allocsim
