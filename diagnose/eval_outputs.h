#pragma once
// Hugging Face Trainer's evaluation outputs in a trace, and the
// eval_accumulation_steps that keeps them small enough.
//
// Note [Evaluation outputs]
// Rationale: Trainer.evaluate() keeps the predictions (logits), labels and
// losses of every evaluation step on the device and concatenates each
// step's onto those before it (transformers/trainer.py evaluation_loop:
// EvalLoopContainer.add -> trainer_pt_utils.py nested_concat ->
// torch.cat), until the loop ends or, every eval_accumulation_steps steps,
// to_cpu_and_numpy() moves them to the CPU. A language model's logits are
// batch x sequence x vocabulary floats a step, so an evaluation that fits
// step by step runs out of memory after enough steps, in the
// concatenation or in the next step's forward: a classic out-of-memory
// that halving the batch does not fix (the same samples, the same bytes).
// Approach: blocks allocated under nested_concat (FrameIndex::
// concatenates_eval_outputs) are the accumulated outputs. One step adds
// what the largest concatenation exceeds the one before it by (the
// predictions dominate; labels and losses are concatenated beside them,
// smaller); the largest holds largest / step steps.
// With eval_accumulation_steps = K the outputs on the device never exceed
// K steps: a concatenation asks for at most K steps (none at all for
// K = 1: each step's outputs go to the CPU before the next is added), and
// at most K - 1 steps stay alive between steps. The recommended K is the
// largest that frees what the failing phase still needed (larger K copies
// to the CPU less often); frees = (outputs alive - (K - 1) steps) + (the
// failing concatenation - K steps, when the oom was one).
// Limitations: the step is read from the two largest concatenations of the
// whole trace (several evaluations of one run count together); several
// output tensors a step (logits and hidden states) are one step.

#include <cstdint>

#include "diagnose/frames.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// Hugging Face Trainer's evaluation outputs at an out-of-memory
/// (Note [Evaluation outputs]). All zero outside its evaluation.
struct EvalOutputs {
  int64_t bytes = 0;  ///< alive at the oom in blocks nested_concat allocated (Category::kEvalOutputs)
  /// the failing request is the next concatenation (its result: the
  /// outputs of every step so far plus this one)
  bool at_concat = false;
  int64_t request_bytes = 0;  ///< the failing request when at_concat, else 0
  /// what one step adds: the largest concatenation so far (the failing
  /// request included when at_concat) less the largest one below it; 0
  /// with fewer than two sizes
  int64_t step_bytes = 0;
  int64_t steps = 0;  ///< COUNT: steps the largest concatenation holds (largest / step_bytes); 0 unknown
};

/// Follows the concatenations of evaluation outputs through one trace.
class EvalOutputTracker {
 public:
  explicit EvalOutputTracker(const FrameIndex& frames) : frames_(frames) {}
  /// Each trace event, in order, before it is applied to the replay.
  void observe(const TraceEvent& e);
  /// The outputs at the oom event `oom`, with `alive_bytes` of them
  /// allocated then (Category::kEvalOutputs, replay.h).
  EvalOutputs at_oom(const TraceEvent& oom, int64_t alive_bytes) const;

 private:
  const FrameIndex& frames_;
  int64_t largest_ = 0;  // requested bytes of the largest concatenation seen
  int64_t second_ = 0;   // of the largest one below it
};

/// An eval_accumulation_steps for the outputs `o` at an oom whose phase
/// still needed `needed_bytes` (PhaseNeed::still_needed_bytes).
struct EvalAccumulation {
  int64_t steps = 1;        ///< K: the largest that frees `needed_bytes`, else 1
  int64_t frees_bytes = 0;  ///< bytes (see the Note)
};

/// The recommended K and what it frees (Note [Evaluation outputs]). With
/// the step unknown, K = 1 (no concatenation at all).
EvalAccumulation eval_accumulation(const EvalOutputs& o, int64_t needed_bytes);

}  // namespace oomtune::diagnose
