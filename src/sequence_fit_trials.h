#pragma once
// The sequence fit of `oomtune probe` for a job whose inputs name "seq"
// (docs/sequence_length.md): the trials at several (micro-batch, length),
// each phase's peak fitted in B and T, the step's events fitted in T, the
// answers under the budget, and for a job with a length distribution the
// caching-allocator replay of many drawn steps (report/length_policies.h).

#include <cstdint>
#include <optional>
#include <vector>

#include "job/job_spec.h"
#include "report/probe_summary.h"
#include "report/sequence_fit.h"
#include "strategies/training_config.h"

namespace oomtune {

/// The lengths of the sequence fit: T, T/2 and T/4 (with seq = [min, max]
/// or a distribution: min, their midpoint and max), at least 1, distinct,
/// ascending: cheap ones first. `job` must name "seq" (seq_len set).
std::vector<int64_t> default_fit_lengths(const JobSpec& job);

/// How the fit runs.
struct SequenceFitOptions {
  std::vector<int64_t> batches;          // COUNT: micro-batches of the fit trials (>= 1 each)
  std::vector<int64_t> lengths;          // COUNT: tokens, >= 2 distinct, ascending (the last is the longest)
  std::vector<int64_t> predict_lengths;  // COUNT: tokens at which to predict the configuration's peak
  int64_t replay_steps = 0;              // COUNT: steps of the length replay (a job with seq_lengths), >= 1
};

/// Runs the fit trials of `config` for `job` (Note [Sequence fit] in the
/// .cpp) and fits them; sets `activation_fit` from the trials at the job's
/// length. A trial that fails is left out and said on stderr; so is a step
/// whose events cannot be fitted, and a length replay that cannot run.
/// Throws as run_probe_trial (probe_trials.h) and InputError as
/// fit_sequence_phases.
SequenceFit fit_sequence(const JobSpec& job, const TrainingConfig& config, const SequenceFitOptions& options,
                         std::optional<ActivationFit>& activation_fit);

}  // namespace oomtune
