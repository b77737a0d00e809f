#pragma once
// oomtune's phase marks in a snapshot: a CUDA trial that runs out of memory
// writes the allocator's history with an annotation at each boundary of its
// training step ("oomtune:forward" START ... END, then loss, backward,
// optimizer; trial/cuda_measurement.h), so every event's phase is known
// from its time rather than guessed from frames, which a C++ trial's events
// lack (no Python stack).

#include <cstdint>
#include <vector>

#include "diagnose/frames.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// A phase between two marks: [begin_us, end_us), microseconds.
struct PhaseSpan {
  int64_t begin_us = 0;
  int64_t end_us = INT64_MAX;  ///< INT64_MAX: never closed (the trial stopped inside it)
  Phase phase = Phase::kUnknown;
  bool load = false;  ///< "oomtune:load": what stays allocated from it is the model's parameters and buffers
};

/// The spans of `device`'s oomtune marks, in time order: "oomtune:forward"
/// and "oomtune:loss" are forward (what the loss keeps for backward is an
/// activation), "oomtune:backward" backward, "oomtune:optimizer" the
/// optimizer, "oomtune:load" other. A START closes any span still open; an
/// END closes its own. Other annotations (record_function marks of the
/// user's code) are ignored. Empty when there is none.
std::vector<PhaseSpan> oomtune_phase_spans(const std::vector<Annotation>& annotations, int64_t device);

/// The span holding `time_us`, or nullptr outside every span.
const PhaseSpan* span_at(const std::vector<PhaseSpan>& spans, int64_t time_us);

}  // namespace oomtune::diagnose
