// `oomtune probe JOB.toml`: measure one training configuration per phase.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)
#include <CLI/CLI.hpp>

#include "commands.h"
#include "common/atomic_file.h"
#include "common/byte_size.h"
#include "common/error.h"
#include "common/host_memory.h"
#include "common/json_text.h"
#include "job/job_spec.h"
#include "probe_trials.h"
#include "recipes/plan_toml.h"
#include "recipes/zero_estimate.h"
#include "report/length_policies.h"
#include "report/probe_summary.h"
#include "search/memory_model.h"
#include "sequence_fit_trials.h"
#include "snapshot_paths.h"
#include "strategies/job_config.h"

namespace oomtune {
namespace {

struct ProbeFlags {
  std::string job_path;
  JobOverrides overrides;
  std::string config;
  std::string plan_path;
  std::vector<int64_t> fit_batches;
  std::vector<int64_t> fit_lengths;
  std::vector<int64_t> predict_lengths;
  int64_t replay_steps = kDefaultReplaySteps;
  bool no_fit = false;
  bool json = false;
  bool enforce_budget = false;
  std::string step_events_path;
  SnapshotFlags snapshots;
};

int run_probe(ProbeFlags flags) {
  TrainingConfig from_plan;
  ParameterSelection plan_trainable;
  OptimizerImplementation plan_implementation = kDefaultOptimizerImplementation;
  double plan_max_grad_norm = 0;
  std::optional<int64_t> plan_seq_len;
  std::optional<int64_t> plan_budget;
  double plan_headroom = 0;
  bool have_plan = false;
  if (!flags.plan_path.empty()) {
    // A plan names its job; an explicit JOB argument wins.
    const Plan plan = read_plan_toml(flags.plan_path);
    if (flags.job_path.empty()) {
      if (plan.job_spec_path.empty())
        throw InputError(fmt::format("{}: the plan names no job_spec; pass the job TOML as well", flags.plan_path));
      // A relative spec is read from the plan's folder (as a job spec's model
      // from the spec's), else from the current folder.
      namespace fs = std::filesystem;
      const fs::path beside = fs::path(flags.plan_path).parent_path() / plan.job_spec_path;
      flags.job_path =
          fs::path(plan.job_spec_path).is_relative() && fs::exists(beside) ? beside.string() : plan.job_spec_path;
      if (!fs::exists(flags.job_path))
        throw InputError(
            fmt::format("{}: [job] spec = \"{}\": no such file, beside the plan or here; pass the job "
                        "TOML as well",
                        flags.plan_path, plan.job_spec_path));
    }
    if (!flags.overrides.global_batch) flags.overrides.global_batch = plan.global_batch;
    from_plan = plan.config;
    plan_trainable = plan.trainable;
    plan_implementation = plan.optimizer.implementation;
    plan_max_grad_norm = plan.optimizer.max_grad_norm;
    plan_seq_len = plan.seq_len;
    plan_budget = plan.budget_bytes;
    plan_headroom = plan.headroom;
    have_plan = true;
  }
  if (flags.job_path.empty()) throw InputError("probe: give a job spec (JOB.toml) or --plan PLAN.toml");
  JobSpec job = load_job_spec(flags.job_path);
  // A plan verified at another length (autotune --seq N) runs at it; one at
  // the job's keeps the job's range or distribution.
  if (plan_seq_len && job.has_seq() && !flags.overrides.seq_len && job.seq_len != plan_seq_len) {
    fmt::print(stderr, "probe: {} was verified at seq = {}, not {}'s {}: probing the plan's\n", flags.plan_path,
               *plan_seq_len, flags.job_path, job.seq_len ? std::to_string(*job.seq_len) : "(none)");
    flags.overrides.seq_len = plan_seq_len;
  }
  apply_overrides(job, flags.overrides);
  require_device_support(job);
  default_host_budget(job, machine_memory_bytes());
  // The budget the plan fits, which autotune --budget may have set apart
  // from the job's; --budget wins.
  if (plan_budget && !flags.overrides.budget && (job.budget_bytes != *plan_budget || job.headroom != plan_headroom)) {
    fmt::print(stderr,
               "probe: {} fits a budget of {} (headroom {:g}), not {}'s {} ({:g}): probing against the plan's\n",
               flags.plan_path, format_bytes(*plan_budget), plan_headroom, flags.job_path,
               job.budget_bytes ? format_bytes(*job.budget_bytes) : std::string("none"), job.headroom);
    job.budget_bytes = *plan_budget;
    job.headroom = plan_headroom;
  }
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
  // And its gradient clipping (none in plans written before the key, which
  // were measured without).
  if (have_plan && plan_max_grad_norm != job.optimizer.max_grad_norm) {
    fmt::print(stderr, "probe: {} was measured with max_grad_norm = {}, not {}'s {}: probing the plan's\n",
               flags.plan_path, plan_max_grad_norm, flags.job_path, job.optimizer.max_grad_norm);
    job.optimizer.max_grad_norm = plan_max_grad_norm;
  }
  TrainingConfig config;
  try {
    config = normalize_config(parse_config_overrides(flags.config, have_plan ? from_plan : baseline_config(job)), job);
  } catch (const ConfigError& e) {
    // Say where the configuration came from: the plan, --config, or both.
    std::string from = have_plan ? flags.plan_path : "";
    if (!flags.config.empty()) from += (from.empty() ? "" : " with ") + fmt::format("--config {}", flags.config);
    if (from.empty() || std::string(e.what()).rfind(job.spec_path + ":", 0) == 0) throw;
    throw ConfigError(fmt::format("{}: {}", from, e.what()));
  }

  // The fit's micro-batches, checked before any trial runs.
  for (int64_t b : flags.fit_batches)
    if (b < 1 || b > job.global_batch)
      throw InputError(fmt::format("--fit-batches: each micro-batch must be in [1, {}] (the global batch), got {}",
                                   job.global_batch, b));
  if (!flags.no_fit && !job.has_seq() && !flags.fit_batches.empty() &&
      std::set<int64_t>(flags.fit_batches.begin(), flags.fit_batches.end()).size() < 2)
    throw InputError("--fit-batches: the retained-activation fit needs two or more distinct micro-batches");

  // The sequence fit's lengths, checked before any trial runs.
  if (!job.has_seq())
    for (const auto& [flag, values] :
         {std::pair{"--fit-lengths", &flags.fit_lengths}, std::pair{"--predict-lengths", &flags.predict_lengths}})
      if (!values->empty())
        throw InputError(fmt::format("{}: no input of {} names \"seq\" in its shape", flag, flags.job_path));
  for (const auto& [flag, values] :
       {std::pair{"--fit-lengths", &flags.fit_lengths}, std::pair{"--predict-lengths", &flags.predict_lengths}})
    for (int64_t t : *values)
      if (t < 1 || t > kMaxSeqLen)
        throw InputError(fmt::format("{}: each length must be in [1, {}], got {}", flag, kMaxSeqLen, t));
  std::vector<int64_t> lengths;  // empty: no sequence fit
  if (job.has_seq()) {
    lengths = flags.fit_lengths.empty() ? default_fit_lengths(job) : flags.fit_lengths;
    std::sort(lengths.begin(), lengths.end());  // cheap ones first; fit_sequence reads the last as the longest
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    if (lengths.size() < 2) {
      if (!flags.fit_lengths.empty())
        throw InputError("--fit-lengths: the sequence fit needs two or more distinct lengths");
      fmt::print(stderr, "probe: seq = {} leaves one length to fit (T, T/2, T/4 >= 1): no sequence fit\n",
                 *job.seq_len);
      lengths.clear();
    }
  }
  if (!flags.step_events_path.empty())
    require_writable_output("--step-events", flags.step_events_path, {flags.job_path, flags.plan_path, job.model_path});
  fmt::print(stderr, "probe: {} with {}\n", job.model_path, to_string(config));
  TrialOptions options;
  options.enforce_budget = flags.enforce_budget;
  options.record_events = true;
  options.step_events_path = flags.step_events_path;
  options.snapshot_path = SnapshotPaths(flags.snapshots, job).next(config);
  ProbeSummary summary;
  summary.job_path = flags.job_path;
  summary.model_path = job.model_path;
  summary.device = job.device;
  summary.budget_bytes = job.budget_bytes;
  summary.usable_budget_bytes = job.usable_budget_bytes();
  summary.usable_host_budget_bytes = job.usable_host_budget_bytes();
  summary.headroom = job.headroom;
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
    if (!lengths.empty()) {
      SequenceFitOptions fit;
      fit.batches = sizes;
      fit.lengths = lengths;
      fit.predict_lengths = flags.predict_lengths;
      fit.replay_steps = flags.replay_steps;
      summary.sequence = fit_sequence(job, config, fit, summary.activation_fit);
    } else if (sizes.size() >= 2) {
      summary.activation_fit = fit_activations(job, config, sizes);
    }
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
  CLI::Option* fit_batches =
      cmd->add_option("--fit-batches", flags->fit_batches, "Micro-batch sizes for the retained-activation fit")
          ->delimiter(',');
  CLI::Option* fit_lengths =
      cmd->add_option("--fit-lengths", flags->fit_lengths,
                      "Sequence lengths for the sequence fit of a job whose inputs name \"seq\" (default T, T/2, T/4)")
          ->delimiter(',');
  CLI::Option* predict_lengths =
      cmd->add_option("--predict-lengths", flags->predict_lengths,
                      "Lengths at which to predict the peak at the configuration's micro-batch (a \"seq\" job)")
          ->delimiter(',');
  CLI::Option* replay_steps =
      cmd->add_option("--replay-steps", flags->replay_steps,
                      "Steps of the caching-allocator replay at lengths drawn from the job's seq distribution "
                      "(default " +
                          std::to_string(kDefaultReplaySteps) + ")")
          ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  // Each of these sets up a fit that --no-fit skips: together they are a
  // mistake to name, not a choice to make silently.
  cmd->add_flag("--no-fit", flags->no_fit, "Skip the retained-activation and sequence fits")
      ->excludes(fit_batches)
      ->excludes(fit_lengths)
      ->excludes(predict_lengths)
      ->excludes(replay_steps);
  cmd->add_flag("--enforce-budget", flags->enforce_budget, "Fail allocations past the budget, as a GPU would");
  cmd->add_flag("--json", flags->json, "Print JSON instead of a table");
  add_snapshot_flags(*cmd, flags->snapshots);
  cmd->add_option("--step-events", flags->step_events_path,
                  "Write the measured step's allocation events to FILE (JSON; docs/allocator_simulator.md)");
  cmd->callback([flags, exit_code] { *exit_code = run_probe(*flags); });
}

}  // namespace oomtune
