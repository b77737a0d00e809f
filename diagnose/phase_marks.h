#pragma once
// Phase marks in a snapshot's external_annotations, so that an event's
// phase is known from its time rather than guessed from frames:
//   - oomtune's own: a CUDA trial that runs out of memory writes the
//     allocator's history with an annotation at each boundary of its
//     training step ("oomtune:forward" START ... END, then loss, backward,
//     optimizer; trial/cuda_measurement.h), where a C++ trial's events have
//     no Python stack;
//   - torch.optim's: every Optimizer.step() runs inside
//     record_function("Optimizer.step#<class>.step") (torch/optim/
//     optimizer.py, profile_hook_step), which the allocator's history keeps
//     as a START and an END annotation (the PyTorch 2.11 recordings in
//     tests/fixtures/snapshots/h200_recorded/ hold "Optimizer.step#AdamW.step"
//     with the default _record_memory_history()): the optimizer step's
//     allocations even where they have no frames, and the optimizer's class.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "diagnose/frames.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// Who wrote a mark.
enum class MarkSource : uint8_t {
  kOomtune,        ///< "oomtune:<phase>"
  kOptimizerStep,  ///< torch.optim's "Optimizer.step#<class>.step"
};

/// A phase between two marks: [begin_us, end_us), microseconds.
struct PhaseSpan {
  int64_t begin_us = 0;
  int64_t end_us = INT64_MAX;  ///< INT64_MAX: never closed (the run stopped inside it)
  Phase phase = Phase::kUnknown;
  bool load = false;  ///< "oomtune:load": what stays allocated from it is the model's parameters and buffers
  MarkSource source = MarkSource::kOomtune;
  std::string optimizer_class;  ///< kOptimizerStep: "AdamW", "AdamW8bit", ...
};

/// The spans of `device`'s marks, in time order: "oomtune:forward" and
/// "oomtune:loss" are forward (what the loss keeps for backward is an
/// activation), "oomtune:backward" backward, "oomtune:optimizer" and
/// "Optimizer.step#<class>.step" the optimizer, "oomtune:load" other. A
/// START closes any span still open, but an optimizer step's START inside
/// an optimizer step (a wrapper's step calling the inner optimizer's) is
/// nested in it; an END closes its own. Other annotations (the user's
/// record_function marks, Optimizer.zero_grad) are ignored. Empty when
/// there is none.
std::vector<PhaseSpan> marked_phase_spans(const std::vector<Annotation>& annotations, int64_t device);

/// True for a mark oomtune or torch.optim wrote ("oomtune:<phase>",
/// "Optimizer.step#<class>.step", "Optimizer.zero_grad#<class>.zero_grad"),
/// false for the user's own record_function marks (event_tags.h).
bool is_framework_mark(std::string_view name);

/// The span holding `time_us`, or nullptr outside every span.
const PhaseSpan* span_at(const std::vector<PhaseSpan>& spans, int64_t time_us);

}  // namespace oomtune::diagnose
