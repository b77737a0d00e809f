#pragma once
// plan.toml: the file form of a Plan (recipes/plan.h). Written by autotune,
// read back by `oomtune emit` and `oomtune probe --plan`. docs/recipes.md has
// the key reference.

#include <string>

#include "recipes/plan.h"

namespace oomtune {

/// The file name autotune and `oomtune emit` use for a plan.
constexpr const char* kPlanFileName = "plan.toml";

/// Current plan.toml format; read_plan_toml rejects other values of
/// `plan_version`.
constexpr int64_t kPlanVersion = 1;

/// The plan as TOML text. Tables [job], [config], [optimizer] and, when any
/// result is known, [result]; every number is written so that
/// parse_plan_toml gives back an equal Plan (doubles in shortest round-trip
/// form). Calls validate_plan first (throws ConfigError).
std::string write_plan_toml(const Plan& plan);

/// Parses plan TOML text; `origin` names the source in error messages.
/// Throws SpecError "ORIGIN:LINE:COLUMN: KEY: what is wrong" for a syntax
/// error, an unknown key or table (with the closest valid name), a missing
/// required key (config.micro_batch, config.accumulation_steps), a wrong type
/// or a value out of range (the validate_plan rules). Optional keys take the
/// Plan defaults; job.global_batch defaults to micro_batch *
/// accumulation_steps; job.budget is bytes (integer) or a size string such as
/// "16GiB". Throws InputError "ORIGIN: is a job spec, not a plan; ..." for
/// a job spec (a top-level model and no [config]).
Plan parse_plan_toml(const std::string& text, const std::string& origin);

/// Reads a plan file. Throws InputError "PATH: cannot open the plan file"
/// when it cannot be read ("PATH: is a folder, not a plan file" for a
/// folder, "PATH: is a zip archive (...), not a plan file; ..." for a binary
/// file: common/text_file.h), else as parse_plan_toml.
Plan read_plan_toml(const std::string& path);

}  // namespace oomtune
