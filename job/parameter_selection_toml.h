#pragma once
// Reading `trainable`, `frozen` and `frozen_dtype` (job/parameter_selection.h)
// from a TOML table: the job spec's top level and plan.toml's [job] take
// the same keys with the same errors.

#include "common/toml_table.h"
#include "job/parameter_selection.h"

namespace oomtune {

/// The keys this reader takes: "trainable", "frozen", "frozen_dtype".
extern const char* const kParameterSelectionKeys[3];

/// The selection `table` gives (ParameterSelection{} when it has none of
/// the keys). Throws SpecError "ORIGIN:LINE:COLUMN: KEY: ..." for both
/// trainable and frozen, an empty or non-array value, a glob that is not a
/// non-empty string, a frozen_dtype other than "fp32" or "bf16", and a
/// frozen_dtype without trainable or frozen. Whether the globs match
/// parameters is known once the model loads (ModelSession).
ParameterSelection read_parameter_selection(const TomlTable& table);

}  // namespace oomtune
