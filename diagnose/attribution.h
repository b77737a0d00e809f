#pragma once
// Which phase each trace event belongs to, what each allocation is, and
// where the training iterations start.
//
// Rules:
//   - An event's phase comes from its frames (frames.h). An event without
//     frames takes its phase from trace order: after an optimizer event it is
//     optimizer; after any forward event it is backward (with stacks="python"
//     the autograd engine allocates from a C++ thread that has no Python
//     frames — pytorch PR #124784); before any forward it stays unknown.
//   - Phase boundaries are changes between forward, backward and optimizer
//     (other/unknown events do not end a phase), and every oom event.
//   - Category of an allocation (its block survives past the phase boundary
//     after it, or is never freed in the trace = "retained"):
//       parameters:      frames allocate parameters (frames.h);
//       optimizer state: optimizer phase, retained, outside Adam's arithmetic
//                        (FrameIndex::runs_adam_math: its temporaries);
//       gradients:       backward phase, retained;
//       activations:     forward phase, retained (saved for backward), or
//                        backward phase recomputing a checkpointed block
//                        (FrameIndex::recomputes), retained;
//       temporaries:     freed before its phase ends, any phase;
//       eval outputs:    Hugging Face Trainer's concatenation of evaluation
//                        outputs (FrameIndex::concatenates_eval_outputs),
//                        retained or not: Note [Evaluation outputs];
//       unattributed:    allocated before recording began without frames, or
//                        retained outside forward/backward/optimizer.
//   - An iteration starts at the first forward event after a backward or
//     optimizer event (the first forward event starts iteration 0).

#include <cstdint>
#include <vector>

#include "diagnose/frames.h"
#include "diagnose/phase_marks.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// What an allocation holds.
enum class Category : uint8_t {
  kParameters,
  kGradients,
  kOptimizerState,
  kActivations,
  kTemporaries,
  kUnattributed,
  kEvalOutputs,
};
constexpr int kNumCategories = 7;

/// "parameters", "gradients", "optimizer_state", "activations", "temporaries", "unattributed", "eval_outputs".
const char* category_name(Category category);

/// Per-event results for one device's trace.
struct Attribution {
  std::vector<Phase> event_phase;        ///< per event
  std::vector<Category> event_category;  ///< per event (meaningful for alloc events)
  std::vector<size_t> iteration_starts;  ///< event indices
  int64_t alloc_events = 0;              ///< COUNT: alloc events
  int64_t alloc_events_without_frames = 0;
  int64_t bytes_without_frames = 0;         ///< SUM: requested bytes of frameless allocs
  int64_t frameless_inferred_backward = 0;  ///< COUNT: frameless allocs placed in backward
  int64_t frameless_inferred_optimizer = 0;
  int64_t alloc_events_in_marked_phases = 0;  ///< COUNT: allocs whose phase an oomtune mark gave
  /// COUNT: frameless allocs inside torch.optim's step mark ("Optimizer.step#<class>.step"), read as the
  /// optimizer's
  int64_t frameless_in_optimizer_marks = 0;
  int64_t forward_alloc_events = 0;         ///< COUNT: allocs in the forward phase
  int64_t checkpointed_forward_allocs = 0;  ///< COUNT: of those, inside torch.utils.checkpoint
  int64_t recomputed_backward_allocs = 0;   ///< COUNT: allocs in backward recomputing a checkpointed block
};

/// Attributes every event of `trace`. An event inside one of `marked`
/// oomtune's phase marks (phase_marks.h) takes that phase, before its
/// frames or the trace order are asked; a frameless event inside
/// torch.optim's step mark is the optimizer's (a framed one, its frames
/// say, as before the marks were read).
Attribution attribute(const std::vector<TraceEvent>& trace, const FrameIndex& frames,
                      const std::vector<PhaseSpan>& marked = {});

/// Category of a block allocated before recording began (only its frames are known).
Category category_before_recording(StackId frames, const FrameIndex& index);

}  // namespace oomtune::diagnose
