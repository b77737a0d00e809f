// The search's models: the base's lines from the plain probes and each
// strategy's effect from its own (search.h, Rules; model_fit.h).

#include "search/search_state.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"
#include "common/class_name.h"
#include "common/error.h"
#include "search/model_fit.h"
#include "search/sentences.h"
#include "strategies/job_config.h"

namespace oomtune::search_detail {
namespace {

// Bytes of one bf16 parameter element (c10/util/BFloat16.h: 16 bits), the
// weights' storage under bf16_params (Note [Parameters alone]).
constexpr int64_t kBf16ParameterBytes = 2;

// Rules: Work added (search.h): a strategy that only adds work and measured
// faster than the base measured noise. Left as it was, checkpointing ranked
// first (ResNet-50, 2-core CPU under load: 1.49 s vs plain 1.50 s), and
// offload, whose "host" on the CPU backend is the same memory, could too.
// Raises `effect`'s time ratios to 1 and says so, or returns "" where none
// was below.
std::string no_faster_than_without(const StrategyRow& row, StrategyEffect& effect) {
  std::vector<std::string> measured;
  if (effect.time_ratio < 1 || effect.time_slope_ratio < 1) {
    const std::string per_micro_batch = fmt::format("{:.3f}x", effect.time_ratio);
    const std::string per_sample = fmt::format("{:.3f}x", effect.time_slope_ratio);
    measured.push_back((per_micro_batch == per_sample
                            ? per_micro_batch
                            : per_micro_batch + " per micro-batch and " + per_sample + " per sample") +
                       " the plain step time");
  }
  if (effect.optimizer_time_ratio < 1)
    measured.push_back(fmt::format("{:.3f}x the plain optimizer step", effect.optimizer_time_ratio));
  if (measured.empty()) return "";
  effect.time_ratio = std::max(1.0, effect.time_ratio);
  effect.time_slope_ratio = std::max(1.0, effect.time_slope_ratio);
  effect.optimizer_time_ratio = std::max(1.0, effect.optimizer_time_ratio);
  return fmt::format(
      "{}: measured at {}; {} cannot make a step faster, so it is predicted at no less than 1x "
      "(timing noise)",
      row.probe_name, fmt::join(measured, " and "), row.only_adds_work);
}

// The name of bf16's probes in `form`: autocast (the row's), or bf16
// parameters (Note [bf16 fallback]).
std::string bf16_probe_name(Precision form) {
  return form == Precision::kBf16Params ? "bf16 parameters + fp32 master weights" : row_of(Strategy::kBf16).probe_name;
}

}  // namespace

// Probes one strategy at `sizes` and derives its effect on the lines of
// `reference`: the plain lines (models_), or those of plain with another
// strategy (Note [bf16 with checkpointing], memory_model.cpp).
StrategyEffect Search::probe_effect(const std::string& name, const TrainingConfig& config,
                                    const std::vector<int64_t>& sizes, const StepModels& reference) {
  // Seconds of the reference at micro-batch s: plain's as measured.
  const auto reference_seconds = [&](int64_t s) {
    if (&reference != &models_) return reference.seconds(static_cast<double>(s));
    const auto measured = plain_seconds_.find(s);
    return measured == plain_seconds_.end() ? 0.0 : measured->second;
  };
  std::vector<int64_t> ok_sizes;
  std::vector<std::array<double, kNumPhases>> peaks;
  std::vector<ProbeReport> ran;  // the probes of ok_sizes
  std::vector<double> time_ratios, optimizer_seconds, forward_backward;
  for (int64_t s : sizes) {
    const ProbeReport r = probe(config, s);
    if (r.outcome != TrialOutcome::kOk) {
      last_failure_ = r;
      // A larger size out of memory or time after a smaller one ran
      // (checkpointing recomputes, so it can pass trial_timeout where the
      // plain step did not): the effect is fitted to the sizes that ran,
      // with the plain slope. Every strategy keeps or lowers that slope, so
      // larger micro-batches are over-predicted, never under.
      if (!ok_sizes.empty() && fails_larger_too(r.outcome)) {
        result_.notes.push_back(
            fmt::format("{}: micro-batch {}: {}; fitted to micro-batch {} with the plain slope "
                        "(over-predicts larger micro-batches)",
                        name, s, outcome_of(r), fmt::join(ok_sizes, ", ")));
        break;
      }
      result_.notes.push_back(fmt::format("{}: not available (micro-batch {}: {})", name, s, outcome_of(r)));
      return {};
    }
    if (config.checkpoint.enabled()) models_.checkpoint_blocks = static_cast<int64_t>(r.checkpointed_blocks.size());
    ok_sizes.push_back(s);
    peaks.push_back(phase_peaks_of(r, job_));
    ran.push_back(r);
    forward_backward.push_back(forward_backward_seconds(r));
    if (const double base_time = reference_seconds(s); base_time > 0)
      time_ratios.push_back(forward_backward.back() / base_time);
    optimizer_seconds.push_back(r.timing.steady_optimizer_seconds);
  }
  const PhaseLines lines = fit_phase_lines(ok_sizes, peaks, &reference.phases);
  StrategyEffect effect;
  effect.available = true;
  for (Phase p : kStepPhases) {
    const auto i = static_cast<std::size_t>(p);
    const LineEffect e = line_effect(lines[i], reference.phases[i]);
    effect.shift_bytes[i] = e.shift_bytes;
    effect.slope_ratio[i] = e.slope_ratio;
  }
  std::vector<const ProbeReport*> probes;
  for (const ProbeReport& r : ran) probes.push_back(&r);
  StepModels own;  // the strategy's backward activation lines
  fit_backward_activation(own, probes, job_, reference.backward_activation.slope, reference.accumulating_backward.slope,
                          &reference.backward_levels);
  if (reference.backward_activation_measured && own.backward_activation_measured) {
    effect.backward_activation = line_effect(own.backward_activation, reference.backward_activation);
    effect.accumulating_backward = line_effect(own.accumulating_backward, reference.accumulating_backward);
  }
  // Note [Backward by gradients] (memory_model.cpp)
  if (!own.backward_levels.empty() && own.backward_levels.size() == reference.backward_levels.size())
    for (std::size_t k = 0; k < own.backward_levels.size(); ++k) {
      const LevelLines &mine = own.backward_levels[k], &base = reference.backward_levels[k];
      effect.backward_levels.push_back(
          {line_effect(mine.live, base.live), line_effect(mine.accumulating, base.accumulating)});
    }
  if (!time_ratios.empty()) effect.time_ratio = effect.time_slope_ratio = mean_of(time_ratios);
  // Two sizes: the ratios of the lines' intercepts and slopes, where both
  // lines rise (bf16 autocast casts the weights once per micro-batch and
  // halves the per-sample work: one ratio measured at small micro-batches
  // over-predicts it at large ones). Noise that tilts a line falls back
  // to the mean ratio.
  if (ok_sizes.size() >= 2 && time_ratios.size() == ok_sizes.size()) {
    const BatchLine own = fit_batch_line(ok_sizes, forward_backward);
    const BatchLine& base = reference.seconds;
    if (own.intercept > 0 && own.slope > 0 && base.intercept > 0 && base.slope > 0) {
      effect.time_ratio = own.intercept / base.intercept;
      effect.time_slope_ratio = own.slope / base.slope;
    }
  }
  // The optimizer step does not depend on the micro-batch: its ratio is to
  // the base's mean.
  if (reference.optimizer_seconds > 0)
    effect.optimizer_time_ratio = mean_of(optimizer_seconds) / reference.optimizer_seconds;
  return effect;
}

// Checkpointing every detected block; when the recompute operator refuses
// the blocks of one class (a forward that modifies its argument in place),
// the blocks of the other classes alone. Each retry checkpoints fewer
// blocks, so the loop ends.
StrategyEffect Search::probe_checkpointing(const std::vector<int64_t>& sizes) {
  TrainingConfig c = base_;
  c.checkpoint = checkpoint_every_block();
  std::vector<std::string> refused;
  for (;;) {
    StrategyEffect effect = probe_effect("activation checkpointing", c, sizes);
    if (effect.available) {
      checkpoint_all_ = c.checkpoint;
      if (!refused.empty()) checkpoint_label_ = fmt::format("all blocks but {}", fmt::join(refused, ", "));
      effect.optimizer_time_ratio = 1;  // recomputation happens in backward; the optimizer step is the same
      return effect;
    }
    const ProbeReport& r = last_failure_;
    if (r.refused_checkpoint_class.empty() || r.other_checkpointed_blocks.empty() ||
        r.other_checkpointed_blocks.size() >= r.checkpointed_blocks.size())
      return effect;
    refused.push_back(short_class_name(r.refused_checkpoint_class));
    c.checkpoint.mode = CheckpointPlan::Mode::kPaths;
    c.checkpoint.paths = r.other_checkpointed_blocks;
    result_.notes.push_back(fmt::format("activation checkpointing: trying the {} blocks of other classes than {}: {}",
                                        c.checkpoint.paths.size(), refused.back(),
                                        fmt::join(c.checkpoint.paths, ", ")));
  }
}

// "MODEL: the plain configuration could not run at micro-batch 1, 2 or 4:
// MESSAGE": the sizes whose probes failed as the smallest did, and the
// model's path said once.
std::string Search::nothing_ran_message(const PlainProbes& plain) const {
  const ProbeReport& first = plain.first_failure();
  std::vector<std::string> sizes;
  for (const auto& [s, r] : plain.failed)
    if (same_failure(r, first)) sizes.push_back(std::to_string(s));
  const std::string list = sizes.size() == 1
                               ? sizes.front()
                               : fmt::format("{} or {}", fmt::join(sizes.begin(), sizes.end() - 1, ", "), sizes.back());
  return fmt::format("{}: the plain configuration could not run at micro-batch {}: {}", job_.model_path, list,
                     without_model_path(first.message));
}

// The path where it starts the text or follows ": " ("error during loss:
// MODEL: ..."), not inside another path that ends with it.
std::string Search::without_model_path(std::string text) const {
  const std::string prefix = job_.model_path + ": ";
  if (text.rfind(prefix, 0) == 0) return text.erase(0, prefix.size());
  if (const std::size_t at = text.find(": " + prefix); at != std::string::npos) text.erase(at + 2, prefix.size());
  return text;
}

// Fits the models from the probes. False when nothing can run: plain and
// the configuration that needs the least memory ran out at the smallest
// micro-batch (result_.least_memory_failure says so).
bool Search::fit_models() {
  // Memory from meta: the probes time, at two sizes where the candidates
  // run (Note [Timing probes on meta], meta_memory.cpp).
  const std::vector<int64_t> sizes = meta_ ? timing_sizes() : probe_sizes(job_);
  PlainProbes plain = probe_plain(sizes);
  if (plain.ran.empty() && base_.precision == Precision::kBf16 && form_failed(plain.first_failure())) {
    // The job asks for bf16 and its autocast fails (Note [bf16 fallback]).
    result_.notes.push_back(bf16_fallback_note(plain.first_failure()));
    base_.precision = job_base_.precision = bf16_form_ = Precision::kBf16Params;
    plain = probe_plain(sizes);
  }
  // Note [Parameters alone]
  const ParametersFit parameters = check_parameters(plain);
  if (parameters == ParametersFit::kOver && plain.ran.empty()) return false;
  if (parameters == ParametersFit::kAsBf16Only) store_bf16_parameters(sizes, plain);
  if (plain.ran.empty() && needs_rescue(plain.first_failure())) {
    std::optional<PlainProbes> rescued = rescue(sizes, plain);
    if (!rescued) return false;
    plain = std::move(*rescued);
  }
  result_.baseline_name = rescue_strategies_.any() ? rescue_label(rescue_strategies_) : "plain";
  std::vector<int64_t> ok;
  std::vector<std::array<double, kNumPhases>> phase_peaks;
  std::vector<const ProbeReport*> ran;
  std::vector<double> peaks, seconds, optimizer_seconds;
  for (const auto& [s, r] : plain.ran) {
    ok.push_back(s);
    phase_peaks.push_back(phase_peaks_of(r, job_));
    ran.push_back(&r);
    peaks.push_back(static_cast<double>(r.peak_bytes));
    seconds.push_back(forward_backward_seconds(r));
    plain_seconds_[s] = seconds.back();
    optimizer_seconds.push_back(r.timing.steady_optimizer_seconds);
    result_.parameter_count = r.parameter_count;
    result_.frozen_parameter_count = r.frozen_parameter_count;
    result_.static_memory = r.static_memory;
    models_.gradient_bytes = r.static_memory.gradient_bytes;
  }
  // The largest micro-batch below every one that ran whose probe erred.
  std::optional<std::pair<int64_t, ProbeReport>> error_below_ok;
  for (const auto& [s, r] : plain.failed)
    if (!ok.empty() && s < ok.front() && r.outcome == TrialOutcome::kError) error_below_ok.emplace(s, r);
  models_.base_precision = base_.precision;
  if (ok.empty()) throw InputError(nothing_ran_message(plain));
  if (error_below_ok) raise_min_micro_batch(error_below_ok->first, error_below_ok->second);
  // Note [An error that comes with the size]: the smallest such probe.
  for (const auto& [s, r] : plain.failed)
    if (fails_for_its_size(r, s)) {
      lower_max_micro_batch(s, r, s - 1);
      break;
    }
  // One size ran (the next one ran out of memory or time, or a rescued
  // base runs only at the smallest): its lines take the slope of its
  // retained activations per sample, not none. A lower bound (backward's
  // temporaries grow too); the probe out of memory bounds the base itself
  // (smallest_out_of_memory), and verification runs check the rest.
  PhaseLines one_point{};
  double per_sample = 0;
  if (ok.size() == 1) {
    one_point = retained_slopes(plain.ran.begin()->second);
    per_sample = one_point[static_cast<std::size_t>(Phase::kForward)].slope;
    result_.notes.push_back(
        fmt::format("{} ran at micro-batch {} only: its memory lines take the slope of its "
                    "retained activations, {} per sample (a lower bound)",
                    result_.baseline_name, ok.front(), format_bytes(static_cast<int64_t>(per_sample))));
  }
  models_.phases = fit_phase_lines(ok, phase_peaks, &one_point);
  fit_backward_activation(models_, ran, job_, one_point[kBackwardIndex].slope, one_point[kBackwardIndex].slope);
  models_.seconds = fit_time_line(ok, seconds);
  // A falling line says the probes' times are noise.
  if (const BatchLine free = fit_batch_line(ok, seconds, 0); free.slope < 0)
    result_.notes.push_back(fmt::format(
        "{}'s step times ({:.3g} s at micro-batch {}) fit {:.3g} s - {:.3g} s per sample, which no step runs (timing "
        "noise): taken as {:.3g} s + {:.3g} s per sample, the nearest line that never falls",
        result_.baseline_name, fmt::join(seconds, ", "), fmt::join(ok, ", "), free.intercept, -free.slope,
        models_.seconds.intercept, models_.seconds.slope));
  models_.optimizer_seconds = mean_of(optimizer_seconds);
  result_.baseline_optimizer_seconds = models_.optimizer_seconds;
  result_.baseline_peak = fit_batch_line(ok, peaks, per_sample);
  result_.baseline_seconds = models_.seconds;
  result_.baseline_backward_activation = backward_activation_of_tensors(ran, one_point[kBackwardIndex].slope);
  result_.baseline_micro_batches = ok;
  // Parameters alone over the budget end here, after the lines: the ZeRO
  // table takes plain's activations from them, or checkpointing's, probed
  // once for it (Note [Parameters alone]).
  if (parameters == ParametersFit::kOver) {
    if (row_of(Strategy::kCheckpointing).allowed(job_, base_)) {
      TrainingConfig c = base_;
      c.checkpoint = checkpoint_every_block();
      const ProbeReport r = probe(c, ok.front());
      result_.notes.push_back(fmt::format(
          "activation checkpointing (all blocks) probed at micro-batch {} for the ZeRO/FSDP table's activations "
          "only: {}",
          ok.front(),
          r.outcome == TrialOutcome::kOk ? fmt::format("{} retained", format_bytes(r.retained_activation_bytes))
                                         : outcome_of(r)));
    }
    return false;
  }

  const std::vector<int64_t> two(ok.begin(), ok.begin() + std::min<std::size_t>(2, ok.size()));
  const std::vector<int64_t> one(ok.begin(), ok.begin() + 1);
  // A rescued base (Note [Rescue]) already uses some strategies: those
  // are not probed again. Offload replaces a rescued 8-bit AdamW (the
  // frameworks offload full-precision Adam), so its effect is measured as
  // that swap; 8-bit AdamW is not tried on an offloaded base.
  for (const StrategyRow& row : strategy_table()) {
    // Note [Host budget] (host_budget.cpp); its note says why.
    if (row.id == Strategy::kOffload && row.allowed(job_, base_) && !offload_fits_host(result_.parameter_count))
      continue;
    if (!row.allowed(job_, base_)) {
      // An optimizer swapped in for AdamW cannot replace another family.
      const bool asked = row.id == Strategy::kAdamW8bit || (row.id == Strategy::kAdafactor && job_.allow_adafactor);
      if (asked && job_base_.optimizer != OptimizerKind::kAdamW)
        result_.notes.push_back(
            fmt::format("{}: not tried (the job trains with {})", row.probe_name, job_.optimizer.kind));
      continue;
    }
    if (row.only_adds_work != nullptr && plain_verified_at_global_batch()) {
      // Note [Plain's verification times it] (meta_memory.cpp)
      result_.notes.push_back(
          fmt::format("{}: not probed: plain {} x 1 ran its verification within the budget, and {} cannot make a "
                      "step faster than it",
                      row.probe_name, job_.global_batch, row.only_adds_work));
      continue;
    }
    TrainingConfig c = base_;
    row.turn_on(c, context());
    // With meta each strategy is timed once, where its nodes run (Note
    // [Timing probes on meta]).
    const std::vector<int64_t> sizes = meta_                  ? std::vector<int64_t>{strategy_timing_size(c, ok)}
                                       : row.probe_sizes >= 2 ? two
                                                              : one;
    StrategyEffect& effect = models_.effect(row.id);
    if (row.id == Strategy::kCheckpointing) {
      effect = probe_checkpointing(sizes);
    } else if (row.id == Strategy::kBf16) {
      effect = probe_bf16(sizes);
    } else {
      effect = probe_effect(row.probe_name, c, sizes);
    }
    if (row.only_adds_work != nullptr && effect.available) {
      std::string note = no_faster_than_without(row, effect);
      if (!note.empty()) result_.notes.push_back(std::move(note));
    }
  }
  // Meta measures each node, the pair included (Note [Memory from meta]).
  if (!meta_) probe_bf16_with_checkpointing(two);
  return true;
}

// Note [bf16 with checkpointing] (memory_model.cpp): bf16 with
// checkpointing every block, probed at the sizes of its two strategies'
// probes; its effect on checkpointing's lines.
void Search::probe_bf16_with_checkpointing(const std::vector<int64_t>& sizes) {
  const StrategyEffect& checkpointing = models_.effect(Strategy::kCheckpointing);
  if (!checkpointing.available || !models_.effect(Strategy::kBf16).available) return;
  TrainingConfig c = base_;
  c.precision = bf16_form_;
  c.checkpoint = checkpoint_all_;
  models_.bf16_on_checkpointing = probe_effect(bf16_probe_name(bf16_form_) + " with activation checkpointing", c, sizes,
                                               with_effect(models_, checkpointing));
}

// bf16 autocast on base_, else bf16 parameters with fp32 master weights
// (Note [bf16 fallback]).
StrategyEffect Search::probe_bf16(const std::vector<int64_t>& sizes) {
  TrainingConfig c = base_;
  c.precision = bf16_form_;  // bf16 parameters from the start: Note [Parameters alone]
  if (bf16_form_ == Precision::kBf16Params) return probe_effect(bf16_probe_name(bf16_form_), c, sizes);
  StrategyEffect effect = probe_effect(row_of(Strategy::kBf16).probe_name, c, sizes);
  if (!effect.available && form_failed(last_failure_)) {
    c.precision = Precision::kBf16Params;
    effect = probe_effect(bf16_probe_name(c.precision), c, sizes);
    if (effect.available) {
      bf16_form_ = Precision::kBf16Params;
      result_.notes.push_back(bf16_fallback_note(last_failure_));
    }
  }
  return effect;
}

// Note [Parameters alone]
// Rationale: every configuration the search can try keeps the weights on
// the device (checkpointing saves activations, 8-bit AdamW and offload the
// optimizer state, accumulation neither), so parameters whose cheapest
// storage alone exceeds the usable budget rule out one GPU before the
// strategies are probed. That is the answer to "does LLaMA-7B fit on a 24 GB
// GPU?", not a bad input: nothing fits one GPU (kExitNothingFits) and the
// ZeRO/FSDP table says how many GPUs sharding needs.
// Approach: the parameters' bytes are those the first plain probe that got
// past loading measured (trainable + frozen storages). The cheapest storage
// the job allows is bf16 parameters when its bf16 may take that form (bf16
// allowed on an fp32 job: the bf16 row; or precision = "bf16", whose
// autocast falls back to bf16 parameters: Note [bf16 fallback]): 2 bytes per
// parameter, frozen ones too (recipes/zero_estimate.h,
// stored_bytes_per_parameter: weights 2 under bf16_params), from the
// counts, or the measured bytes where those are less (frozen_dtype =
// "bf16", a job already on bf16_params). Over the budget even so: the
// search ends (result_.parameters_alone; lines from plain's probes when any
// ran, for the table's activations, and one probe of checkpointing every
// block at plain's smallest micro-batch that ran: a model that fits no GPU
// trains with it, and its retained activations, not plain's, decide whether
// sharding fits: LLaMA-7B at 2048 tokens retains 37.21 GiB plain, 1.34 GiB
// checkpointed, and only the latter lets ZeRO-3 fit a 12 GB GPU at all).
// Within it only as bf16 parameters:
// autocast keeps the fp32 weights and cannot fit, so bf16 is tried as bf16
// parameters from the start (store_bf16_parameters), before any "nothing
// fits" (the rescue's least-memory combination and the bf16 nodes use that
// form). When every plain probe ran out of memory while loading the weights,
// they exceed the probes' guard (at least the budget; autotune's is 4x the
// usable budget, so even half of them exceed 2x the budget): the search
// ends too, its counts from the meta run of plain (start_meta) when there
// is one (meta holds no memory, so it loads any model), else unknown (0):
// the command then prints no ZeRO table and says how to get one (device =
// "meta" counts the parameters without their memory).
// The same holds for the weights and their gradients together (every
// configuration keeps the gradients on the device too; optimizer offload
// moves the optimizer's state and step only): where they exceed the budget
// in fp32 and fit it in bf16, bf16 is tried as bf16 parameters from the
// start. LLaMA-7B at 40 GB (35.39 GiB usable): 25.10 GiB of fp32 weights fit,
// with their 25.10 GiB of fp32 gradients they do not, as bf16 parameters
// (12.55 + 12.55 GiB) they do; bf16 autocast, its fp32 weights and gradients
// on the device, fits in no configuration (offload + autocast +
// checkpointing: 51.39 GiB on meta), bf16 parameters with offload do.
// Limitations: the "nothing fits" end is for the weights only. Gradients
// (2 bytes per trainable parameter at least) need the device too, so a
// budget above the weights but below weights + gradients still runs the
// search, whose walk then ends in a measured or predicted "nothing fits".
// oomtune's own trials load the fp32 weights before casting them to bf16,
// so a bf16-parameters trial of a model whose fp32 weights exceed the
// budget runs out of memory while loading on a device with an enforced
// budget (CPU); on meta it measures the bf16 step.
Search::ParametersFit Search::check_parameters(const PlainProbes& plain) {
  const int64_t budget = result_.usable_budget_bytes;
  const ProbeReport* measured = nullptr;  // the probe that got past loading
  for (const auto* probes : {&plain.ran, &plain.failed})
    for (const auto& [s, r] : *probes)
      if (!measured && !ran_out_loading(r) && r.parameter_count + r.frozen_parameter_count > 0) measured = &r;
  const auto over = [&](const ProbeReport& counted, const std::string& reason) {
    result_.parameter_count = counted.parameter_count;
    result_.frozen_parameter_count = counted.frozen_parameter_count;
    result_.static_memory = counted.static_memory;
    if (plain.ran.empty() && !plain.failed.empty()) result_.smallest_micro_batch = plain.failed.begin()->first;
    result_.parameters_alone = fmt::format(
        "{}: no single-GPU configuration holds them (every strategy keeps the weights on the device)", reason);
    progress_("nothing fits one GPU: " + result_.parameters_alone);
    return ParametersFit::kOver;
  };
  const std::string usable =
      fmt::format("the usable budget ({}, after {:.0f} % headroom)", format_bytes(budget), 100 * job_.headroom);
  if (measured == nullptr) {
    if (plain.failed.empty() || !ran_out_loading(plain.first_failure())) return ParametersFit::kFit;
    // No probe got past loading: the counts of the meta run, if any.
    ProbeReport counted;
    for (const auto& [config, r] : meta_runs_)
      if (r.parameter_count + r.frozen_parameter_count > 0) {
        counted = r;
        break;
      }
    return over(counted, fmt::format("loading the weights ran out of memory ({}): the parameters alone exceed {}",
                                     plain.first_failure().message, usable));
  }
  const StaticMemory& m = measured->static_memory;
  const int64_t as_measured = m.parameter_bytes + m.frozen_parameter_bytes;
  const bool bf16_form = row_of(Strategy::kBf16).allowed(job_, job_base_) || job_base_.precision == Precision::kBf16 ||
                         job_base_.precision == Precision::kBf16Params;
  const int64_t as_bf16 = std::min(m.parameter_bytes, kBf16ParameterBytes * measured->parameter_count) +
                          std::min(m.frozen_parameter_bytes, kBf16ParameterBytes * measured->frozen_parameter_count);
  const int64_t cheapest = bf16_form ? as_bf16 : as_measured;
  if (cheapest > budget) {
    const std::string bytes = cheapest == as_measured
                                  ? format_bytes(cheapest)
                                  : fmt::format("{} as bf16 parameters, the least storage the job allows; {} measured",
                                                format_bytes(cheapest), format_bytes(as_measured));
    return over(*measured, fmt::format("the parameters alone ({}) exceed {}", bytes, usable));
  }
  if (as_measured > budget) {
    result_.notes.push_back(fmt::format(
        "the parameters alone ({} measured) exceed the usable budget ({}); as bf16 parameters they take {}, so bf16 "
        "is tried as bf16 parameters with fp32 master weights kept by the optimizer (precision = \"bf16_params\"): "
        "autocast keeps the fp32 weights",
        format_bytes(as_measured), format_bytes(budget), format_bytes(cheapest)));
    return base_.precision == Precision::kBf16Params ? ParametersFit::kFit : ParametersFit::kAsBf16Only;
  }
  // With their gradients, which every configuration keeps on the device too.
  const int64_t gradients = m.gradient_bytes;
  const int64_t gradients_as_bf16 = std::min(gradients, kBf16ParameterBytes * measured->parameter_count);
  if (bf16_form && as_measured + gradients > budget && as_bf16 + gradients_as_bf16 <= budget) {
    result_.notes.push_back(fmt::format(
        "the parameters and their gradients ({} + {} measured) exceed the usable budget ({}); as bf16 parameters "
        "they take {} + {}, so bf16 is tried as bf16 parameters with fp32 master weights kept by the optimizer "
        "(precision = \"bf16_params\"): autocast keeps fp32 weights and gradients",
        format_bytes(as_measured), format_bytes(gradients), format_bytes(budget), format_bytes(as_bf16),
        format_bytes(gradients_as_bf16)));
    return base_.precision == Precision::kBf16Params ? ParametersFit::kFit : ParametersFit::kAsBf16Only;
  }
  return ParametersFit::kFit;
}

// Bf16 as bf16 parameters from here on (Note [Parameters alone]): the
// strategy's form, or the job's own precision when it asked for bf16
// autocast (plain is then probed again in that form).
void Search::store_bf16_parameters(const std::vector<int64_t>& sizes, PlainProbes& plain) {
  bf16_form_ = Precision::kBf16Params;
  if (job_base_.precision != Precision::kBf16) return;
  base_.precision = job_base_.precision = Precision::kBf16Params;
  plain = probe_plain(sizes);
}

// A micro-batch that fails where a larger one runs fails for its size, not
// for memory (BatchNorm needs more than one value per channel): the search
// stays above the largest such size, so no node is built on it.
void Search::raise_min_micro_batch(int64_t size, const ProbeReport& report) {
  job_.min_micro_batch = std::max(job_.min_micro_batch, size + 1);
  result_.notes.push_back(
      fmt::format("micro-batch {} cannot run ({}), so the search uses micro-batches of {} or "
                  "more (min_micro_batch = {} in the job spec skips that probe)",
                  size, outcome_of(report), job_.min_micro_batch, job_.min_micro_batch));
  require_a_valid_micro_batch(fmt::format("micro-batch {} cannot run ({}), and ", size, outcome_of(report)));
}

// Note [An error that comes with the size]
// Rationale: some errors come with the micro-batch, not with memory: a CUDA
//   kernel whose grid dimension passes its limit at a large batch ("CUDA
//   error: invalid configuration argument"; the y and z grid dimensions
//   stop at 65535), or a kernel that indexes with 32 bits past 2^31
//   elements. Users of batch-size finders ask for a ceiling for this
//   reason (Lightning #11295, #20614: `max_micro_batch` in the job spec).
//   Without one the search built every node at the global batch and
//   verified each in turn, the same error every time, and chose nothing
//   where half the micro-batch with accumulation would have run.
// Approach: a probe or verification that fails with an error that is not
//   about the user's input (TrialOutcome::kError, not input_error) at a
//   micro-batch above every one that ran fails for its size. A plain
//   probe's ends the walk up (the walk goes down for a second point where
//   one size ran), and the search keeps below it: max_micro_batch becomes
//   one less, with a note. Where every plain probe erred (none about the
//   input), the probes go down from the smallest, halving, as after an
//   out-of-memory: with memory from meta they sit where the candidates run
//   (G/2 and G), where a size's error shows first; before, autotune ended
//   there with "the plain configuration could not run at micro-batch 16 or
//   32", exit 2. A verification's lowers max_micro_batch to the
//   largest micro-batch that ran (the sizes between are untried), and the
//   tree is walked again below it (choose.cpp); verifications already run
//   are not run again. So one such error costs one trial, and a second walk
//   at the most.
// Limitations: an error at some size that then runs at a larger one is not
//   a size's (it drops that trial only); a crash (a signal) is never taken
//   for one, nor is an out-of-memory.
bool Search::fails_for_its_size(const ProbeReport& report, int64_t size) const {
  return report.outcome == TrialOutcome::kError && !report.input_error && largest_ran_micro_batch_ > 0 &&
         size > largest_ran_micro_batch_;
}

// Keeps the search at `ceiling` or below, after micro-batch `size` failed
// for its size (Note [An error that comes with the size]).
void Search::lower_max_micro_batch(int64_t size, const ProbeReport& report, int64_t ceiling) {
  job_.max_micro_batch = std::min(largest_micro_batch(job_), ceiling);
  result_.notes.push_back(fmt::format(
      "micro-batch {} cannot run ({}) where {} ran: an error that comes with the size, not with memory (a kernel's "
      "launch or indexing limit), so the search uses micro-batches of {} or less (max_micro_batch = {} in the job "
      "spec skips that run)",
      size, outcome_of(report), largest_ran_micro_batch_, *job_.max_micro_batch, *job_.max_micro_batch));
  require_a_valid_micro_batch(fmt::format("micro-batch {} cannot run ({}), and ", size, outcome_of(report)));
}

// The constraints (global batch, min/max micro-batch, remainder) leave at
// least one micro-batch, else no configuration exists: a bad input.
void Search::require_a_valid_micro_batch(const std::string& cause) const {
  if (!valid_micro_batches(job_).empty()) return;
  const int64_t top = largest_micro_batch(job_);
  if (job_.min_micro_batch > top)  // no size at all: a remainder would not help
    throw InputError(fmt::format("{}: {}no micro-batch is left: min_micro_batch {} is above the {} {}",
                                 job_.spec_path.empty() ? job_.model_path : job_.spec_path, cause, job_.min_micro_batch,
                                 top == job_.global_batch ? "global batch" : "max_micro_batch", top));
  throw InputError(
      fmt::format("{}: {}no micro-batch from {} to {} divides the global batch {} (change "
                  "min_micro_batch / max_micro_batch, or set remainder = \"last_smaller\")",
                  job_.spec_path.empty() ? job_.model_path : job_.spec_path, cause, job_.min_micro_batch,
                  largest_micro_batch(job_), job_.global_batch));
}

// Note [bf16 fallback]
// TorchScript's autocast pass crashes or fails on some models (measured
// on an H100: a scripted ViT-B/16 under bf16 autocast died by SIGSEGV;
// with the pass off it raised a dtype mismatch). When a bf16-autocast
// probe fails for any reason but memory, bf16 is tried as bf16
// parameters with fp32 master weights kept by the optimizer
// (Precision::kBf16Params, DeepSpeed's bf16 mode), and the report says
// which form ran and why.
bool form_failed(const ProbeReport& r) {
  return r.outcome != TrialOutcome::kOk && r.outcome != TrialOutcome::kOutOfMemory;
}

}  // namespace oomtune::search_detail
