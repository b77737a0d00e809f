#pragma once
// What was live at the measured step's peak, by what allocated it: the
// blocks of the highest moment, grouped by the operator that made them and
// the phase it ran in. The phase table says how high a step went and when;
// this says with what (the saved activations of aten::convolution in
// forward, backward's gradients, the optimizer state of the warm-up step),
// and two runs of one job (a GPU trial and its meta prediction) compare
// group by group.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "probes/memory_records.h"

namespace oomtune {

/// Replays the device events `events[0, end)` and returns the blocks live at
/// the first moment in `[begin, end)` where live device bytes were highest
/// (after an allocation; the moment before `begin` when the range makes
/// none above it), grouped by (operator, phase, before `begin` or not).
/// `op_names` maps TrackedEvent::op to its label (MemoryTracker::op_names);
/// an index past it reads "(unknown)". Host-pool events are skipped, and a
/// free of a block the replay has not seen allocated is ignored (the
/// tracker forgets the loader's records, trial/trial_runner.cpp). Shares
/// come largest first; ties by phase, then label.
/// Throws std::out_of_range when begin > end or end > events.size().
PeakComposition find_peak_composition(const std::vector<TrackedEvent>& events, std::size_t begin, std::size_t end,
                                      const std::vector<std::string>& op_names);

/// The probe report's lines for `composition`: the first says how many bytes
/// were live and in which phase, then one line per share for the `listed`
/// largest, then one for the rest ("12 others"). Empty when nothing was live.
std::vector<std::string> peak_composition_lines(const PeakComposition& composition, std::size_t listed);

}  // namespace oomtune
