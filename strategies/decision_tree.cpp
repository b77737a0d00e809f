#include "strategies/decision_tree.h"

#include <algorithm>
#include <array>
#include <bitset>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"
#include "common/class_name.h"
#include "common/error.h"
#include "common/seconds_text.h"
#include "strategies/accumulation.h"
#include "strategies/job_config.h"

namespace oomtune {
namespace {

CheckpointPlan checkpoint_every_block() {
  CheckpointPlan plan;
  plan.mode = CheckpointPlan::Mode::kAll;
  return plan;
}

// A probe's bytes against the budget: on CUDA scaled by the caching
// allocator's predicted reserved / allocated ratio (a job runs out of
// memory when it cannot reserve more, not when live tensors reach the
// budget), elsewhere the allocated bytes the counting allocator enforces.
double budget_scale(const ProbeReport& r, const JobSpec& job) {
  if (job.device == "cuda" && r.reserved && r.peak_bytes > 0)
    return static_cast<double>(r.reserved->peak_reserved_bytes) / static_cast<double>(r.peak_bytes);
  return 1;
}

// A probe's peak per phase, against the budget (budget_scale).
std::array<double, kNumPhases> phase_peaks_of(const ProbeReport& r, const JobSpec& job) {
  const double scale = budget_scale(r, job);
  std::array<double, kNumPhases> peaks{};
  for (Phase p : kStepPhases)
    peaks[static_cast<std::size_t>(p)] = scale * static_cast<double>(r.phases[static_cast<std::size_t>(p)].peak_bytes);
  return peaks;
}

constexpr auto kBackwardIndex = static_cast<std::size_t>(Phase::kBackward);

// The mean of a non-empty `values`.
double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

// Whether every probe measured backward's activation peak (it needs the
// event stream).
bool measured_backward_activation(const std::vector<const ProbeReport*>& probes) {
  return !probes.empty() && std::all_of(probes.begin(), probes.end(), [](const ProbeReport* r) {
    return r->backward_activation_peak.live_bytes > 0;
  });
}

// Fits `m`'s backward activation lines (StepModels::backward_activation,
// accumulating_backward and the gradient bytes) to `probes`, their bytes
// against the budget (budget_scale); with one probe, of slopes
// `first_fallback` and `later_fallback`. Leaves them unmeasured when a probe
// did not measure them.
void fit_backward_activation(StepModels& m, const std::vector<const ProbeReport*>& probes, const JobSpec& job,
                             double first_fallback, double later_fallback) {
  m.backward_activation_measured = measured_backward_activation(probes);
  if (!m.backward_activation_measured) return;
  std::vector<int64_t> sizes;
  std::vector<double> first, later, gradients;
  for (const ProbeReport* r : probes) {
    const double scale = budget_scale(*r, job);
    const BackwardActivationPeak& a = r->backward_activation_peak;
    sizes.push_back(r->micro_batch);
    first.push_back(scale * static_cast<double>(a.live_bytes));
    later.push_back(scale * static_cast<double>(a.accumulating_bytes));
    gradients.push_back(scale * static_cast<double>(a.gradient_bytes));
  }
  m.backward_activation = fit_batch_line(sizes, first, first_fallback);
  m.accumulating_backward = fit_batch_line(sizes, later, later_fallback);
  m.backward_activation_gradient_bytes = mean(gradients);
}

// Of a probe's step, the micro-batch's part: without the optimizer step
// (memory_model.cpp, Note [Step time]).
double forward_backward_seconds(const ProbeReport& r) {
  return std::max(0.0, r.timing.steady_step_seconds - r.timing.steady_optimizer_seconds);
}

std::vector<int64_t> probe_sizes(const JobSpec& job) {
  const int64_t g = job.global_batch;
  const int64_t top = largest_micro_batch(job);
  const int64_t bottom = std::min(job.min_micro_batch, top);  // e.g. BatchNorm needs more than one sample
  std::set<int64_t> sizes;
  for (int64_t s : {g / 8, g / 4, g / 2}) sizes.insert(std::clamp<int64_t>(s, bottom, top));
  if (sizes.size() < 2 && top > bottom) sizes.insert(std::min<int64_t>(bottom + 1, top));
  return {sizes.begin(), sizes.end()};
}

// Weights that ran out of memory while loading: no micro-batch can help.
bool ran_out_loading(const ProbeReport& r) {
  return r.outcome == TrialOutcome::kOutOfMemory && r.phase_at_failure == phase_name(Phase::kLoad);
}

// A failure every larger micro-batch would repeat: it needs more memory, or
// its steps take longer than ones that already ran past the trial timeout.
bool fails_larger_too(TrialOutcome outcome) {
  return outcome == TrialOutcome::kOutOfMemory || outcome == TrialOutcome::kTimeout;
}

// The micro-batches below `below` that the plain probes step down to when
// fewer than two ran: halving, then the job's smallest, in descending order.
std::vector<int64_t> step_down_sizes(const JobSpec& job, int64_t below) {
  const int64_t bottom = std::min(job.min_micro_batch, largest_micro_batch(job));
  std::vector<int64_t> sizes;
  for (int64_t s = below / 2; s > bottom; s /= 2) sizes.push_back(s);
  if (bottom < below) sizes.push_back(bottom);
  return sizes;
}

TrainingConfig with_micro_batch(TrainingConfig c, int64_t micro_batch, int64_t global_batch) {
  c.micro_batch = micro_batch;
  c.accumulation_steps = micro_batch_count(global_batch, micro_batch);
  return c;
}

std::string describe(const TrainingConfig& c) {
  std::vector<std::string> parts;
  parts.push_back(fmt::format("micro-batch {} x {}", c.micro_batch, c.accumulation_steps));
  if (c.checkpoint.enabled()) parts.push_back("ckpt " + to_string(c.checkpoint));
  parts.push_back(to_string(c.optimizer));
  if (c.offload_optimizer) parts.push_back("offload");
  parts.push_back(to_string(c.precision));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// Strategies a configuration uses beyond the job's own: accumulation,
// checkpointing, a different optimizer, offload, a different precision.
int strategy_count(const TrainingConfig& c, const TrainingConfig& job_base) {
  return (c.accumulation_steps > 1) + c.checkpoint.enabled() + (c.optimizer != job_base.optimizer) +
         c.offload_optimizer + (c.precision != job_base.precision);
}

class Search {
 public:
  Search(const JobSpec& job, TrialRunner& runner, const SearchOptions& options,
         const std::function<void(const std::string&)>& progress)
      : job_(job), runner_(runner), options_(options), progress_(progress) {
    base_.micro_batch = job.global_batch;
    base_.optimizer = parse_optimizer(job.optimizer.kind);
    base_.precision = parse_precision(job.precision);
    job_base_ = base_;
  }

  SearchResult run() {
    if (!job_.usable_budget_bytes())
      throw InputError(fmt::format("{}: autotune needs a memory budget (budget = \"8GiB\" or --budget)",
                                   job_.spec_path.empty() ? "job" : job_.spec_path));
    result_.usable_budget_bytes = *job_.usable_budget_bytes();
    require_a_valid_micro_batch("");
    if (fit_models()) {
      walk_tree();
      verify_candidates();
    }
    return std::move(result_);
  }

 private:
  ProbeReport probe(TrainingConfig config, int64_t micro_batch) {
    config.micro_batch = micro_batch;
    config.accumulation_steps = 1;
    ProbeReport r = runner_.probe(config);
    progress_(fmt::format("probe  {:<60} {}", describe(config),
                          r.outcome == TrialOutcome::kOk
                              ? fmt::format("peak {}, {:.4f} s/step", format_bytes(r.peak_bytes),
                                            r.timing.steady_step_seconds)
                              : outcome_text(r)));
    if (r.outcome == TrialOutcome::kOutOfMemory && !ran_out_loading(r)) {
      auto [at, added] = out_of_memory_at_.emplace(memory_key(config), micro_batch);
      if (!added) at->second = std::min(at->second, micro_batch);
    }
    result_.probes.push_back(r);
    return r;
  }

  // Probes one strategy at `sizes` and derives its effect on the plain lines.
  StrategyEffect probe_effect(const std::string& name, const TrainingConfig& config,
                              const std::vector<int64_t>& sizes) {
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
          result_.notes.push_back(fmt::format("{}: micro-batch {}: {}; fitted to micro-batch {} with the plain slope "
                                              "(over-predicts larger micro-batches)",
                                              name, s, outcome_text(r), fmt::join(ok_sizes, ", ")));
          break;
        }
        result_.notes.push_back(fmt::format("{}: not available (micro-batch {}: {})", name, s, outcome_text(r)));
        return {};
      }
      if (config.checkpoint.enabled()) models_.checkpoint_blocks = static_cast<int64_t>(r.checkpointed_blocks.size());
      ok_sizes.push_back(s);
      peaks.push_back(phase_peaks_of(r, job_));
      ran.push_back(r);
      forward_backward.push_back(forward_backward_seconds(r));
      const auto base_time = plain_seconds_.find(s);
      if (base_time != plain_seconds_.end() && base_time->second > 0)
        time_ratios.push_back(forward_backward.back() / base_time->second);
      optimizer_seconds.push_back(r.timing.steady_optimizer_seconds);
    }
    const PhaseLines lines = fit_phase_lines(ok_sizes, peaks, &models_.phases);
    StrategyEffect effect;
    effect.available = true;
    // A line's effect: its intercept's shift and its slope's ratio to the base's.
    const auto line_effect = [](const BatchLine& own, const BatchLine& base) {
      return LineEffect{own.intercept - base.intercept, base.slope > 0 ? std::max(0.0, own.slope / base.slope) : 1};
    };
    for (Phase p : kStepPhases) {
      const auto i = static_cast<std::size_t>(p);
      const LineEffect e = line_effect(lines[i], models_.phases[i]);
      effect.shift_bytes[i] = e.shift_bytes;
      effect.slope_ratio[i] = e.slope_ratio;
    }
    std::vector<const ProbeReport*> probes;
    for (const ProbeReport& r : ran) probes.push_back(&r);
    StepModels own;  // the strategy's backward activation lines
    fit_backward_activation(own, probes, job_, models_.backward_activation.slope,
                            models_.accumulating_backward.slope);
    if (models_.backward_activation_measured && own.backward_activation_measured) {
      effect.backward_activation = line_effect(own.backward_activation, models_.backward_activation);
      effect.accumulating_backward = line_effect(own.accumulating_backward, models_.accumulating_backward);
    }
    if (!time_ratios.empty()) effect.time_ratio = effect.time_slope_ratio = mean(time_ratios);
    // Two sizes: the ratios of the lines' intercepts and slopes, where both
    // lines rise (bf16 autocast casts the weights once per micro-batch and
    // halves the per-sample work: one ratio measured at small micro-batches
    // over-predicts it at large ones). Noise that tilts a line falls back
    // to the mean ratio.
    if (ok_sizes.size() >= 2 && time_ratios.size() == ok_sizes.size()) {
      const BatchLine own = fit_batch_line(ok_sizes, forward_backward);
      const BatchLine& base = models_.seconds;
      if (own.intercept > 0 && own.slope > 0 && base.intercept > 0 && base.slope > 0) {
        effect.time_ratio = own.intercept / base.intercept;
        effect.time_slope_ratio = own.slope / base.slope;
      }
    }
    // The optimizer step does not depend on the micro-batch: its ratio is to
    // the base's mean.
    if (models_.optimizer_seconds > 0)
      effect.optimizer_time_ratio = mean(optimizer_seconds) / models_.optimizer_seconds;
    return effect;
  }

