#pragma once
// Plan: what autotune chose, as a record that the recipes (one writer per
// framework) turn into files. `plan.toml` is its file form (plan_toml.h);
// `oomtune probe --plan plan.toml` runs it back, so that form round-trips
// exactly. No libtorch here.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/device.h"
#include "job/optimizer_implementation.h"
#include "job/parameter_selection.h"
#include "strategies/training_config.h"

namespace oomtune {

/// The job's optimizer hyper-parameters, carried into every framework config
/// so that the emitted run trains with the same update as the measured one.
struct OptimizerHyperParameters {
  double lr = 1e-3;            // learning rate
  double weight_decay = 0.01;  // AdamW: decoupled; SGD: L2
  double beta1 = 0.9;          // AdamW only
  double beta2 = 0.999;        // AdamW only
  double eps = 1e-8;           // AdamW only
  double momentum = 0.0;       // SGD only
  double max_grad_norm = 0.0;  // gradient clipping's max_norm; 0: none (plan.toml: absent in older plans)
  // The torch.optim implementation measured (AdamW, SGD; job/
  // optimizer_implementation.h); plan.toml: [optimizer] implementation.
  OptimizerImplementation implementation = kDefaultOptimizerImplementation;

  bool operator==(const OptimizerHyperParameters& other) const;
  bool operator!=(const OptimizerHyperParameters& other) const { return !(*this == other); }
};

/// A chosen training configuration and what is known about it.
///
/// Invariant (validate_plan): global_batch == config.micro_batch *
/// config.accumulation_steps. Frameworks cannot express a smaller last
/// micro-batch, so a plan whose global batch the micro-batch does not divide
/// cannot be emitted (USERS.md: keep the global batch exact).
struct Plan {
  TrainingConfig config;
  int64_t global_batch = 1;  // COUNT: samples per optimizer step, on one GPU
  OptimizerHyperParameters optimizer;
  Device device = Device::kCuda;                      // kCpu or kCuda: where the plan was measured
  std::optional<int64_t> budget_bytes;                // BYTES: the memory budget the plan fits
  double headroom = 0.05;                             // fraction of the budget kept free, in [0, 0.9]
  std::string model_path;                             // the TorchScript model ("" when unknown)
  std::string job_spec_path;                          // the job TOML the plan came from ("" when unknown)
  std::optional<int64_t> measured_peak_bytes;         // BYTES: the verified peak the budget held (reserved on CUDA)
  std::optional<int64_t> predicted_peak_bytes;        // BYTES: peak predicted by the search (not measured)
  std::optional<double> measured_samples_per_second;  // throughput measured over the verify run
  // BYTES: the verified run's host peak with optimizer offload (its fp32
  // masters, gradients and state, pinned on a GPU; ProbeReport::host_peak_bytes);
  // plan.toml: [result] measured_host_peak_bytes; nullopt without offload.
  std::optional<int64_t> measured_host_peak_bytes;
  std::optional<double> predicted_samples_per_second;  // throughput predicted (not measured)
  std::vector<std::string> notes;                      // free text from autotune, one line each
  // Which parameters trained (the job's trainable / frozen globs): the
  // framework configs cannot freeze them, so each writer notes the set.
  ParameterSelection trainable;
  // COUNT: tokens per sequence the plan was verified at, for a job whose
  // inputs name "seq" (the longest, for a range or a distribution of
  // lengths); nullopt otherwise. `probe --plan` runs at it when the job's
  // seq differs (autotune --seq N).
  std::optional<int64_t> seq_len;
  // COUNT: trainable parameter elements (the optimizer's), as the search
  // counted them (SearchResult::parameter_count); plan.toml: [job]
  // parameters. DeepSpeed's ZeRO-2 buckets are sized to it (Note [ZeRO
  // buckets] in recipes/deepspeed_sections.cpp); nullopt in plans written
  // before the key, and the files then say what they cannot size.
  std::optional<int64_t> parameter_count;

  bool operator==(const Plan& other) const;
  bool operator!=(const Plan& other) const { return !(*this == other); }
};

/// micro_batch * accumulation_steps (COUNT: samples per optimizer step), or
/// nullopt when the product does not fit int64.
std::optional<int64_t> samples_per_step(const TrainingConfig& config);

/// Why samples_per_step(config) is nullopt, for the error of the key
/// config.accumulation_steps ("micro_batch * accumulation_steps = A * B does
/// not fit int64"); read by parse_plan_toml and validate_plan.
std::string samples_per_step_overflow(const TrainingConfig& config);

/// A plan with the given config whose global batch is micro_batch *
/// accumulation_steps, all else default.
Plan plan_for(const TrainingConfig& config);

/// Checks the invariants every writer relies on: micro_batch and
/// accumulation_steps >= 1, global_batch == micro_batch * accumulation_steps,
/// device "cpu" or "cuda", hyper-parameters in the ranges of
/// hyper_parameter_problem (job/hyper_parameters.h), headroom in [0, 0.9],
/// budget > 0. Throws ConfigError "plan: KEY: what
/// is wrong, got VALUE" (key as spelled in plan.toml) on the first violation.
void validate_plan(const Plan& plan);

}  // namespace oomtune
