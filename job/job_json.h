#pragma once
// A JobSpec as JSON: how the parent hands a job to a child trial process.

#include <nlohmann/json.hpp>

#include "job/job_spec.h"

namespace oomtune {

/// Every field of `job`, paths as they are (already resolved) and byte for
/// byte: a path that is not UTF-8 is an array of its byte values.
nlohmann::json to_json(const JobSpec& job);
/// Reads what to_json wrote. Throws InputError naming the key on a bad record.
JobSpec job_spec_from_json(const nlohmann::json& json);

}  // namespace oomtune