  // Checkpointing every detected block; when the recompute operator refuses
  // the blocks of one class (a forward that modifies its argument in place),
  // the blocks of the other classes alone. Each retry checkpoints fewer
  // blocks, so the loop ends.
  StrategyEffect probe_checkpointing(const std::vector<int64_t>& sizes) {
    TrainingConfig c = base_;
    c.checkpoint = checkpoint_every_block();
    std::vector<std::string> refused;
    for (;;) {
      StrategyEffect effect = probe_effect("activation checkpointing", c, sizes);
      if (effect.available) {
        checkpoint_all_ = c.checkpoint;
        if (!refused.empty())
          checkpoint_label_ = fmt::format("all blocks but {}", fmt::join(refused, ", "));
        // Recomputation only adds work, so a step measured faster than the
        // plain one measured noise; left as it is, it ranked checkpointing
        // first (ResNet-50, 2-core CPU under load: 1.49 s vs plain 1.50 s).
        if (effect.time_ratio < 1 || effect.time_slope_ratio < 1) {
          const std::string per_micro_batch = fmt::format("{:.3f}x", effect.time_ratio);
          const std::string per_sample = fmt::format("{:.3f}x", effect.time_slope_ratio);
          const std::string measured = per_micro_batch == per_sample
                                           ? per_micro_batch
                                           : per_micro_batch + " per micro-batch and " + per_sample + " per sample";
          result_.notes.push_back(fmt::format("activation checkpointing: measured at {} the plain step time; "
                                              "recomputation cannot make a step faster, so it is predicted at no "
                                              "less than 1x (timing noise)",
                                              measured));
          effect.time_ratio = std::max(1.0, effect.time_ratio);
          effect.time_slope_ratio = std::max(1.0, effect.time_slope_ratio);
        }
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

  // The plain probes of fit_models, by micro-batch.
  struct PlainProbes {
    std::map<int64_t, ProbeReport> ran, failed;
    // The failure at the smallest micro-batch: its message explains the most.
    // Called when nothing ran, so at least one probe failed (probe_sizes is
    // never empty).
    const ProbeReport& first_failure() const { return failed.begin()->second; }
  };

  // Walks up `sizes`; a probe that runs out of memory or time ends the walk,
  // since larger micro-batches need more of both. When fewer than two sizes
  // ran by then (the probes' RAM guard is a multiple of the budget, so a
  // tight budget can stop the walk at G/8), it goes down from the smallest
  // size tried until two have run: two points fit the lines, and a budget
  // too small for G/8 is a "nothing fits" answer or a small micro-batch, not
  // an error. Down means halving after running out of memory (such a probe
  // stops at its first allocation over the guard, so it is cheap). When
  // nothing ran before a timeout, it goes up from the smallest micro-batch
  // instead and stops at the first one that fails for memory or time: each
  // timeout costs the whole trial_timeout (a model that hangs times out at
  // every size, and costs two).
  // `p` may hold probes of base_ that already ran; they are not run again.
  PlainProbes probe_plain(const std::vector<int64_t>& sizes, PlainProbes p = {}) {
    auto probe_at = [&](int64_t s) {
      if (const auto known = p.ran.find(s); known != p.ran.end()) return known->second.outcome;
      if (const auto known = p.failed.find(s); known != p.failed.end()) return known->second.outcome;
      ProbeReport r = probe(base_, s);
      // A model file that does not load will not load at any micro-batch.
      if (r.outcome == TrialOutcome::kError && r.input_error && r.phase_at_failure == phase_name(Phase::kLoad))
        throw InputError(r.message);
      const TrialOutcome outcome = r.outcome;
      (outcome == TrialOutcome::kOk ? p.ran : p.failed).emplace(s, std::move(r));
      return outcome;
    };
    std::optional<int64_t> stopped_at;
    for (int64_t s : sizes) {
      if (!fails_larger_too(probe_at(s))) continue;
      stopped_at = s;
      break;
    }
    if (p.ran.size() >= 2 || !stopped_at || ran_out_loading(p.failed.at(*stopped_at))) return p;
    std::vector<int64_t> down = step_down_sizes(job_, sizes.front());
    const bool up_from_smallest = p.ran.empty() && p.failed.at(*stopped_at).outcome == TrialOutcome::kTimeout;
    if (up_from_smallest) std::reverse(down.begin(), down.end());
    for (int64_t s : down) {
      const TrialOutcome outcome = probe_at(s);
      if (p.ran.size() >= 2) return p;
      if (up_from_smallest && fails_larger_too(outcome)) break;
    }
    // One size ran and the smaller ones erred (BatchNorm at 1), or the next
    // larger one failed: the second point lies between it and the smallest
    // larger size that failed for memory or time.
    if (p.ran.size() != 1) return p;
    const int64_t low = p.ran.begin()->first;
    int64_t high = *stopped_at;
    for (auto f = p.failed.upper_bound(low); f != p.failed.end(); ++f)
      if (fails_larger_too(f->second.outcome)) high = std::min(high, f->first);
    while (p.ran.size() < 2 && high - low > 1) {
      const int64_t middle = low + (high - low) / 2;
      if (!fails_larger_too(probe_at(middle))) break;
      high = middle;
    }
    return p;
  }

  // Fits the models from the probes. False when nothing can run: plain and
  // the configuration that needs the least memory ran out at the smallest
  // micro-batch (result_.least_memory_failure says so).
  bool fit_models() {
    const std::vector<int64_t> sizes = probe_sizes(job_);
    PlainProbes plain = probe_plain(sizes);
    if (plain.ran.empty() && base_.precision == Precision::kBf16 && form_failed(plain.first_failure())) {
      // The job asks for bf16 and its autocast fails (Note [bf16 fallback]).
      result_.notes.push_back(bf16_fallback_note(plain.first_failure()));
      base_.precision = job_base_.precision = bf16_form_ = Precision::kBf16Params;
      plain = probe_plain(sizes);
    }
    if (plain.ran.empty() && needs_rescue(plain.first_failure())) {
      std::optional<PlainProbes> rescued = rescue(sizes, plain);
      if (!rescued) return false;
      plain = std::move(*rescued);
    }
    result_.baseline_name = rescue_strategies_ ? rescue_label(rescue_strategies_) : "plain";
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
      result_.static_memory = r.static_memory;
      models_.gradient_bytes = r.static_memory.gradient_bytes;
    }
    // The largest micro-batch below every one that ran whose probe erred.
    std::optional<std::pair<int64_t, ProbeReport>> error_below_ok;
    for (const auto& [s, r] : plain.failed)
      if (!ok.empty() && s < ok.front() && r.outcome == TrialOutcome::kError) error_below_ok.emplace(s, r);
    models_.base_precision = base_.precision;
    // Parameters alone over the budget is a bad input (no single-device
    // configuration can hold them). Probes run under a looser RAM guard, so
    // the parameters are usually measured; when even loading the weights ran
    // out of memory under that guard, they are over the budget too.
    const auto parameters_alone = [&](const std::string& parameters) {
      return InputError(fmt::format("budget {} (after {:.0f} % headroom) is smaller than the parameters alone ({})",
                                    format_bytes(result_.usable_budget_bytes), 100 * job_.headroom, parameters));
    };
    if (ok.empty()) {
      const ProbeReport& failure = plain.first_failure();
      if (failure.static_memory.parameter_bytes > result_.usable_budget_bytes)
        throw parameters_alone(format_bytes(failure.static_memory.parameter_bytes));
      if (ran_out_loading(failure))
        throw parameters_alone(fmt::format("loading the weights ran out of memory: {}", failure.message));
      throw InputError(fmt::format("{}: the plain configuration could not run at micro-batch {}: {}", job_.model_path,
                                   plain.failed.begin()->first, failure.message));
    }
    if (result_.static_memory.parameter_bytes > result_.usable_budget_bytes)
      throw parameters_alone(format_bytes(result_.static_memory.parameter_bytes));
    if (error_below_ok) raise_min_micro_batch(error_below_ok->first, error_below_ok->second);
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
      result_.notes.push_back(fmt::format("{} ran at micro-batch {} only: its memory lines take the slope of its "
                                          "retained activations, {} per sample (a lower bound)",
                                          result_.baseline_name, ok.front(),
                                          format_bytes(static_cast<int64_t>(per_sample))));
    }
    models_.phases = fit_phase_lines(ok, phase_peaks, &one_point);
    fit_backward_activation(models_, ran, job_, one_point[kBackwardIndex].slope, one_point[kBackwardIndex].slope);
    models_.seconds = fit_batch_line(ok, seconds);
    models_.optimizer_seconds = mean(optimizer_seconds);
    result_.baseline_optimizer_seconds = models_.optimizer_seconds;
    result_.baseline_peak = fit_batch_line(ok, peaks, per_sample);
    result_.baseline_seconds = models_.seconds;
    result_.baseline_backward_activation = models_.backward_activation;
    result_.baseline_micro_batches = ok;

    const std::vector<int64_t> two(ok.begin(), ok.begin() + std::min<std::size_t>(2, ok.size()));
    const std::vector<int64_t> one(ok.begin(), ok.begin() + 1);
    // A rescued base (Note [Rescue]) already uses some strategies: those
    // are not probed again. Offload replaces a rescued 8-bit AdamW (the
    // frameworks offload full-precision Adam), so its effect is measured as
    // that swap; 8-bit AdamW is not tried on an offloaded base.
    if (!base_.checkpoint.enabled()) models_.checkpoint = probe_checkpointing(two);
    TrainingConfig c = base_;
    if (base_.optimizer == OptimizerKind::kAdamW && !base_.offload_optimizer) {
      c.optimizer = OptimizerKind::kAdamW8bit;
      models_.adamw8bit = probe_effect("8-bit AdamW", c, one);
    } else if (job_base_.optimizer != OptimizerKind::kAdamW) {
      result_.notes.push_back(fmt::format("8-bit AdamW: not tried (the job trains with {})", job_.optimizer.kind));
    }
    if (!base_.offload_optimizer) {
      c = base_;
      offload_optimizer(c);
      models_.offload = probe_effect("optimizer offload", c, one);
    }
    if (job_.allow_bf16 && base_.precision == Precision::kFp32) {
      c = base_;
      c.precision = Precision::kBf16;
      models_.bf16 = probe_effect("bf16 autocast", c, two);
      if (!models_.bf16.available && form_failed(last_failure_)) {
        c.precision = Precision::kBf16Params;
        models_.bf16 = probe_effect("bf16 parameters + fp32 master weights", c, two);
        if (models_.bf16.available) {
          bf16_form_ = Precision::kBf16Params;
          result_.notes.push_back(bf16_fallback_note(last_failure_));
        }
      }
    }
    return true;
  }

  // Offloads c's optimizer state: the job's optimizer, which replaces a
  // rescued 8-bit AdamW (the frameworks offload full-precision Adam).
  void offload_optimizer(TrainingConfig& c) const {
    c.optimizer = job_base_.optimizer;
    c.offload_optimizer = true;
  }

  // Lines whose forward, loss and backward slopes are r's retained
  // activations per sample: the slope of a line through r alone (a lower
  // bound: backward's temporaries grow with the micro-batch too).
  static PhaseLines retained_slopes(const ProbeReport& r) {
    PhaseLines lines{};
    for (Phase p : {Phase::kForward, Phase::kLoss, Phase::kBackward})
      lines[static_cast<std::size_t>(p)].slope =
          static_cast<double>(r.retained_activation_bytes) / static_cast<double>(r.micro_batch);
    return lines;
  }

  // Note [Rescue]
  // Plain out of memory at every micro-batch down to the smallest is the
  // case a user most needs answered (AdamW keeps 16 bytes per parameter:
  // weights, gradients and two moments of a 7B model do not fit an 80 GB
  // GPU). The strategies are then tried at that micro-batch. First the
  // combination that needs the least memory (checkpointing every block,
  // optimizer offload, and bf16 when allowed): when even it runs out, nothing
  // fits one device, measured (the probes' guard is at least the budget).
  // Otherwise the simplest combination that runs (fewest strategies, then
  // the tree's order) becomes the base in place of plain: its lines come from
  // its own probes, the other strategies' effects are measured on top of it,
  // and every node carries it. The other combinations of as many strategies
  // are probed there too (but the one the walk predicts: offload in place of
  // a rescued 8-bit AdamW): each that runs is probed at twice that
  // micro-batch as well and becomes a node of its own, fitted to its probes
  // (rescue_alternative_models), since a faster one may hide there
  // (checkpointing rescues, 8-bit AdamW alone also runs and does not
  // recompute). When the base recomputes (checkpointing) or moves state
  // to the host (offload), 8-bit AdamW + bf16, the one combination that
  // does neither, is such an alternative too, probed the same way. Other
  // larger combinations without the base are not predicted: plain gives no
  // line to predict them from, and the effects measured on the base did
  // not transfer (real gpt_small, checkpointing rescued: 8-bit AdamW's
  // lines plus bf16's effect on the base put 8-bit AdamW + bf16 at 6.02 MiB
  // at 8 x 1; it measured 4.49).
  static constexpr int kRescueCheckpoint = 1, kRescue8bit = 2, kRescueOffload = 4, kRescueBf16 = 8;

  static std::size_t count_of(int strategies) { return std::bitset<4>(static_cast<unsigned>(strategies)).count(); }

  bool needs_rescue(const ProbeReport& failure) const {
    return failure.outcome == TrialOutcome::kOutOfMemory && !ran_out_loading(failure) &&
           failure.static_memory.parameter_bytes <= result_.usable_budget_bytes;
  }

  // The job's configuration with the kRescue* `strategies`.
  TrainingConfig rescue_config(int strategies) const {
    TrainingConfig c = job_base_;
    if (strategies & kRescueCheckpoint) c.checkpoint = checkpoint_every_block();
    if (strategies & kRescue8bit) c.optimizer = OptimizerKind::kAdamW8bit;
    if (strategies & kRescueOffload) c.offload_optimizer = true;
    if (strategies & kRescueBf16) c.precision = bf16_form_;
    return c;
  }

  int strategies_of(const TrainingConfig& c) const {
    return (c.checkpoint.enabled() ? kRescueCheckpoint : 0) |
           (c.optimizer == OptimizerKind::kAdamW8bit ? kRescue8bit : 0) | (c.offload_optimizer ? kRescueOffload : 0) |
           (c.precision != job_base_.precision ? kRescueBf16 : 0);
  }

  std::string rescue_label(int strategies) const {
    std::vector<std::string> parts;
    if (strategies & kRescueCheckpoint) parts.push_back("checkpointing (all blocks)");
    if (strategies & kRescue8bit) parts.push_back("8-bit AdamW");
    if (strategies & kRescueOffload) parts.push_back("optimizer offload");
    if (strategies & kRescueBf16) parts.push_back(bf16_form_ == Precision::kBf16 ? "bf16" : "bf16 parameters");
    return fmt::format("{}", fmt::join(parts, " + "));
  }

  // A combination that runs without the rescued base (Note [Rescue]), as
  // probed (a later bf16 fallback does not rename it).
  struct RescueAlternative {
    std::string name;
    TrainingConfig config;
    std::vector<ProbeReport> probes;  // that ran: at the smallest micro-batch, and at twice it
  };

  // A rescue alternative's models (Note [Rescue]): memory lines through its
  // probes (through one, the slope of its retained activations, a lower
  // bound); the micro-batches' time the base's line scaled by the
  // alternative's mean measured ratio to it, as a strategy's time ratio
  // scales it (so the base and the alternative rank alike at other
  // micro-batches), and its optimizer step as measured (memory_model.cpp,
  // Note [Step time]).
  // Called after fit_models. No strategy effects: its configuration holds
  // its strategies.
  StepModels rescue_alternative_models(const RescueAlternative& alternative) const {
    StepModels m;
    std::vector<int64_t> sizes;
    std::vector<std::array<double, kNumPhases>> peaks;
    std::vector<const ProbeReport*> ran;
    std::vector<double> seconds, ratios, optimizer_seconds;
    for (const ProbeReport& r : alternative.probes) {
      sizes.push_back(r.micro_batch);
      peaks.push_back(phase_peaks_of(r, job_));
      ran.push_back(&r);
      seconds.push_back(forward_backward_seconds(r));
      optimizer_seconds.push_back(r.timing.steady_optimizer_seconds);
      const double base_seconds = models_.seconds(static_cast<double>(r.micro_batch));
      if (base_seconds > 0) ratios.push_back(seconds.back() / base_seconds);
    }
    m.optimizer_seconds = mean(optimizer_seconds);
    const PhaseLines slopes = retained_slopes(alternative.probes.front());
    m.phases = fit_phase_lines(sizes, peaks, &slopes);
    fit_backward_activation(m, ran, job_, slopes[kBackwardIndex].slope, slopes[kBackwardIndex].slope);
    if (ratios.size() == sizes.size()) {
      const double ratio = mean(ratios);
      m.seconds = {models_.seconds.intercept * ratio, models_.seconds.slope * ratio};
    } else {
      m.seconds = fit_batch_line(sizes, seconds);
    }
    m.gradient_bytes = alternative.probes.front().static_memory.gradient_bytes;
    m.base_precision = alternative.config.precision;
    return m;
  }

  // Records the combination `strategies` that `at_smallest` probed at
  // micro-batch `smallest` without the rescued base (Note [Rescue]): when it
  // ran, probed at twice that micro-batch too (a measured slope) and kept
  // for its node.
  void add_rescue_alternative(int strategies, const ProbeReport& at_smallest, int64_t smallest) {
    const std::string base = rescue_label(rescue_strategies_);
    if (at_smallest.outcome != TrialOutcome::kOk) {
      result_.notes.push_back(fmt::format("{} (without {}): not available (micro-batch {}: {})",
                                          rescue_label(strategies), base, smallest, outcome_text(at_smallest)));
      return;
    }
    RescueAlternative alternative{rescue_label(strategies), rescue_config(strategies), {at_smallest}};
    std::string second;
    if (2 * smallest <= largest_micro_batch(job_)) {
      ProbeReport r = probe(alternative.config, 2 * smallest);
      if (r.outcome == TrialOutcome::kOk)
        alternative.probes.push_back(std::move(r));
      else
        second = fmt::format("; micro-batch {}: {}", 2 * smallest, outcome_text(r));
    }
    const bool one = alternative.probes.size() == 1;
    result_.notes.push_back(fmt::format(
        "{} also runs at micro-batch {} (without {}{}): its node is fitted to {}, its time line is the base's times "
        "its measured ratio to it",
        alternative.name, one ? fmt::format("{}", smallest) : fmt::format("{} and {}", smallest, 2 * smallest), base,
        second,
        one ? "that one probe, its memory lines with the slope of its retained activations (a lower bound)"
            : "those probes"));
    rescue_alternatives_.push_back(std::move(alternative));
  }

  // Whether a rescue whose base is `strategies` probes 8-bit AdamW + bf16
  // as an alternative beyond those of as many strategies (Note [Rescue]):
  // when the base is checkpointing or offload alone, and the job allows
  // both (its AdamW, allow_bf16 on fp32).
  bool probes_pair(int strategies) const {
    return (strategies == kRescueCheckpoint || strategies == kRescueOffload) &&
           job_base_.optimizer == OptimizerKind::kAdamW && job_.allow_bf16 && job_base_.precision == Precision::kFp32;
  }

  // The plain probes of base_ after rescuing it, or nullopt when nothing
  // fits (Note [Rescue]). Throws InputError when no combination runs and
  // the least-memory one failed for a reason other than memory.
  std::optional<PlainProbes> rescue(const std::vector<int64_t>& sizes, const PlainProbes& plain) {
    const int64_t smallest = plain.failed.begin()->first;
    const ProbeReport& plain_failure = plain.first_failure();
    const bool eight_bit = base_.optimizer == OptimizerKind::kAdamW;
    const bool bf16 = job_.allow_bf16 && base_.precision == Precision::kFp32;
    std::vector<int> order;  // fewest strategies first, then the tree's order
    for (std::size_t count = 1; count <= 4; ++count)
      for (int s = 1; s < 16; ++s) {
        const bool possible = (eight_bit || !(s & kRescue8bit)) && (bf16 || !(s & kRescueBf16)) &&
                              !((s & kRescue8bit) && (s & kRescueOffload));
        if (possible && count_of(s) == count) order.push_back(s);
      }
    std::map<int, ProbeReport> tried;
    auto try_strategies = [&](int s) -> const ProbeReport& {
      if (const auto known = tried.find(s); known != tried.end()) return known->second;
      ProbeReport r = probe(rescue_config(s), smallest);
      if ((s & kRescueBf16) && bf16_form_ == Precision::kBf16 && form_failed(r)) {
        result_.notes.push_back(bf16_fallback_note(r));  // Note [bf16 fallback]
        bf16_form_ = Precision::kBf16Params;
        r = probe(rescue_config(s), smallest);
      }
      return tried.emplace(s, std::move(r)).first->second;
    };
    const int least = kRescueCheckpoint | kRescueOffload | (bf16 ? kRescueBf16 : 0);
    const ProbeReport& least_report = try_strategies(least);
    if (least_report.outcome == TrialOutcome::kOutOfMemory) {
      result_.least_memory_failure = fmt::format(
          "plain and even the configuration that needs the least memory ({}) ran out of memory at micro-batch {} "
          "(measured: {})",
          rescue_label(least), smallest, least_report.message);
      result_.smallest_micro_batch = smallest;
      result_.parameter_count = plain_failure.parameter_count;
      result_.static_memory = plain_failure.static_memory;
      return std::nullopt;
    }
    for (int s : order) {
      const ProbeReport& r = try_strategies(s);
      if (r.outcome != TrialOutcome::kOk) continue;
      base_ = rescue_config(s);
      rescue_strategies_ = s;
      result_.notes.push_back(fmt::format(
          "plain ran out of memory at every micro-batch down to {} ({}); {} is the simplest combination that runs "
          "there, so the configurations below build on it, except the other combinations of {}{} (probed there "
          "too); other larger combinations without it are not predicted",
          smallest, plain_failure.message, rescue_label(s), count_of(s) == 1 ? "one strategy" : "as many strategies",
          probes_pair(s) ? fmt::format(" and {}", rescue_label(kRescue8bit | kRescueBf16)) : ""));
      PlainProbes seeded;
      seeded.ran.emplace(smallest, r);
      PlainProbes probes = probe_plain(sizes, std::move(seeded));
      // The combinations before s in `order` ran out; those after it with as
      // many strategies are the alternatives.
      const int swapped = (s & kRescue8bit) ? (s & ~kRescue8bit) | kRescueOffload : 0;
      for (auto it = std::find(order.begin(), order.end(), s) + 1; it != order.end(); ++it)
        if (count_of(*it) == count_of(s) && *it != swapped) add_rescue_alternative(*it, try_strategies(*it), smallest);
      if (const int pair = kRescue8bit | kRescueBf16; probes_pair(s))
        add_rescue_alternative(pair, try_strategies(pair), smallest);
      return probes;
    }
    throw InputError(fmt::format("{}: no configuration could run at micro-batch {}: plain: {}; {}: {}",
                                 job_.model_path, smallest, plain_failure.message, rescue_label(least),
                                 outcome_text(least_report)));
  }

  // A micro-batch that fails where a larger one runs fails for its size, not
  // for memory (BatchNorm needs more than one value per channel): the search
  // stays above the largest such size, so no node is built on it.
  void raise_min_micro_batch(int64_t size, const ProbeReport& report) {
    job_.min_micro_batch = std::max(job_.min_micro_batch, size + 1);
    result_.notes.push_back(fmt::format("micro-batch {} cannot run ({}), so the search uses micro-batches of {} or "
                                        "more (min_micro_batch = {} in the job spec skips that probe)",
                                        size, outcome_text(report), job_.min_micro_batch, job_.min_micro_batch));
    require_a_valid_micro_batch(fmt::format("micro-batch {} cannot run ({}), and ", size, outcome_text(report)));
  }

  // The constraints (global batch, min/max micro-batch, remainder) leave at
  // least one micro-batch, else no configuration exists: a bad input.
  void require_a_valid_micro_batch(const std::string& cause) const {
    if (!valid_micro_batches(job_).empty()) return;
    throw InputError(fmt::format("{}: {}no micro-batch from {} to {} divides the global batch {} (change "
                                 "min_micro_batch / max_micro_batch, or set remainder = \"last_smaller\")",
                                 job_.spec_path.empty() ? job_.model_path : job_.spec_path, cause,
                                 job_.min_micro_batch, largest_micro_batch(job_), job_.global_batch));
  }

  // Note [bf16 fallback]
  // TorchScript's autocast pass crashes or fails on some models (measured
  // on an H100: a scripted ViT-B/16 under bf16 autocast died by SIGSEGV;
  // with the pass off it raised a dtype mismatch). When a bf16-autocast
  // probe fails for any reason but memory, bf16 is tried as bf16
  // parameters with fp32 master weights kept by the optimizer
  // (Precision::kBf16Params, DeepSpeed's bf16 mode), and the report says
  // which form ran and why.
  static bool form_failed(const ProbeReport& r) {
    return r.outcome != TrialOutcome::kOk && r.outcome != TrialOutcome::kOutOfMemory;
  }
  static std::string bf16_fallback_note(const ProbeReport& failed) {
    return fmt::format("bf16: autocast failed ({}), so bf16 runs as bf16 parameters with fp32 master weights "
                       "kept by the optimizer (precision = \"bf16_params\")",
                       outcome_text(failed));
  }

  // Adds the node for `config` at the largest valid micro-batch that is
  // predicted to fit (at most `largest`), balanced (see the Rules), or at
  // the largest valid one within reach if none fits (what it would need).
  // With `exact`, only micro-batch `largest` itself is tried.
  // `alternative`: the models of a rescue alternative (Note [Rescue]),
  // whose node is named tree_name as it is; else models_.
  void add_node(const std::string& tree_name, const TrainingConfig& config, int64_t largest, bool exact = false,
                const StepModels* alternative = nullptr) {
    const StepModels& models = alternative ? *alternative : models_;
    // After a rescue the nodes carry the rescued strategies (Note [Rescue]),
    // all but a rescued 8-bit AdamW that offload replaced.
    const std::string rescued = alternative ? "" : rescue_label(rescue_strategies_ & strategies_of(config));
    const std::string name = rescued.empty()        ? tree_name
                             : tree_name == "plain" ? rescued
                                                    : tree_name + " + " + rescued;
    const std::vector<int64_t> valid = valid_micro_batches(job_);
    if (valid.empty()) return;
    if (exact && std::find(valid.begin(), valid.end(), largest) == valid.end()) return;
    if (valid.front() > largest) {  // e.g. accumulation when only the global batch itself is a valid micro-batch
      result_.notes.push_back(fmt::format("{}: not possible (no valid micro-batch is {} or less; valid: {})", name,
                                          largest, fmt::join(valid, ", ")));
      return;
    }
    const auto budget = static_cast<double>(result_.usable_budget_bytes);
    const int64_t out_of_memory = smallest_out_of_memory(config);
    TrailNode node;
    node.node = name;
    for (auto it = valid.rbegin(); it != valid.rend(); ++it) {
      if (*it > largest || (exact && *it != largest) || *it >= out_of_memory) continue;
      if (predict(models, with_micro_batch(config, *it, job_.global_batch), job_.global_batch).peak_bytes <= budget) {
        node.largest_fitting_micro_batch = *it;
        break;
      }
    }
    int64_t at = valid.front();  // the largest valid micro-batch within reach, else the smallest
    for (int64_t b : valid)
      if (b <= largest) at = b;
    if (node.largest_fitting_micro_batch > 0) {
      const int64_t steps = micro_batch_count(job_.global_batch, node.largest_fitting_micro_batch);
      at = node.largest_fitting_micro_batch;
      // Ascending: the first that needs as few micro-batches and fits is the
      // balanced one (a smaller first micro-batch can still lose: the later
      // ones run with the gradients alive).
      for (int64_t b : valid)
        if (b <= at && micro_batch_count(job_.global_batch, b) == steps &&
            predict(models, with_micro_batch(config, b, job_.global_batch), job_.global_batch).peak_bytes <= budget) {
          at = b;
          break;
        }
    }
    node.config = with_micro_batch(config, at, job_.global_batch);
    const StepPrediction p = predict(models, node.config, job_.global_batch);
    node.predicted_peak_bytes = p.peak_bytes;
    node.predicted_seconds = p.seconds_per_global_batch;
    node.predicted_fit = p.peak_bytes <= budget && at < out_of_memory;
    if (p.peak_bytes > budget)
      node.note = fmt::format("predicted not to fit: {} > budget {}", format_bytes(static_cast<int64_t>(p.peak_bytes)),
                              format_bytes(result_.usable_budget_bytes));
    else if (!node.predicted_fit)
      node.note = fmt::format("does not fit: its probe ran out of memory at micro-batch {} (measured)", out_of_memory);
    // The configuration goes last: its length varies the most.
    progress_(fmt::format("node   {:<42} predicted {:>11} {:<12} {}", name,
                          format_bytes(static_cast<int64_t>(node.predicted_peak_bytes)),
                          node.predicted_fit ? "fits" : "does not fit", describe(node.config)));
    result_.trail.push_back(std::move(node));
  }

  // Probes run under a guard of at least the budget, so a probe out of
  // memory at micro-batch s proves that its configuration fits at no
  // micro-batch of s or more, accumulating or not (the later micro-batches
  // add the gradients). This bounds what a line through one point cannot:
  // it has no slope (a rescued base that runs only at the smallest size).
  static std::string memory_key(TrainingConfig c) {
    c.micro_batch = 0;
    c.accumulation_steps = 1;
    return to_string(c);
  }
  int64_t smallest_out_of_memory(const TrainingConfig& c) const {
    const auto at = out_of_memory_at_.find(memory_key(c));
    return at == out_of_memory_at_.end() ? std::numeric_limits<int64_t>::max() : at->second;
  }

  // The first n of the blocks checkpoint_all_ checkpoints.
  CheckpointPlan first_blocks(int64_t n) const {
    CheckpointPlan plan = checkpoint_all_;
    if (plan.mode == CheckpointPlan::Mode::kPaths) {
      plan.paths.resize(static_cast<std::size_t>(n));
    } else {
      plan.mode = CheckpointPlan::Mode::kFirstN;
      plan.first_n = n;
    }
    return plan;
  }

  // Note [Pairs]
  // The usual recipe for a model too large for its GPU combines strategies:
  // bf16 with 8-bit AdamW, or with optimizer offload, and checkpointing on
  // top (8-bit AdamW and offload do not combine: offload moves the job's
  // full-precision optimizer). Together they fit where each alone does not,
  // so the walk predicts those pairs too, from the effects measured one at
  // a time on the base: predict() adds their shifts and multiplies their
  // slope and time ratios, as it does for a strategy with checkpointing.
  // They cost no probe. Where the effects overlap the sum over-predicts:
  // offload measured on fp32 moves the state but not the fp32 masters that
  // bf16 parameters add, which offload moves to the host too. Measured
  // (bf16 autocast, 2-core CPU): the four pairs of the small test GPT at
  // 8 x 1 within 1 % of their runs; the example GPT at 34 MiB, 8-bit AdamW
  // + bf16 8 x 4 at 31.00 MiB predicted and measured. Every candidate is
  // verified by a real run before it is chosen.
  void walk_tree() {
    const int64_t g = job_.global_batch;
    const int64_t below_g = g - 1;
    const bool ckpt = models_.checkpoint.available;
    TrainingConfig all = base_;
    all.checkpoint = checkpoint_all_;

    add_node("plain", base_, g, /*exact=*/true);
    if (ckpt) {
      const double budget = static_cast<double>(result_.usable_budget_bytes);
      for (int64_t n = 1; n < models_.checkpoint_blocks; ++n) {
        TrainingConfig first = base_;
        first.checkpoint = first_blocks(n);
        if (predict(models_, with_micro_batch(first, g, g), g).peak_bytes <= budget) {
          add_node(fmt::format("checkpointing (first {} of {} blocks)", n, models_.checkpoint_blocks), first, g,
                   /*exact=*/true);
          break;
        }
      }
      add_node("checkpointing (" + checkpoint_label_ + ")", all, g, /*exact=*/true);
    }
    add_node("micro-batch + accumulation", base_, below_g);
    if (ckpt) add_node("micro-batch + accumulation + checkpointing", all, below_g);
    // Each strategy, each optimizer strategy with bf16 (Note [Pairs]), and
    // each of those with checkpointing.
    auto with_strategies = [&](const std::string& name, std::initializer_list<const StrategyEffect*> effects,
                               auto&& change) {
      for (const StrategyEffect* effect : effects)
        if (!effect->available) return;
      TrainingConfig c = base_;
      change(c);
      add_node(name, c, g);
      if (ckpt) {
        TrainingConfig cc = all;
        change(cc);
        add_node(name + " + checkpointing", cc, g);
      }
    };
    const auto eight_bit = [](TrainingConfig& c) { c.optimizer = OptimizerKind::kAdamW8bit; };
    const auto offload = [this](TrainingConfig& c) { offload_optimizer(c); };
    const auto bf16 = [this](TrainingConfig& c) { c.precision = bf16_form_; };
    const std::string bf16_name = bf16_form_ == Precision::kBf16 ? "bf16" : "bf16 parameters";
    with_strategies("8-bit AdamW", {&models_.adamw8bit}, eight_bit);
    with_strategies("optimizer offload", {&models_.offload}, offload);
    with_strategies(bf16_name, {&models_.bf16}, bf16);
    with_strategies("8-bit AdamW + " + bf16_name, {&models_.adamw8bit, &models_.bf16}, [&](TrainingConfig& c) {
      eight_bit(c);
      bf16(c);
    });
    with_strategies("optimizer offload + " + bf16_name, {&models_.offload, &models_.bf16}, [&](TrainingConfig& c) {
      offload(c);
      bf16(c);
    });
    for (const RescueAlternative& alternative : rescue_alternatives_) {
      const StepModels own = rescue_alternative_models(alternative);
      add_node(alternative.name, alternative.config, g, /*exact=*/false, &own);
    }

    // The least memory any combination needs, for the "nothing fits" report.
    TrainingConfig least = base_;
    if (ckpt) least.checkpoint = checkpoint_all_;
    if (models_.offload.available)
      offload_optimizer(least);
    else if (models_.adamw8bit.available)
      least.optimizer = OptimizerKind::kAdamW8bit;
    if (models_.bf16.available) least.precision = bf16_form_;
    const std::vector<int64_t> valid = valid_micro_batches(job_);
    if (!valid.empty()) {
      result_.smallest_micro_batch = valid.front();
      result_.smallest_predicted_peak_bytes = predict(models_, with_micro_batch(least, valid.front(), g), g).peak_bytes;
    }
  }

  // A verification run that finished within the usable budget.
  bool fits_budget(const ProbeReport& r) const {
    return r.outcome == TrialOutcome::kOk && r.peak_bytes <= result_.usable_budget_bytes;
  }

  void verify_candidates() {
    std::vector<std::size_t> order;
    std::set<std::string> seen;
    for (std::size_t i = 0; i < result_.trail.size(); ++i)
      if (result_.trail[i].predicted_fit && seen.insert(to_string(result_.trail[i].config)).second) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return result_.trail[a].predicted_seconds < result_.trail[b].predicted_seconds;
    });
    // The simplest candidate (fewest strategies, then predicted fastest) is
    // always among those verified, in the last slot if the predictions did
    // not rank it higher: it is the reference the strategies must beat, and
    // predicted times from short probes are noisy (example GPT, 256 MiB:
    // plain was predicted 4 % slower than 8-bit AdamW and never run).
    const auto slots = static_cast<std::size_t>(std::max<int64_t>(0, options_.max_verifications));
    if (slots >= 2 && order.size() > slots) {
      const auto simplest = std::min_element(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return strategy_count(result_.trail[a].config, job_base_) < strategy_count(result_.trail[b].config, job_base_);
      });  // the first of the fewest: order is by predicted time
      if (simplest >= order.begin() + static_cast<std::ptrdiff_t>(slots))
        std::rotate(order.begin() + static_cast<std::ptrdiff_t>(slots - 1), simplest, simplest + 1);
    }
    int64_t succeeded = 0, failed = 0;
    for (std::size_t i : order) {
      if (succeeded >= options_.max_verifications) break;
      if (failed >= options_.max_extra_verifications && succeeded > 0) break;
      if (succeeded + failed >= options_.max_verifications + options_.max_extra_verifications) break;
      TrailNode& node = result_.trail[i];
      ProbeReport r = runner_.verify(node.config);
      ++result_.verification_trials;
      progress_(fmt::format("verify {:<60} {}", describe(node.config),
                            r.outcome == TrialOutcome::kOk
                                ? fmt::format("peak {}, {:.1f} samples/s over {} steps", format_bytes(r.peak_bytes),
                                              r.samples_per_second, r.steps_run)
                                : outcome_text(r)));
      if (fits_budget(r)) {
        ++succeeded;
      } else {
        ++failed;
        node.note = r.outcome == TrialOutcome::kOk
                        ? fmt::format("verified peak {} is over the budget: the memory model was wrong; dropped",
                                      format_bytes(r.peak_bytes))
                        : fmt::format("verified run: {} after {} steps ({}); {}dropped", to_string(r.outcome),
                                      r.steps_run, r.message,
                                      r.outcome == TrialOutcome::kOutOfMemory ? "the memory model was wrong; " : "");
        result_.notes.push_back(fmt::format("{}: {}", node.node, node.note));
      }
      node.verification = std::move(r);
    }
    // The fastest verified configuration wins; within kTimingTieRatio of
    // it, the simplest (Rules: Ties).
    std::vector<std::size_t> fitting;
    double fastest = 0;
    for (std::size_t i = 0; i < result_.trail.size(); ++i) {
      const TrailNode& node = result_.trail[i];
      if (!node.verification || !fits_budget(*node.verification)) continue;
      fitting.push_back(i);
      fastest = std::max(fastest, node.verification->samples_per_second);
    }
    auto simpler = [&](std::size_t a, std::size_t b) {
      const int sa = strategy_count(result_.trail[a].config, job_base_),
                sb = strategy_count(result_.trail[b].config, job_base_);
      if (sa != sb) return sa < sb;
      return result_.trail[a].verification->peak_bytes < result_.trail[b].verification->peak_bytes;
    };
    for (std::size_t i : fitting) {
      if (result_.trail[i].verification->samples_per_second < kTimingTieRatio * fastest) continue;
      if (!result_.chosen || simpler(i, *result_.chosen)) result_.chosen = i;
    }
    if (!result_.chosen) return;
    const TrailNode& best = result_.trail[*result_.chosen];
    for (std::size_t i = 0; i < result_.trail.size(); ++i) {
      TrailNode& node = result_.trail[i];
      if (i == *result_.chosen) {
        const double sps = node.verification->samples_per_second;
        node.note = fmt::format("chosen: {}, {:.1f} samples/s, {} below the budget",
                                sps >= fastest ? "fastest verified"
                                               : fmt::format("simplest within {:.0f} % of the fastest verified "
                                                             "({:.1f} samples/s)",
                                                             100 * (1 - kTimingTieRatio), fastest),
                                sps, format_bytes(result_.usable_budget_bytes - node.verification->peak_bytes));
      } else if (node.note.empty() && node.verification &&
                 node.verification->samples_per_second >= kTimingTieRatio * fastest) {
        node.note = fmt::format("verified, {:.1f} samples/s: as fast within {:.0f} % (a tie), but more strategies or "
                                "less margin than the chosen one",
                                node.verification->samples_per_second, 100 * (1 - kTimingTieRatio));
      } else if (node.note.empty() && node.verification) {
        node.note = fmt::format("verified, but slower: {:.1f} samples/s", node.verification->samples_per_second);
      } else if (node.note.empty() && node.predicted_fit) {
        // A prediction within the tie ratio is not "slower": checkpointing
        // clamped to 1x printed "predicted slower (3.06 s vs 3.06 s ...)".
        // A node that might have won also says what the chosen one measured
        // (example GPT at 2 GiB: slow first plain probes predicted 8-bit
        // AdamW at 2.03 s against plain's 3.06 s; both ran at 9.4 samples/s).
        const std::string times = fmt::format("{} s vs {} s per global batch", format_seconds(node.predicted_seconds),
                                              format_seconds(best.predicted_seconds));
        auto unverified = [&](const std::string& verdict) {
          return fmt::format("{} ({}; the chosen one measured {} s); not verified (verification budget spent)", verdict,
                             times, format_seconds(best.verification->timing.steady_step_seconds));
        };
        if (node.predicted_seconds < best.predicted_seconds)
          node.note = unverified("predicted faster");
        else if (kTimingTieRatio * node.predicted_seconds <= best.predicted_seconds)
          node.note = unverified(fmt::format("predicted as fast within {:.0f} %", 100 * (1 - kTimingTieRatio)));
        else
          node.note = fmt::format("predicted slower ({})", times);
      }
    }
    note_optimizer_change(fitting);
  }

  // 8-bit AdamW wins on speed as any strategy does, but unlike the others it
  // changes what training computes (blockwise-quantized states): say so,
  // with the fastest verified configuration that keeps the job's optimizer.
  void note_optimizer_change(const std::vector<std::size_t>& fitting) {
    const TrailNode& best = result_.trail[*result_.chosen];
    if (best.config.optimizer == job_base_.optimizer) return;
    const TrailNode* exact = nullptr;
    for (std::size_t i : fitting) {
      const TrailNode& node = result_.trail[i];
      if (node.config.optimizer == job_base_.optimizer &&
          (!exact || node.verification->samples_per_second > exact->verification->samples_per_second))
        exact = &node;
    }
    result_.notes.push_back(fmt::format(
        "the chosen configuration trains with {} instead of the job's {} (quantized optimizer states: close to, not "
        "equal to, {}'s updates); {}",
        to_string(best.config.optimizer), to_string(job_base_.optimizer), to_string(job_base_.optimizer),
        exact ? fmt::format("the fastest verified configuration with {} is {} ({}, {:.1f} samples/s)",
                            to_string(job_base_.optimizer), exact->node, describe(exact->config),
                            exact->verification->samples_per_second)
              : fmt::format("no verified configuration with {} fits", to_string(job_base_.optimizer))));
  }

  JobSpec job_;  // a copy: a micro-batch that cannot run raises min_micro_batch
  TrialRunner& runner_;
  SearchOptions options_;
  std::function<void(const std::string&)> progress_;
  TrainingConfig base_;      // what the plain probes run: the job's configuration, or a rescued one
  TrainingConfig job_base_;  // the job's own configuration: strategies are counted against it
  int rescue_strategies_ = 0;  // kRescue* bits: the strategies base_ adds to the job's (Note [Rescue]); 0: none
  std::vector<RescueAlternative> rescue_alternatives_;  // Note [Rescue]
  StepModels models_;
  std::map<int64_t, double> plain_seconds_;            // forward, loss and backward of one micro-batch
  std::map<std::string, int64_t> out_of_memory_at_;  // memory_key -> smallest micro-batch whose probe ran out
  ProbeReport last_failure_;                     // the last strategy probe that failed
  CheckpointPlan checkpoint_all_ = checkpoint_every_block();  // what "all blocks" checkpoints
  std::string checkpoint_label_ = "all blocks";  // names checkpoint_all_ in node names
  Precision bf16_form_ = Precision::kBf16;       // kBf16Params after a fallback
  SearchResult result_;
};

}  // namespace

std::vector<int64_t> valid_micro_batches(const JobSpec& job) {
  std::vector<int64_t> sizes;
  const int64_t top = largest_micro_batch(job);
  for (int64_t b = job.min_micro_batch; b <= top; ++b)
    if (job.allow_remainder || job.global_batch % b == 0) sizes.push_back(b);
  return sizes;
}

std::vector<const TrailNode*> unverified_candidates(const SearchResult& result) {
  std::vector<const TrailNode*> nodes;
  for (const TrailNode& node : result.trail)
    if (node.verification && node.verification->outcome != TrialOutcome::kOk &&
        node.verification->outcome != TrialOutcome::kOutOfMemory)
      nodes.push_back(&node);
  return nodes;
}

SearchResult search(const JobSpec& job, TrialRunner& runner, const SearchOptions& options,
                    const std::function<void(const std::string&)>& progress) {
  return Search(job, runner, options, progress).run();
}

}  // namespace oomtune
