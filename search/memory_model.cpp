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

// Backward's activation lines and its lines by gradients made (StepModels)
// of one configuration.
struct ActivationLines {
  BatchLine first, later;
  std::vector<LevelLines> levels;
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
  const bool per_level = e.backward_levels.size() == activation.levels.size();
  for (std::size_t k = 0; k < activation.levels.size(); ++k) {
    const LevelEffect level =
        per_level ? e.backward_levels[k] : LevelEffect{e.backward_activation, e.accumulating_backward};
    move(activation.levels[k].live, f, level.live);
    move(activation.levels[k].accumulating, f, level.accumulating);
  }
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

BatchLine fit_time_line(const std::vector<int64_t>& micro_batches, const std::vector<double>& seconds) {
  const BatchLine line = fit_batch_line(micro_batches, seconds, 0);
  if (line.slope >= 0) return line;
  // With the slope held at 0, least squares is the mean.
  double sum = 0;
  for (double s : seconds) sum += s;
  return {sum / static_cast<double>(seconds.size()), 0};
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

// Note [Backward by gradients]
// Rationale: backward's peak moves with the micro-batch among moments that
// hold different gradients, and its two lines above see two of them. With
// every block checkpointed (small test GPT, AdamW, 2-core CPU) backward
// peaked at 2.585, 2.752, 3.188 and 4.059 MiB at micro-batches 1, 2, 4 and
// 8: at 1 at its end, at 8 while recomputing the first block, when most
// gradients exist but not all, a third moment. The probes at 1 and 2
// predicted 8 x 1 at 3.868 MiB (the activation line), 4.7 % short; 8-bit
// AdamW and offload with checkpointing 6.1 % and 6.9 %. A later micro-batch
// had the same fault the other way: one accumulating line through the
// probes at 2, 4 and 8 (gpt_wide), which meet a large pending gradient at 2
// and the activations at 8, over-predicted 8-bit AdamW 4 x 4 by 4.5 %, and
// the activation line less the gradients made by plain's activation moment
// (none) over-predicted checkpointing's, whose moment holds 0.125 MiB of
// them (accumulation with checkpointing 4 x 2, small GPT: +1.8 %).
// Approach: each probe keeps, between each two gradients made, backward's
// highest live bytes and the same span's highest as a later micro-batch
// runs it (probes/memory_records.h, GradientLevel). The parameters'
// gradients are made in the same order at every size, so level k is the
// same span of backward in every probe: a line per level through the
// probes, and a step's first micro-batch peaks at the largest of them, a
// later one at the largest accumulating line (at least each level's live
// line less the gradients made by then) plus every gradient byte. Each
// level's lines meet its probes, and the largest is where the peak has
// moved to. Where levels were measured they replace backward's two
// activation lines for a later micro-batch; for the first they add to the
// phase lines and replace none of those (between two probes the line
// through backward's peaks lies above the levels'). A strategy moves each
// level by its own level's lines where its probes measured as many levels,
// else by its activation lines' effects. Measured (2-core CPU, Debian's
// 1.13): every node of the small GPT at 8 and of gpt_wide at 16 whose
// checkpointing is all blocks or none within 4 bytes of its run, the
// scaled loss an accumulated backward holds (loss / k; a probe's is the
// loss itself), accumulation with checkpointing 260 bytes.

// Note [Part of the blocks checkpointed]
// Rationale: a plan that checkpoints part of the blocks (the first n, every
// k-th) takes that share of checkpointing's effect on each line. On a line
// that is one moment of backward at every size, such as a level, that is
// the moment's own bytes. Backward's phase line and its activation line
// are not: plain's peak while every activation is held, checkpointing's
// while it recomputes a block, and half of the way from one to the other
// holds neither. Checkpointing the first of 2 blocks (small test GPT, 8 x
// 1, 2-core CPU) was predicted at 5.022 MiB from the activation line and
// ran 4.943, at level 0 as plain does (+1.6 %); the example GPT's first 2
// of 4 at 32 x 1, 82.27 MiB for 81.48 (+1.0 %).
// Approach: where levels are measured, a partial plan's backward peaks on
// its levels alone, which cover every moment of backward: 4.943 and 81.480
// MiB, to the byte, and the first 3 of 4 at 61.700.

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
StepModels with_effect(const StepModels& m, const StrategyEffect& effect) {
  StepModels out = m;
  ActivationLines activation{m.backward_activation, m.accumulating_backward, m.backward_levels};
  TimeFactors time;
  apply(effect, 1, out.phases, activation, time);
  out.backward_activation = activation.first;
  out.accumulating_backward = activation.later;
  out.backward_levels = activation.levels;
  out.seconds = {m.seconds.intercept * time.intercept, m.seconds.slope * time.slope};
  out.optimizer_seconds = m.optimizer_seconds * time.optimizer;
  return out;
}

// Note [bf16 with checkpointing]
// Rationale: bf16's effect measured without checkpointing shrinks the
// activations of whole blocks, their insides mostly matmul outputs that
// bf16 halves; with checkpointing the bytes left are mostly what it keeps
// (the blocks' inputs, the logits, the loss's fp32 copies), which bf16
// shrinks less. Multiplied into checkpointing's lines, it under-predicted
// the pair (Debian's 1.13, 2-core CPU): the small test GPT at 16 x 1 by
// 6.9 %, 8.3 % and 9.0 % (alone, with 8-bit AdamW, with offload), the
// example GPT at 32 x 1 by 15.0 %, 17.5 % and 18.6 % (35.43 MiB predicted,
// 41.66 run).
// Approach: wherever the lines measure both strategies (not on meta, which
// measures each node), the search probes bf16 with checkpointing every
// block at their probes' sizes (search/fit.cpp,
// probe_bf16_with_checkpointing), and that pair's effect on checkpointing's
// lines replaces bf16's for the share of the blocks a configuration
// checkpoints (both for first-n or every-k plans: bf16's for 1 - f, the
// pair's for f). Two probes more, at small micro-batches.
StepPrediction predict(const StepModels& m, const TrainingConfig& c, int64_t global_batch) {
  PhaseLines lines = m.phases;
  ActivationLines activation{m.backward_activation, m.accumulating_backward, m.backward_levels};
  TimeFactors time;
  TrainingConfig reference;
  reference.precision = m.base_precision;
  const double checkpointed = row_of(Strategy::kCheckpointing).used(c, reference)
                                  ? checkpointed_fraction(c.checkpoint, m.checkpoint_blocks)
                                  : 0;
  for (const StrategyRow& row : strategy_table()) {
    if (!row.used(c, reference)) continue;
    if (row.id == Strategy::kCheckpointing) {
      apply(m.effect(row.id), checkpointed, lines, activation, time);
    } else if (row.id == Strategy::kBf16 && m.bf16_on_checkpointing.available) {
      apply(m.effect(row.id), 1 - checkpointed, lines, activation, time);
      apply(m.bf16_on_checkpointing, checkpointed, lines, activation, time);
    } else {
      apply(m.effect(row.id), 1, lines, activation, time);
    }
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
  // Note [Part of the blocks checkpointed]
  const bool levels_alone = !activation.levels.empty() && checkpointed > 0 && checkpointed < 1;
  StepPrediction p;
  for (Phase phase : kStepPhases) {
    if (phase == Phase::kBackward && levels_alone) continue;
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
  if (m.backward_activation_measured && !levels_alone) {
    for (const auto& [size, with_gradients] : micro_batches) {
      const double first = activation.first(size);
      if (!with_gradients) {
        p.peak_bytes = std::max(p.peak_bytes, first);
      } else if (activation.levels.empty()) {  // else the levels bound it (Note [Backward by gradients])
        const double later = std::max(activation.later(size), first - m.backward_activation_gradient_bytes);
        p.peak_bytes = std::max(p.peak_bytes, later + gradients);
      }
    }
  }
  // Note [Backward by gradients]
  for (const LevelLines& level : activation.levels)
    for (const auto& [size, with_gradients] : micro_batches) {
      const double live = level.live(size);
      const double later = std::max(level.accumulating(size), live - level.gradient_bytes) + gradients;
      p.peak_bytes = std::max(p.peak_bytes, with_gradients ? later : live);
    }
  const BatchLine seconds{m.seconds.intercept * time.intercept, m.seconds.slope * time.slope};
  p.seconds_per_global_batch = static_cast<double>(steps - 1) * std::max(0.0, seconds(b)) +
                               std::max(0.0, seconds(static_cast<double>(last))) + m.optimizer_seconds * time.optimizer;
  return p;
}

}  // namespace oomtune
