// `oomtune probe JOB.toml`: measure one training configuration per phase.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)
#include <CLI/CLI.hpp>

#include "allocsim/length_model.h"
#include "allocsim/length_peaks.h"
#include "allocsim/step_events_json.h"
#include "commands.h"
#include "common/error.h"
#include "common/json_text.h"
#include "job/job_spec.h"
#include "recipes/plan_toml.h"
#include "recipes/zero_estimate.h"
#include "report/probe_summary.h"
#include "search/memory_model.h"
#include "search/model_fit.h"
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
  std::vector<int64_t> fit_lengths;
  std::vector<int64_t> predict_lengths;
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

// A fit trial: `config` at micro-batch `b` (one micro-batch per step, one
// timed step, no budget), with `events_path` its step's events ("" none).
ProbeReport run_fit_trial(const JobSpec& job, const TrainingConfig& config, int64_t b, const std::string& events_path) {
  JobSpec small = job;
  small.global_batch = b;
  TrainingConfig at_b = config;
  at_b.micro_batch = b;
  at_b.accumulation_steps = 1;
  TrialOptions options;
  options.min_timed_steps = 1;
  options.max_timed_steps = 1;
  options.enforce_budget = false;
  options.record_events = !events_path.empty();  // also the predicted reserved bytes a CUDA budget counts
  options.step_events_path = events_path;
  return run_probe_trial(small, at_b, options);
}

// The retained-activation fit over the (size, report) pairs whose trial ran;
// none when fewer than two ran.
std::optional<ActivationFit> activation_fit_of(const std::vector<std::pair<int64_t, ProbeReport>>& trials) {
  ActivationFit fit;
  for (const auto& [b, r] : trials) {
    if (r.outcome != TrialOutcome::kOk) continue;
    fit.micro_batches.push_back(b);
    fit.retained_bytes.push_back(r.retained_activation_bytes);
  }
  if (fit.micro_batches.size() < 2) return std::nullopt;
  std::vector<double> xs(fit.micro_batches.begin(), fit.micro_batches.end());
  std::vector<double> ys(fit.retained_bytes.begin(), fit.retained_bytes.end());
  fit.fit = fit_line(xs, ys);
  return fit;
}

// The fit over the sizes whose trial ran; none when fewer than two ran.
std::optional<ActivationFit> fit_activations(const JobSpec& job, const TrainingConfig& config,
                                             const std::vector<int64_t>& sizes) {
  std::vector<std::pair<int64_t, ProbeReport>> trials;
  for (int64_t b : sizes) {
    fmt::print(stderr, "probe: retained activations at micro-batch {}\n", b);
    ProbeReport r = run_fit_trial(job, config, b, "");
    if (r.outcome != TrialOutcome::kOk)
      fmt::print(stderr, "probe: micro-batch {} left out of the fit: {}\n", b, outcome_text(r));
    trials.emplace_back(b, std::move(r));
  }
  return activation_fit_of(trials);
}

// The lengths of the sequence fit: T, T/2 and T/4 (with seq = [min, max]:
// min, their midpoint and max), at least 1, ascending: cheap ones first.
std::vector<int64_t> default_fit_lengths(const JobSpec& job) {
  const int64_t t = *job.seq_len;
  std::vector<int64_t> lengths = job.seq_min ? std::vector<int64_t>{*job.seq_min, (*job.seq_min + t) / 2, t}
                                             : std::vector<int64_t>{t / 4, t / 2, t};
  lengths.erase(std::remove_if(lengths.begin(), lengths.end(), [](int64_t n) { return n < 1; }), lengths.end());
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
}

// The step-events file of the fit trial at (b, t) (a temporary file).
std::string events_path_for(int64_t b, int64_t t) {
  return (std::filesystem::temp_directory_path() / fmt::format("oomtune-seq-{}-{}x{}.json", getpid(), b, t)).string();
}

