#include "probe_trials.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "strategies/job_config.h"
#include "trial/child_trial.h"

namespace oomtune {

// Each trial of the probe runs in a child process, as autotune's do: the
// model's crash is reported, not suffered, and each trial starts with a
// fresh allocator. A trial's error is the probe's error (exit 2 when it is
// the user's input: model file, output selection, config).
ProbeReport run_probe_trial(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options) {
  ChildTrialOptions child;
  child.timeout_seconds = job.trial_timeout_seconds;
  ProbeReport r = run_trial_in_child(job, config, options, child);
  if (r.outcome != TrialOutcome::kError) return r;
  if (!r.other_checkpointed_blocks.empty()) {
    CheckpointPlan others;
    others.mode = CheckpointPlan::Mode::kPaths;
    others.paths = r.other_checkpointed_blocks;
    throw ConfigError(fmt::format("{}; the blocks of the other classes can be checkpointed alone: --config ckpt={}",
                                  r.message, to_string(others)));
  }
  if (r.input_error) throw InputError(r.message);
  throw Error(r.message);
}

std::vector<int64_t> default_fit_batches(int64_t micro_batch) {
  std::vector<int64_t> sizes;
  for (int64_t b : {micro_batch, micro_batch / 2, micro_batch / 4})
    if (b >= 1 && std::find(sizes.begin(), sizes.end(), b) == sizes.end()) sizes.push_back(b);
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

// A fit trial: `config` at micro-batch `b` (one micro-batch per step, one
// timed step, no budget), with `events_path` its step's events ("" none).
ProbeReport run_fit_trial(const JobSpec& job, const TrainingConfig& config, int64_t b, const std::string& events_path) {
  JobSpec small = job;
  small.global_batch = b;
  TrainingConfig at_b = config;
  at_b.micro_batch = b;
  at_b.accumulation_steps = 1;
  TrialOptions options;
  options.min_timed_steps = 1;
  options.max_timed_steps = 1;
  options.enforce_budget = false;
  options.record_events = !events_path.empty();  // also the predicted reserved bytes a CUDA budget counts
  options.step_events_path = events_path;
  return run_probe_trial(small, at_b, options);
}

// The retained-activation fit over the (size, report) pairs whose trial ran;
// none when fewer than two ran.
std::optional<ActivationFit> activation_fit_of(const std::vector<std::pair<int64_t, ProbeReport>>& trials) {
  ActivationFit fit;
  for (const auto& [b, r] : trials) {
    if (r.outcome != TrialOutcome::kOk) continue;
    fit.micro_batches.push_back(b);
    fit.retained_bytes.push_back(r.retained_activation_bytes);
  }
  if (fit.micro_batches.size() < 2) return std::nullopt;
  std::vector<double> xs(fit.micro_batches.begin(), fit.micro_batches.end());
  std::vector<double> ys(fit.retained_bytes.begin(), fit.retained_bytes.end());
  fit.fit = fit_line(xs, ys);
  return fit;
}

// The fit over the sizes whose trial ran; none when fewer than two ran.
std::optional<ActivationFit> fit_activations(const JobSpec& job, const TrainingConfig& config,
                                             const std::vector<int64_t>& sizes) {
  std::vector<std::pair<int64_t, ProbeReport>> trials;
  for (int64_t b : sizes) {
    fmt::print(stderr, "probe: retained activations at micro-batch {}\n", b);
    ProbeReport r = run_fit_trial(job, config, b, "");
    if (r.outcome != TrialOutcome::kOk)
      fmt::print(stderr, "probe: micro-batch {} left out of the fit: {}\n", b, outcome_text(r));
    trials.emplace_back(b, std::move(r));
  }
  return activation_fit_of(trials);
}

}  // namespace oomtune
