#pragma once
// The search's models of memory and time, fitted to probe trials.
//
// Rules (issue #5; DESIGN.md):
// - Memory of one configuration, per phase (forward, loss, backward,
//   optimizer): peak_p(b) = intercept + slope * b, where the intercept holds
//   the static bytes (parameters, gradients, optimizer state) plus transient
//   bytes that do not grow with the batch, and the slope is the activation
//   (and temporary) bytes per sample; the configuration's peak is the
//   largest phase line (memory_model.cpp, Note [Phase lines]).
//   Fitted by least squares on probes at several micro-batch sizes b.
// - Strategies that change only static memory (8-bit AdamW, offload) shift
//   the intercept by their measured difference at one micro-batch size;
//   strategies that change activations (checkpointing, bf16) get a slope
//   ratio from two sizes. Combinations add intercept shifts and multiply
//   slope ratios.
// - Checkpointing n of the N blocks that "all" checkpoints (the first n,
//   every k-th, named paths) applies n / N of its effect: shifts, slope and
//   time ratios move linearly between none (n = 0) and all (n = N).
// - Backward's peak is also the largest of one line per level of
//   gradients made, where the probes measured them: the moments between
//   two gradients keep their place at every micro-batch while the peak
//   moves among them (memory_model.cpp, Note [Backward by gradients]).
// - Backward has two more lines when the probes measured them
//   (probes/memory_records.h, BackwardActivationPeak): its live bytes at
//   its activation peak, which the backward phase's own peak hides at small
//   micro-batches, and its highest live bytes less the stored gradients as
//   a later micro-batch of an accumulated step runs it (memory_model.cpp,
//   Note [Backward activation peak]). Strategies shift and scale them as
//   they do a phase line.
// - With gradient accumulation (more than one micro-batch per step), every
//   micro-batch after the first (the smaller remainder included) runs with
//   the gradients alive: its forward and loss peaks + gradient bytes, and
//   backward's accumulating line, or its activation line less the gradients
//   made by then, + gradient bytes (unmeasured: backward's phase line +
//   gradient bytes).
// - Time: seconds per micro-batch t(b) = c + d * b from the same probes;
//   strategies scale c and d by their measured ratios (one ratio for both
//   when probed at one size) and the optimizer step by its own; a global
//   batch of G takes the sum of t over its micro-batches, plus the
//   optimizer step once (memory_model.cpp, Note [Step time]).
//
// The search (search/fit.cpp) fits these models to its probes and asks
// predict() about every node; nothing here runs a trial.

#include <array>
#include <cstdint>
#include <vector>

#include "common/phase.h"
#include "probes/linear_fit.h"
#include "search/strategy_table.h"
#include "strategies/training_config.h"

