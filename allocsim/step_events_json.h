#pragma once
// The allocation events of one training step as a file: what `oomtune probe
// --step-events FILE` writes (the measured step, the second of the trial) and
// what a LengthModel (length_model.h) is fitted from, one file per sequence
// length.
//
// Format (JSON): {"format": "oomtune step events", "version": 1,
//   "columns": ["kind", "id", "bytes", "phase", "op"],
//   "events": [["alloc", 140230, 65536, "forward", "aten::mm"],
//              ["free", 140230, 0, "backward", ""], ...]}
// kind is "alloc" or "free"; id names the allocation (a free carries its
// alloc's id; frees of allocations made before the step, such as the
// previous step's gradients, name ids that no alloc of the file has); bytes
// as requested (0 for a free); phase as phase_name() writes it. No libtorch.

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "allocsim/alloc_event.h"

namespace oomtune::allocsim {

/// The file's JSON for `events`.
nlohmann::json step_events_json(const std::vector<AllocEvent>& events);

/// The events of a step-events file. Throws InputError naming `path`: not
/// JSON, another format or version, or an event that is not
/// [kind, id, bytes >= 0, phase, op] with a known kind and phase.
std::vector<AllocEvent> read_step_events(const std::string& path);

}  // namespace oomtune::allocsim
