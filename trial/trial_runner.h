#pragma once
// Runs one trial in this process: load the model under a MemoryTracker,
// apply a TrainingConfig, run a warm-up step and measured steps, and return
// what was measured as a ProbeReport. The `trial` subcommand wraps this in a
// child process (trial/child_trial.h) so a crash costs one trial.
//
// Rules of measurement:
// - Step 1 is warm-up: it creates the optimizer state and is not timed.
// - Memory peaks come from step 2, the first full step after the optimizer
//   state exists; later steps are timed until consecutive step times agree
//   within the tolerance (bounded by max_timed_steps).
// - A job with a length distribution (JobSpec::seq_lengths): steps 1 and 2
//   at its max, step k >= 3 at the (k - 3)'th length drawn with the job's
//   seed, every micro-batch of a step at the step's length; no early stop,
//   and the step time is the mean of the drawn steps'
//   (trial_runner.cpp, Note [Variable-length steps]).
// - Static memory: parameters and gradients are the tracked sizes of their
//   storages; optimizer state is what the first optimizer step left alive;
//   buffers are the rest of what loading left alive.
// - Retained activations: live bytes when backward begins minus live bytes
//   when forward begins (first micro-batch of the measured step).
// - The global batch is made in host memory and each micro-batch is copied to
//   the device, as a training loop's `x.to(device)` does.

#include "job/job_spec.h"
#include "probes/probe_report.h"
#include "strategies/training_config.h"
#include "trial/trial_options.h"

namespace oomtune {

/// Throws InputError when `job` asks for device = "cuda" and cannot have it:
/// with the reason a GPU cannot be used here (no driver, an old driver, no
/// device visible; probes/cuda_device.h) where the build has CUDA, else
/// because this trial module was built without CUDA. Does nothing for "cpu",
/// "meta", or "cuda" where a GPU answers.
void require_cuda_trial(const JobSpec& job);

/// Throws InputError "JOB: device = \"meta\" needs libtorch 2 or newer ..."
/// when `job` asks for the meta device and this libtorch cannot count it
/// (compat::meta_device_problem). Does nothing otherwise.
void require_meta_trial(const JobSpec& job);

/// Runs the trial and returns its report. Out of memory is an outcome, not
/// an error, and so is a checkpointed block class refused because its
/// forward writes to its argument, whether its graph showed it
/// (CheckpointRefused, phase "load") or the recompute operator found it at
/// the first call (kError with refused_checkpoint_class and
/// other_checkpointed_blocks set). Throws ModelError / ConfigError (bad
/// model, bad config) — the child-process wrapper turns those into outcome
/// kError — and require_cuda_trial's and require_meta_trial's InputError
/// first. On the meta device it runs the warm-up and the measured step only
/// and reports no timing (StepTiming::measured false). With
/// options.device_check_only it returns an empty kOk report once those two
/// checks pass.
ProbeReport run_trial(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options);

}  // namespace oomtune