namespace oomtune {

/// A line y = intercept + slope * micro_batch.
struct BatchLine {
  double intercept = 0;  // units of y at micro-batch 0
  double slope = 0;      // units of y per sample
  double operator()(double micro_batch) const { return intercept + slope * micro_batch; }
};

/// Fits a BatchLine through (micro_batch, value) points; with one point the
/// slope is `fallback_slope`. Throws std::invalid_argument with none.
BatchLine fit_batch_line(const std::vector<int64_t>& micro_batches, const std::vector<double>& values,
                         double fallback_slope = 0);

/// Fits seconds per micro-batch (a BatchLine in s and s per sample) through
/// (micro_batch, seconds) points by least squares with the slope held at 0
/// or more: a micro-batch of more samples never takes less time, so a line
/// that falls is timing noise (the PyPI build on a loaded 2-core CPU
/// measured the example GPT at 1.03 s at micro-batch 2 and 0.63 s at 4:
/// 1.42 - 0.197 s per sample, which predicted 8-bit AdamW 8 x 4 at 0.012 s;
/// it ran 1.99 s), and gets the flat line through the mean. The intercept
/// may be below 0: time that grows faster than the samples (a cache
/// spilled past some micro-batch) crosses the axis there, and a line
/// through its probes is right at them. One point: slope 0. Throws
/// std::invalid_argument with no points.
BatchLine fit_time_line(const std::vector<int64_t>& micro_batches, const std::vector<double>& seconds);

/// The phases whose peaks the memory model follows: every phase of a step;
/// loading happens once, before any micro-batch (Note [Phase lines]).
inline constexpr std::array<Phase, 4> kStepPhases = {Phase::kForward, Phase::kLoss, Phase::kBackward,
                                                     Phase::kOptimizer};

/// Per-phase lines, indexed by Phase: bytes vs micro-batch. Lines of phases
/// outside kStepPhases stay zero.
using PhaseLines = std::array<BatchLine, kNumPhases>;

/// Fits one line per step phase: `peaks[j][phase]` is the peak (bytes) of
/// the probe at `micro_batches[j]`. With one probe each slope is
/// `fallback`'s for that phase, zero when `fallback` is null. Throws
/// std::invalid_argument when there are no probes or the sizes differ.
PhaseLines fit_phase_lines(const std::vector<int64_t>& micro_batches,
                           const std::vector<std::array<double, kNumPhases>>& peaks, const PhaseLines* fallback);

/// What a strategy does to one line: a shift of its intercept (bytes) and a
/// ratio of its slopes.
struct LineEffect {
  double shift_bytes = 0;
  double slope_ratio = 1;
};

/// Backward between two gradients made (probes/memory_records.h,
/// GradientLevel) as lines in the micro-batch (memory_model.cpp, Note
/// [Backward by gradients]).
struct LevelLines {
  BatchLine live;             // bytes: the highest live bytes
  BatchLine accumulating;     // bytes: the same as a later micro-batch runs it, less the stored gradients
  double gradient_bytes = 0;  // SUM: gradients made by then (the probes' mean)
};

/// What a strategy does to one level's lines.
struct LevelEffect {
  LineEffect live, accumulating;
};

/// What one strategy does to the base configuration's lines, as its probes
/// measured it against the base's at the same micro-batches.
struct StrategyEffect {
  std::array<double, kNumPhases> shift_bytes{};               // added to each phase's intercept
  std::array<double, kNumPhases> slope_ratio{1, 1, 1, 1, 1};  // multiplies each phase's slope
  // Of a micro-batch's seconds (forward, loss, backward): of the line's
  // intercept and of its slope, equal unless probed at two sizes (Note [Step
  // time]).
  double time_ratio = 1, time_slope_ratio = 1;
  double optimizer_time_ratio = 1;  // of the optimizer step's seconds
  // Of backward's activation lines (StepModels), as shift_bytes and
  // slope_ratio of a phase's.
  LineEffect backward_activation, accumulating_backward;
  // Of each of StepModels::backward_levels, where the strategy's probes
  // measured as many levels as the base's; empty: backward_activation's
  // and accumulating_backward's effects apply to every level.
  std::vector<LevelEffect> backward_levels;
  bool available = false;  // false: not probed, or its probe failed
};

/// The fitted lines of the base configuration (the job's own, or the
/// rescued one) and each strategy's effect on them.
struct StepModels {
  PhaseLines phases;  // bytes vs micro-batch, per phase
  // Backward's activation peak (Note [Backward activation peak]), where
  // the probes measured it: live bytes vs micro-batch at that moment of the
  // first micro-batch of a step, and the gradient bytes among them (the
  // probes' mean); the highest live bytes less the stored gradients of a
  // later micro-batch.
  bool backward_activation_measured = false;
  BatchLine backward_activation, accumulating_backward;
  double backward_activation_gradient_bytes = 0;
  // Backward between each two gradients made (Note [Backward by
  // gradients]). Empty: not measured, or the probes' levels differ.
  std::vector<LevelLines> backward_levels;
  BatchLine seconds;              // seconds of one micro-batch's forward, loss and backward (Note [Step time])
  double optimizer_seconds = 0;   // seconds of the optimizer step, once per global batch
  int64_t gradient_bytes = 0;     // SUM: alive through every micro-batch after the first
  int64_t checkpoint_blocks = 0;  // COUNT: blocks that checkpointing "all" checkpoints
  // One per row of the strategy table (search/strategy_table.h);
  // bf16's is of whichever form ran (search/fit.cpp, Note [bf16
  // fallback]).
  std::array<StrategyEffect, kNumStrategies> effects{};
  // bf16's effect on the lines of checkpointing every block, where the
  // pair was probed (Note [bf16 with checkpointing]): a configuration
  // that uses both takes it in place of bf16's, in proportion to the
  // blocks it checkpoints.
  StrategyEffect bf16_on_checkpointing;
  Precision base_precision = Precision::kFp32;  // the base probes' precision

  StrategyEffect& effect(Strategy s) { return effects[static_cast<std::size_t>(s)]; }
  const StrategyEffect& effect(Strategy s) const { return effects[static_cast<std::size_t>(s)]; }
};

/// `m` with `effect` applied whole: the lines of a configuration that adds
/// that one strategy to the base (its phases, backward's activation lines
/// and lines by gradients, seconds and optimizer seconds), the effects
/// left as they were.
StepModels with_effect(const StepModels& m, const StrategyEffect& effect);

/// A configuration's prediction: never measured, always labelled so.
struct StepPrediction {
  double peak_bytes = 0;                // the largest phase line over the step's micro-batches
  double seconds_per_global_batch = 0;  // every micro-batch's seconds plus one optimizer step
};

/// Predicts the peak (bytes) and seconds per global batch of `config`
/// training on `global_batch` samples in micro-batches of
/// config.micro_batch (its accumulation_steps is not read: ceil(G / b)
/// micro-batches, the last one the remainder): the largest of the phase
/// lines and backward's activation lines over those micro-batches. Each
/// strategy `config` uses (StrategyRow::used; bf16 when config.precision
/// differs from the base's) applies its effect (one the base already uses
/// keeps the default, the identity): checkpointing in proportion to the blocks it
/// checkpoints out of models.checkpoint_blocks (the first n, every k-th, or
/// the named paths; all when that count is 0), the others whole; shifts
/// add, ratios multiply (selective checkpointing interpolates both
/// linearly). bf16 with checkpointing takes models.bf16_on_checkpointing
/// where available, for the checkpointed share (Note [bf16 with
/// checkpointing]). Requires config.micro_batch >= 1.
StepPrediction predict(const StepModels& models, const TrainingConfig& config, int64_t global_batch);

}  // namespace oomtune
