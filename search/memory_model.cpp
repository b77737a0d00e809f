#include "search/memory_model.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "strategies/accumulation.h"

namespace oomtune {
namespace {

// The factors a node's strategies apply to the base's seconds.
struct TimeFactors {
  double intercept = 1, slope = 1;  // of the micro-batch seconds line
  double optimizer = 1;             // of the optimizer step
};

// Backward's activation lines (StepModels) of one configuration.
struct ActivationLines {
  BatchLine first, later;
};

// Applies a fraction `f` of a line's effect to `line`.
void move(BatchLine& line, double f, const LineEffect& e) {
  line.intercept += f * e.shift_bytes;
  line.slope *= 1 - f * (1 - e.slope_ratio);
}

// Applies a fraction `f` of an effect to the lines and the time factors.
void apply(const StrategyEffect& e, double f, PhaseLines& lines, ActivationLines& activation, TimeFactors& time) {
  for (Phase p : kStepPhases) {
    const auto i = static_cast<std::size_t>(p);
    move(lines[i], f, {e.shift_bytes[i], e.slope_ratio[i]});
  }
  move(activation.first, f, e.backward_activation);
  move(activation.later, f, e.accumulating_backward);
  time.intercept *= 1 + f * (e.time_ratio - 1);
  time.slope *= 1 + f * (e.time_slope_ratio - 1);
  time.optimizer *= 1 + f * (e.optimizer_time_ratio - 1);
}

// The share of the blocks "all" checkpoints (`blocks` of them; 0: unknown,
// taken as all) that `plan` checkpoints: the first n, every k-th (0, k,
// 2k, ...), or named paths (the blocks left when one block class was
// refused, or the first n of them).
double checkpointed_fraction(const CheckpointPlan& plan, int64_t blocks) {
  if (blocks <= 0) return 1;
  int64_t part = blocks;
  if (plan.mode == CheckpointPlan::Mode::kFirstN) part = plan.first_n;
  if (plan.mode == CheckpointPlan::Mode::kEveryK) {
    const int64_t k = std::max<int64_t>(1, plan.every_k);
    part = (blocks + k - 1) / k;  // blocks 0, k, 2k, ... below `blocks`
  }
  if (plan.mode == CheckpointPlan::Mode::kPaths) part = static_cast<int64_t>(plan.paths.size());
  return std::min(1.0, static_cast<double>(part) / static_cast<double>(blocks));
}

}  // namespace

BatchLine fit_batch_line(const std::vector<int64_t>& micro_batches, const std::vector<double>& values,
                         double fallback_slope) {
  if (micro_batches.empty() || micro_batches.size() != values.size())
    throw std::invalid_argument("fit_batch_line: no points");
  if (micro_batches.size() == 1) {
    BatchLine line;
    line.slope = fallback_slope;
    line.intercept = values[0] - fallback_slope * static_cast<double>(micro_batches[0]);
    return line;
  }
  std::vector<double> xs(micro_batches.begin(), micro_batches.end());
  const LinearFit fit = fit_line(xs, values);
  return {fit.intercept, fit.slope};
}

PhaseLines fit_phase_lines(const std::vector<int64_t>& micro_batches,
                           const std::vector<std::array<double, kNumPhases>>& peaks, const PhaseLines* fallback) {
  PhaseLines lines;
  for (Phase p : kStepPhases) {
    const auto i = static_cast<std::size_t>(p);
    std::vector<double> values;
    for (const auto& row : peaks) values.push_back(row[i]);
    lines[i] = fit_batch_line(micro_batches, values, fallback ? (*fallback)[i].slope : 0);
  }
  return lines;
}

// Note [Phase lines]
// Rationale: small probes peak in the optimizer phase (AdamW temporaries do
// not grow with the batch) while large micro-batches peak in backward; one
// line through each probe's overall peak mixes the two and underestimates
// the slope (measured: 8-bit AdamW 8 x 1 predicted 23.9 MiB, ran 28.9 MiB).
// Approach: one line per phase; a configuration's peak is the largest phase
// line at its micro-batch; each strategy shifts and scales every phase line.
// That alone gave 24.85 MiB for the same run: backward's own line hid the
// rest (Note [Backward activation peak]).

// Note [Backward activation peak]
// Rationale: at small micro-batches backward peaks at its end, every
// gradient created and most activations freed, so its phase line is flat;
// at larger ones it peaks early, when the activations and the first
// gradients of activations stand together, and that moment grows with the
// micro-batch. The flat line under-predicted every larger micro-batch
// (gpt_wide, AdamW, probes at 1, 2 and 4 all ending backward at 38.11 MiB:
// 8-bit AdamW 8 x 1 predicted 24.85 MiB from the loss line, ran 28.85;
// offload 8 x 1 predicted 20.05, ran 24.05). A later micro-batch of an
// accumulated step had the opposite error: its backward phase line plus
// every gradient byte counted the gradients twice where that line is the
// end of backward (8-bit AdamW 2 x 8: 33.40 MiB predicted, 29.51 ran).
// Approach: each probe replays its backward (probes/backward_activation_
// peak.h) and finds (a) the moment where live bytes less the gradients
// made so far are highest: 30.40, 32.21 and 35.84 MiB there, a line of
// 1.81 MiB per sample that reaches 43.09 at 8, as plain 8 x 1 measures;
// and (b) the highest live bytes of the same backward run as a later
// micro-batch, less the stored gradients: there each new gradient is
// added into the stored one and freed once its autograd node has run
// ("AccumulateGrad sets sequence_nr to the max value so it's always called
// ASAP during backwards", torch/csrc/autograd/functions/accumulate_grad.cpp;
// in place, as grad mode is off in backward). A step's first micro-batch
// peaks at the larger of (a) and the phase lines; a later one at (b) + the
// gradient bytes, or its forward or loss line + the gradient bytes. (b) is
// itself the larger of a moment that does not grow (a large gradient
// pending) and one that does (the activations): where the probes saw only
// the first, its line misses the second (8-bit AdamW + checkpointing 8 x 2
// predicted 33.07 MiB, ran out of memory at 36.19), so (a) less the
// gradients made by then, + the gradient bytes, a moment of the same later
// micro-batch, bounds it too. Probes that did not measure them (no event
// stream) leave the phase-line rules as they were.

// Note [Step time]
// A step of k micro-batches runs forward, loss and backward k times and the
// optimizer once. Probes run one micro-batch per step, so each probe's step
// time is split at the optimizer hook (probes/probe_report.h,
// StepTiming::optimizer_seconds): the micro-batch line is fitted to the
// rest, and the optimizer's seconds are counted once per global batch.
// Counting them k times, as one line through whole steps did, charged
// accumulation for optimizer steps it does not run, and a strategy that
// slows the optimizer (8-bit AdamW's quantization, offload's host step)
// was scaled with the micro-batch as if it slowed the model (ResNet-18 on
// the 2-core CPU: 8-bit AdamW + bf16 32 x 1 predicted at 0.56 s from a
// time ratio measured at micro-batch 4, measured 0.28 s). A strategy
// probed at two sizes scales the line's intercept and slope by the ratios
// of its own line's (search/fit.cpp, probe_effect): bf16 autocast casts the weights once
// per micro-batch and saves per sample, so one ratio from small probes
// over-predicted it at large micro-batches (small test GPT: by 70-146 %;
// with lines, -42 to +8 %; docs/autotune.md, "Time model").
StepPrediction predict(const StepModels& m, const TrainingConfig& c, int64_t global_batch) {
  PhaseLines lines = m.phases;
  ActivationLines activation{m.backward_activation, m.accumulating_backward};
  TimeFactors time;
  TrainingConfig reference;
  reference.precision = m.base_precision;
  for (const StrategyRow& row : strategy_table()) {
    if (!row.used(c, reference)) continue;
    const double fraction =
        row.id == Strategy::kCheckpointing ? checkpointed_fraction(c.checkpoint, m.checkpoint_blocks) : 1;
    apply(m.effect(row.id), fraction, lines, activation, time);
  }
  const auto b = static_cast<double>(c.micro_batch);
  // The micro-batches of one step: the first runs without gradients; every
  // later one (the last may be a smaller remainder) runs with the gradients
  // of the earlier ones alive through its forward and backward (measured
  // on the example GPT: 16 x 2 peaked 4.03 MiB = its gradient bytes above
  // 16 x 1).
  const int64_t steps = micro_batch_count(global_batch, c.micro_batch);
  const int64_t last = global_batch - (steps - 1) * c.micro_batch;
  std::vector<std::pair<double, bool>> micro_batches = {{b, false}};  // (size, gradients alive)
  if (steps > 2) micro_batches.push_back({b, true});
  if (steps > 1) micro_batches.push_back({static_cast<double>(last), true});
  const auto gradients = static_cast<double>(m.gradient_bytes);
  StepPrediction p;
  for (Phase phase : kStepPhases) {
    // Measured, backward's accumulating line says where the stored
    // gradients meet its activations (Note [Backward activation peak]).
    const bool adds_gradients =
        phase != Phase::kOptimizer && !(phase == Phase::kBackward && m.backward_activation_measured);
    for (const auto& [size, with_gradients] : micro_batches) {
      double bytes = lines[static_cast<std::size_t>(phase)](size);
      if (with_gradients && adds_gradients) bytes += gradients;
      p.peak_bytes = std::max(p.peak_bytes, bytes);
    }
  }
  if (m.backward_activation_measured) {
    for (const auto& [size, with_gradients] : micro_batches) {
      const double first = activation.first(size);
      const double bytes =
          with_gradients ? std::max(activation.later(size), first - m.backward_activation_gradient_bytes) + gradients
                         : first;
      p.peak_bytes = std::max(p.peak_bytes, bytes);
    }
  }
  const BatchLine seconds{m.seconds.intercept * time.intercept, m.seconds.slope * time.slope};
  p.seconds_per_global_batch = static_cast<double>(steps - 1) * std::max(0.0, seconds(b)) +
                               std::max(0.0, seconds(static_cast<double>(last))) + m.optimizer_seconds * time.optimizer;
  return p;
}

}  // namespace oomtune
