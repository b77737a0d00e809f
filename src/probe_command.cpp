// `oomtune probe JOB.toml`: measure one training configuration per phase.

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)
#include <CLI/CLI.hpp>

#include "commands.h"
#include "common/error.h"
#include "common/json_text.h"
#include "job/job_spec.h"
#include "recipes/plan_toml.h"
#include "recipes/zero_estimate.h"
#include "report/probe_summary.h"
#include "strategies/job_config.h"
#include "trial/child_trial.h"

namespace oomtune {
namespace {

struct ProbeFlags {
  std::string job_path;
  JobOverrides overrides;
  std::string config;
  std::string plan_path;
  std::vector<int64_t> fit_batches;
  bool no_fit = false;
  bool json = false;
  bool enforce_budget = false;
  std::string step_events_path;
};

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

// The fit over the sizes whose trial ran; none when fewer than two ran.
std::optional<ActivationFit> fit_activations(const JobSpec& job, const TrainingConfig& config,
                                             const std::vector<int64_t>& sizes) {
  ActivationFit fit;
  for (int64_t b : sizes) {
    JobSpec small = job;
    small.global_batch = b;
    TrainingConfig at_b = config;
    at_b.micro_batch = b;
    at_b.accumulation_steps = 1;
    TrialOptions options;
    options.min_timed_steps = 1;
    options.max_timed_steps = 1;
    options.enforce_budget = false;
    fmt::print(stderr, "probe: retained activations at micro-batch {}\n", b);
    const ProbeReport r = run_probe_trial(small, at_b, options);
    if (r.outcome != TrialOutcome::kOk) {
      fmt::print(stderr, "probe: micro-batch {} left out of the fit: {}\n", b, outcome_text(r));
      continue;
    }
    fit.micro_batches.push_back(b);
    fit.retained_bytes.push_back(r.retained_activation_bytes);
  }
  if (fit.micro_batches.size() < 2) return std::nullopt;
  std::vector<double> xs(fit.micro_batches.begin(), fit.micro_batches.end());
  std::vector<double> ys(fit.retained_bytes.begin(), fit.retained_bytes.end());
  fit.fit = fit_line(xs, ys);
  return fit;
}

int run_probe(ProbeFlags flags) {
  TrainingConfig from_plan;
  ParameterSelection plan_trainable;
  OptimizerImplementation plan_implementation = kDefaultOptimizerImplementation;
  bool have_plan = false;
  if (!flags.plan_path.empty()) {
    // A plan names its job; an explicit JOB argument wins.
    const Plan plan = read_plan_toml(flags.plan_path);
    if (flags.job_path.empty()) flags.job_path = plan.job_spec_path;
    if (flags.job_path.empty())
      throw InputError(fmt::format("{}: the plan names no job_spec; pass the job TOML as well", flags.plan_path));
    if (!flags.overrides.global_batch) flags.overrides.global_batch = plan.global_batch;
    from_plan = plan.config;
    plan_trainable = plan.trainable;
    plan_implementation = plan.optimizer.implementation;
    have_plan = true;
  }
  if (flags.job_path.empty()) throw InputError("probe: give a job spec (JOB.toml) or --plan PLAN.toml");
  JobSpec job = load_job_spec(flags.job_path);
  apply_overrides(job, flags.overrides);
  require_device_support(job);
  // The plan's trainable set is part of what was measured, as its
  // configuration is: it wins over the job's, and says so when they differ.
  if (have_plan && plan_trainable != job.trainable) {
    const auto describe = [](const ParameterSelection& s) {
      return s.freezes() ? fmt::format("{} = [{}]", key_of(s.rule), fmt::join(s.globs, ", "))
                         : std::string("every parameter trainable");
    };
    fmt::print(stderr, "probe: {} was measured with {}, not {}'s {}: probing the plan's\n", flags.plan_path,
               describe(plan_trainable), flags.job_path, describe(job.trainable));
    job.trainable = plan_trainable;
  }
  // Likewise the torch.optim implementation the plan measured.
  if (have_plan && plan_implementation != job.optimizer.implementation) {
    fmt::print(stderr, "probe: {} was measured with optimizer implementation {}, not {}'s {}: probing the plan's\n",
               flags.plan_path, to_string(plan_implementation), flags.job_path,
               to_string(job.optimizer.implementation));
    job.optimizer.implementation = plan_implementation;
  }
  TrainingConfig config =
      normalize_config(parse_config_overrides(flags.config, have_plan ? from_plan : baseline_config(job)), job);

  fmt::print(stderr, "probe: {} with {}\n", job.model_path, to_string(config));
  TrialOptions options;
  options.enforce_budget = flags.enforce_budget;
  options.record_events = true;
  options.step_events_path = flags.step_events_path;
  ProbeSummary summary;
  summary.job_path = flags.job_path;
  summary.model_path = job.model_path;
  summary.device = job.device;
  summary.budget_bytes = job.budget_bytes;
  summary.report = run_probe_trial(job, config, options);
  const BytesPerParameter per =
      stored_bytes_per_parameter(config, job.optimizer.momentum > 0, job.trainable.frozen_bf16);
  const auto bytes = [](double each, int64_t count) {
    return static_cast<int64_t>(std::llround(each * static_cast<double>(count)));
  };
  const int64_t trainable = summary.report.parameter_count;
  summary.analytic = {bytes(per.weights, trainable), bytes(per.gradients, trainable),
                      bytes(per.optimizer_state, trainable),
                      bytes(per.frozen_weights, summary.report.frozen_parameter_count)};
  if (summary.report.outcome == TrialOutcome::kOk && !flags.no_fit) {
    const auto sizes = flags.fit_batches.empty() ? default_fit_batches(config.micro_batch) : flags.fit_batches;
    if (sizes.size() >= 2) summary.activation_fit = fit_activations(job, config, sizes);
  }
  if (flags.json)
    fmt::print("{}\n", json_text(probe_summary_json(summary), 2));
  else
    fmt::print("{}", render_probe_text(summary));
  return summary.report.outcome == TrialOutcome::kOk ? kExitOk : kExitFailure;
}

}  // namespace

void add_probe_command(CLI::App& app, const Command& self, int* exit_code) {
  auto flags = std::make_shared<ProbeFlags>();
  CLI::App* cmd = app.add_subcommand(self.name, self.help);
  cmd->add_option("job", flags->job_path, "Job spec (TOML); optional with --plan, whose job_spec it then uses");
  add_job_override_flags(*cmd, flags->overrides);
  cmd->add_option("--plan", flags->plan_path, "Run the configuration of a plan.toml (as written by autotune --emit)");
  cmd->add_option(
      "--config", flags->config,
      "Configuration to measure, e.g. \"ckpt=all,micro_batch=4,optimizer=adamw8bit,offload=on,precision=bf16\"");
  cmd->add_option("--fit-batches", flags->fit_batches, "Micro-batch sizes for the retained-activation fit")
      ->delimiter(',');
  cmd->add_flag("--no-fit", flags->no_fit, "Skip the retained-activation fit");
  cmd->add_flag("--enforce-budget", flags->enforce_budget, "Fail allocations past the budget, as a GPU would");
  cmd->add_flag("--json", flags->json, "Print JSON instead of a table");
  cmd->add_option("--step-events", flags->step_events_path,
                  "Write the measured step's allocation events to FILE (JSON; docs/allocator_simulator.md)");
  cmd->callback([flags, exit_code] { *exit_code = run_probe(*flags); });
}

}  // namespace oomtune