// Note [Sequence fit]
// Rationale: a step's peak grows with B·T (embeddings, projections, logits)
// and, under eager attention, with B·T² (scores and their softmax); the
// job's length alone cannot tell the two apart, nor answer "how long a
// sequence fits".
// Approach: one trial at every (micro-batch, length) of the fit, shortest
// lengths first; each phase's peak fitted as fixed + B·(s + p·T + q·T²)
// (probes/seq_fit.h), the T² term kept where the data needs it. The trials
// at the largest micro-batch write their step's events; three lengths of
// them fit a LengthModel (allocsim/length_model.h), whose T² requests name
// the tensors and operators. The retained-activation fit reads the trials
// at the job's length.
// Limitations: every fit trial runs one micro-batch per step (as the
// activation fit's do); the answers extrapolate past the longest length
// probed and hold for that micro-batch scheme, not for accumulation's later
// micro-batches (gradients alive).
SequenceFit fit_sequence(const JobSpec& job, const TrainingConfig& config, const std::vector<int64_t>& batches,
                         const std::vector<int64_t>& lengths, const std::vector<int64_t>& predict_lengths,
                         std::optional<ActivationFit>& activation_fit) {
  SequenceFit fit;
  fit.length = *job.seq_len;
  fit.min_length = job.seq_min;
  fit.micro_batch = config.micro_batch;
  fit.usable_budget_bytes = job.usable_budget_bytes();
  fit.events_micro_batch = *std::max_element(batches.begin(), batches.end());
  std::vector<std::pair<int64_t, ProbeReport>> at_job_length;
  std::map<int64_t, std::vector<allocsim::LengthSample>> samples;                 // by micro-batch
  std::map<int64_t, std::pair<int64_t, std::array<double, kNumPhases>>> longest;  // by micro-batch: T, peaks
  for (int64_t t : lengths) {
    JobSpec at_t = job;
    at_t.seq_len = t;
    for (int64_t b : batches) {
      fmt::print(stderr, "probe: sequence fit at micro-batch {}, length {}\n", b, t);
      const std::string events = events_path_for(b, t);
      ProbeReport r = run_fit_trial(at_t, config, b, events);
      if (r.outcome != TrialOutcome::kOk) {
        fmt::print(stderr, "probe: micro-batch {} at length {} left out of the fit: {}\n", b, t, outcome_text(r));
        std::filesystem::remove(events);
        continue;
      }
      fit.probes.push_back({b, t, phase_peaks_of(r, at_t)});
      samples[b].push_back({t, allocsim::read_step_events(events)});
      std::filesystem::remove(events);
      longest[b] = {t, fit.probes.back().phase_peaks};  // lengths ascend
      if (t == fit.length) at_job_length.emplace_back(b, std::move(r));
    }
  }
  activation_fit = activation_fit_of(at_job_length);
  std::vector<SequenceEvents> events;
  for (auto& [b, at_b] : samples) {
    if (at_b.size() < 3) continue;
    try {
      SequenceEvents e;
      e.micro_batch = b;
      e.model = allocsim::LengthModel::fit(at_b);
      const auto& [t, measured] = longest.at(b);
      const auto live = allocsim::phase_live_peaks(e.model, t);
      for (Phase p : kStepPhases) {
        const auto i = static_cast<std::size_t>(p);
        e.before_step[i] = measured[i] - static_cast<double>(live[i]);
      }
      events.push_back(std::move(e));
    } catch (const InputError& e) {
      fmt::print(stderr, "probe: the step's events at micro-batch {} are left out: {}\n", b, e.what());
    }
  }
  if (!events.empty()) {
    fit.events_fitted = true;
    fit.events_micro_batch = events.back().micro_batch;
    fit.quadratic_operators = quadratic_operators(events.back().model, fit.length);
  }
  // Where the events show no request growing with T², no phase keeps a T²
  // term (probes/seq_fit.h).
  fit_sequence_phases(
      fit, std::any_of(events.begin(), events.end(), [](const SequenceEvents& e) { return e.model.quadratic(); }) ||
               events.empty());
  answer_from_events(fit, events, predict_lengths);
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
    if (!lengths.empty()) {
      summary.sequence = fit_sequence(job, config, sizes, lengths, flags.predict_lengths, summary.activation_fit);
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
  cmd->add_option("--fit-batches", flags->fit_batches, "Micro-batch sizes for the retained-activation fit")
      ->delimiter(',');
  cmd->add_option("--fit-lengths", flags->fit_lengths,
                  "Sequence lengths for the sequence fit of a job whose inputs name \"seq\" (default T, T/2, T/4)")
      ->delimiter(',');
  cmd->add_option("--predict-lengths", flags->predict_lengths,
                  "Lengths at which to predict the peak at the configuration's micro-batch (a \"seq\" job)")
      ->delimiter(',');
  cmd->add_flag("--no-fit", flags->no_fit, "Skip the retained-activation and sequence fits");
  cmd->add_flag("--enforce-budget", flags->enforce_budget, "Fail allocations past the budget, as a GPU would");
  cmd->add_flag("--json", flags->json, "Print JSON instead of a table");
  cmd->add_option("--step-events", flags->step_events_path,
                  "Write the measured step's allocation events to FILE (JSON; docs/allocator_simulator.md)");
  cmd->callback([flags, exit_code] { *exit_code = run_probe(*flags); });
}

}  // namespace oomtune
