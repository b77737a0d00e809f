#pragma once
// The training configuration a job asks for, and a configuration checked
// against its job. No libtorch: the probe command checks a configuration before
// any trial loads the model.

#include "job/job_spec.h"
#include "strategies/training_config.h"

namespace oomtune {

/// Checks `config` against `job` and fills in what follows from it:
/// accumulation_steps = ceil(global / micro_batch) when it was left at 1.
/// Throws ConfigError when micro_batch > global batch, when micro_batch ×
/// accumulation_steps does not cover the global batch exactly and the job
/// does not allow a remainder, for fp16 on a non-CUDA device, for Adafactor
/// with optimizer offload (kAdafactorOffloadProblem).
TrainingConfig normalize_config(TrainingConfig config, const JobSpec& job);

/// The largest micro-batch `job` allows (samples): its global batch, or
/// max_micro_batch when that is smaller.
int64_t largest_micro_batch(const JobSpec& job);

/// The config a job asks for with no strategy: one micro-batch of the
/// global batch, the job's optimizer and precision.
TrainingConfig baseline_config(const JobSpec& job);

}  // namespace oomtune
