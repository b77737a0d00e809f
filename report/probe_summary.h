#pragma once
// ProbeSummary: what `oomtune probe` shows — one measured configuration, the
// analytic check of its static memory, and the retained-activation fit over
// micro-batch sizes — and its two renderers (table and JSON). No libtorch.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/device.h"
#include "probes/linear_fit.h"
#include "probes/probe_report.h"
#include "report/sequence_fit.h"

namespace oomtune {

/// Retained activations measured at several micro-batch sizes, fitted as
/// a + b * micro_batch.
struct ActivationFit {
  std::vector<int64_t> micro_batches;   // COUNT, one per trial
  std::vector<int64_t> retained_bytes;  // SUM, one per trial
  LinearFit fit;                        // bytes = intercept + slope * micro_batch
};

/// Static bytes expected from the parameter count P alone, as
/// recipes/zero_estimate.h (stored_bytes_per_parameter) counts them:
/// parameters 4·P (2·P for bf16_params), gradients likewise, optimizer state
/// 8·P (AdamW: exp_avg and exp_avg_sq, torch/optim/adamw.py), 4·P (SGD with
/// momentum), 0 (plain SGD), 2·P plus one fp32 absmax per 2048-element block
/// of each state (8-bit AdamW, Dettmers et al. 2022), plus 4·P of fp32
/// master weights for bf16_params. P counts the trainable parameters; the
/// F frozen ones (job/parameter_selection.h) hold 4·F bytes of weights
/// (2·F for bf16_params or frozen_dtype = "bf16") and nothing else.
struct AnalyticStatic {
  int64_t parameter_bytes = 0;         // SUM
  int64_t gradient_bytes = 0;          // SUM
  int64_t optimizer_state_bytes = 0;   // SUM
  int64_t frozen_parameter_bytes = 0;  // SUM
};

/// Everything the probe command prints.
struct ProbeSummary {
  std::string job_path;
  std::string model_path;
  Device device = Device::kCpu;
  std::optional<int64_t> budget_bytes;         // SUM: the job's budget, if any
  std::optional<int64_t> usable_budget_bytes;  // SUM: the budget less its headroom (JobSpec::usable_budget_bytes)
  double headroom = 0;                         // fraction of the budget kept free (JobSpec::headroom)
  // SUM: the host budget less its headroom (JobSpec::usable_host_budget_bytes), if any
  std::optional<int64_t> usable_host_budget_bytes;
  ProbeReport report;
  AnalyticStatic analytic;
  std::optional<ActivationFit> activation_fit;
  std::optional<SequenceFit> sequence;  // jobs whose inputs name "seq" (report/sequence_fit.h)
};

/// Human table: phases as rows, IEC units.
std::string render_probe_text(const ProbeSummary& summary);
/// JSON with the same numbers; units in the key names.
nlohmann::json probe_summary_json(const ProbeSummary& summary);

}  // namespace oomtune
