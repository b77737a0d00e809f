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
// as requested (0 for a free); phase as phase_name() writes it.
// "persistent": [65536, 4096, ...] (optional; absent in files written before
// it): the requested bytes of the device allocations alive when the step
// began that the step does not free (weights, buffers, optimizer state), in
// the order they were made: what a replay of many steps allocates first
// (allocsim/length_replay.h). No libtorch.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "allocsim/alloc_event.h"

namespace oomtune::allocsim {

/// One step's events and what was alive before it.
struct StepEvents {
  std::vector<AllocEvent> events;         ///< the step's allocs and frees, in order
  std::vector<int64_t> persistent_bytes;  ///< bytes of each allocation alive throughout, in the order made
};

/// The file's JSON for `step`.
nlohmann::json step_events_json(const StepEvents& step);

/// The contents of a step-events file. Throws InputError naming `path`: not
/// JSON, another format or version, an event that is not
/// [kind, id, bytes >= 0, phase, op] with a known kind and phase, or a
/// "persistent" that is not a list of integers >= 0.
StepEvents read_step_events(const std::string& path);

}  // namespace oomtune::allocsim
