#include "recipes/plan.h"

#include <cmath>

#include <fmt/format.h>

#include "common/error.h"
#include "job/hyper_parameters.h"

namespace oomtune {
namespace {

[[noreturn]] void fail(const std::string& key, const std::string& message) {
  throw ConfigError(fmt::format("plan: {}: {}", key, message));
}

}  // namespace

bool OptimizerHyperParameters::operator==(const OptimizerHyperParameters& other) const {
  return lr == other.lr && weight_decay == other.weight_decay && beta1 == other.beta1 && beta2 == other.beta2 &&
         eps == other.eps && momentum == other.momentum && max_grad_norm == other.max_grad_norm &&
         implementation == other.implementation;
}

bool Plan::operator==(const Plan& other) const {
  return config == other.config && global_batch == other.global_batch && optimizer == other.optimizer &&
         device == other.device && budget_bytes == other.budget_bytes && headroom == other.headroom &&
         model_path == other.model_path && job_spec_path == other.job_spec_path &&
         measured_peak_bytes == other.measured_peak_bytes && predicted_peak_bytes == other.predicted_peak_bytes &&
         measured_samples_per_second == other.measured_samples_per_second &&
         predicted_samples_per_second == other.predicted_samples_per_second &&
         measured_host_peak_bytes == other.measured_host_peak_bytes && notes == other.notes &&
         trainable == other.trainable && seq_len == other.seq_len && parameter_count == other.parameter_count;
}

std::optional<int64_t> samples_per_step(const TrainingConfig& config) {
  int64_t product = 0;
  if (__builtin_mul_overflow(config.micro_batch, config.accumulation_steps, &product)) return std::nullopt;
  return product;
}

std::string samples_per_step_overflow(const TrainingConfig& config) {
  return fmt::format("micro_batch * accumulation_steps = {} * {} does not fit int64", config.micro_batch,
                     config.accumulation_steps);
}

Plan plan_for(const TrainingConfig& config) {
  Plan plan;
  plan.config = config;
  plan.global_batch = samples_per_step(config).value_or(0);  // validate_plan reports an overflow
  return plan;
}

void validate_plan(const Plan& plan) {
  const TrainingConfig& c = plan.config;
  if (c.micro_batch < 1) fail("config.micro_batch", fmt::format("must be >= 1, got {}", c.micro_batch));
  if (c.accumulation_steps < 1)
    fail("config.accumulation_steps", fmt::format("must be >= 1, got {}", c.accumulation_steps));
  const std::optional<int64_t> product = samples_per_step(c);
  if (!product) fail("config.accumulation_steps", samples_per_step_overflow(c));
  if (plan.global_batch != *product)
    fail("job.global_batch",
         fmt::format("must equal micro_batch * accumulation_steps = {} * {} = {} (frameworks cannot "
                     "express a smaller last micro-batch), got {}",
                     c.micro_batch, c.accumulation_steps, *product, plan.global_batch));
  if (c.optimizer == OptimizerKind::kAdafactor && c.offload_optimizer)
    fail("config.offload_optimizer", std::string(kAdafactorOffloadProblem));
  if (plan.device != Device::kCpu && plan.device != Device::kCuda)
    fail("job.device", fmt::format("expected \"cpu\" or \"cuda\", got '{}'", device_name(plan.device)));
  if (plan.budget_bytes && *plan.budget_bytes <= 0)
    fail("job.budget", fmt::format("must be > 0 bytes, got {}", *plan.budget_bytes));
  if (plan.parameter_count && *plan.parameter_count < 1)
    fail("job.parameters", fmt::format("must be >= 1, got {}", *plan.parameter_count));
  if (!(std::isfinite(plan.headroom) && plan.headroom >= 0.0 && plan.headroom <= 0.9))
    fail("job.headroom", fmt::format("must be in [0, 0.9], got {}", plan.headroom));
  const OptimizerHyperParameters& o = plan.optimizer;
  for (auto [key, value] : {std::pair{"lr", o.lr}, std::pair{"weight_decay", o.weight_decay},
                            std::pair{"betas", o.beta1}, std::pair{"betas", o.beta2}, std::pair{"eps", o.eps},
                            std::pair{"momentum", o.momentum}, std::pair{"max_grad_norm", o.max_grad_norm}})
    if (const std::string problem = hyper_parameter_problem(key, value); !problem.empty())
      fail(std::string("optimizer.") + key, problem);
  for (const auto* bytes : {&plan.measured_peak_bytes, &plan.predicted_peak_bytes})
    if (*bytes && **bytes < 0)
      fail(bytes == &plan.measured_peak_bytes ? "result.measured_peak_bytes" : "result.predicted_peak_bytes",
           fmt::format("must be >= 0, got {}", **bytes));
  for (const auto* rate : {&plan.measured_samples_per_second, &plan.predicted_samples_per_second})
    if (*rate && !(std::isfinite(**rate) && **rate >= 0.0))
      fail(rate == &plan.measured_samples_per_second ? "result.measured_samples_per_second"
                                                     : "result.predicted_samples_per_second",
           fmt::format("must be a finite number >= 0, got {}", **rate));
}

}  // namespace oomtune
