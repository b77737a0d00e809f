#pragma once
// The trials `oomtune probe` runs besides its measured configuration: each
// in a child process (trial/child_trial.h), one micro-batch per step, for
// the retained-activation fit (report/probe_summary.h, ActivationFit) and
// the sequence fit (sequence_fit_trials.h).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "job/job_spec.h"
#include "probes/probe_report.h"
#include "report/probe_summary.h"
#include "strategies/training_config.h"
#include "trial/trial_options.h"

namespace oomtune {

/// Runs `config` in a child process; a trial that ran (ok or out of
/// memory) is returned. Throws the trial's error instead: ConfigError for a
/// checkpoint plan the model refuses (naming the blocks that can be
/// checkpointed alone), InputError for the user's input (model file,
/// output selection), Error otherwise.
ProbeReport run_probe_trial(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options);

/// The fit's micro-batches for a configuration at `micro_batch`: b, b/2 and
/// b/4 (those >= 1, distinct, ascending).
std::vector<int64_t> default_fit_batches(int64_t micro_batch);

/// A fit trial: `config` at micro-batch `b` (one micro-batch per step, one
/// timed step, no budget), writing its measured step's events to
/// `events_path` ("" writes none; allocsim/step_events_json.h). Throws as
/// run_probe_trial.
ProbeReport run_fit_trial(const JobSpec& job, const TrainingConfig& config, int64_t b, const std::string& events_path);

/// The retained-activation fit over the (micro-batch, report) pairs whose
/// trial ran; nullopt when fewer than two ran.
std::optional<ActivationFit> activation_fit_of(const std::vector<std::pair<int64_t, ProbeReport>>& trials);

/// Runs a fit trial at each of `sizes` (a trial that fails is left out and
/// said on stderr) and fits them; nullopt when fewer than two ran.
std::optional<ActivationFit> fit_activations(const JobSpec& job, const TrainingConfig& config,
                                             const std::vector<int64_t>& sizes);

}  // namespace oomtune
