#include "strategies/job_config.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "strategies/accumulation.h"

namespace oomtune {

TrainingConfig baseline_config(const JobSpec& job) {
  TrainingConfig config;
  config.micro_batch = job.global_batch;
  config.accumulation_steps = 1;
  config.optimizer = parse_optimizer(job.optimizer.kind);
  config.precision = parse_precision(job.precision);
  return config;
}

TrainingConfig normalize_config(TrainingConfig config, const JobSpec& job) {
  if (config.optimizer == OptimizerKind::kAdafactor && config.offload_optimizer)
    throw ConfigError(kAdafactorOffloadProblem);
  if (config.optimizer == OptimizerKind::kSgd && job.optimizer.kind != "sgd")
    throw ConfigError(fmt::format("optimizer sgd: the job trains with {}; oomtune does not change the optimizer family",
                                  job.optimizer.kind));
  const auto slices = split_global_batch(job.global_batch, config.micro_batch, job.allow_remainder);
  const auto steps = static_cast<int64_t>(slices.size());
  if (config.accumulation_steps != 1 && config.accumulation_steps != steps)
    throw ConfigError(
        fmt::format("micro_batch {} x accumulation_steps {} does not make the global batch {} "
                    "(it takes {} micro-batches)",
                    config.micro_batch, config.accumulation_steps, job.global_batch, steps));
  config.accumulation_steps = steps;
  return config;
}

int64_t largest_micro_batch(const JobSpec& job) {
  return job.max_micro_batch ? std::min(job.global_batch, *job.max_micro_batch) : job.global_batch;
}

}  // namespace oomtune
