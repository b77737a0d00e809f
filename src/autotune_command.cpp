// `oomtune autotune JOB.toml`: find the fastest training configuration that
// fits the memory budget, verified by real runs in fresh processes.

#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "commands.h"
#include "common/byte_size.h"
#include "common/error.h"
#include "common/host_memory.h"
#include "common/json_text.h"
#include "compat/torch_compat.h"
#include "job/job_spec.h"
#include "recipes/recipes.h"
#include "recipes/zero_estimate.h"
#include "report/autotune_report.h"
#include "search/model_fit.h"
#include "search/search.h"
#include "snapshot_paths.h"
#include "strategies/accumulation.h"
#include "trial/child_trial.h"

namespace oomtune {
namespace {

// Probes may use more than the budget (they measure the curve), but not
// without bound: past this multiple of the usable budget a probe is an
// out-of-memory result, so a bad guess cannot exhaust host RAM.
constexpr int64_t kProbeBudgetMultiple = 4;

/// Trials in child processes (DESIGN.md: the search never runs a model in
/// its own process).
class ChildTrialRunner : public TrialRunner {
 public:
  ChildTrialRunner(const JobSpec& job, const SnapshotFlags& snapshots)
      : job_(job), child_(child_options(job)), meta_(child_), snapshots_(snapshots, job) {}

  ProbeReport probe(const TrainingConfig& config) override {
    JobSpec probe_job = job_;
    probe_job.global_batch = config.micro_batch;
    probe_job.allow_remainder = false;
    probe_job.headroom = 0;
    if (job_.usable_budget_bytes()) probe_job.budget_bytes = kProbeBudgetMultiple * *job_.usable_budget_bytes();
    TrialOptions options;
    options.min_timed_steps = 2;
    options.max_timed_steps = 6;
    options.record_events = true;  // predicted reserved bytes, for CUDA budgets
    // On meta a probe holds no memory, so no guard: an out-of-memory probe
    // would rule its strategy out of every combination (LLaMA-7B's bf16
    // parameters with foreach AdamW pass 4 x a 40 GB budget alone, and fit
    // with offload).
    options.enforce_budget = job_.device != Device::kMeta;
    options.snapshot_path = snapshots_.next(config);
    return run_trial_in_child(probe_job, config, options, child_);
  }

  ProbeReport verify(const TrainingConfig& config) override {
    TrialOptions options;
    options.total_steps = job_.verify_steps;
    options.enforce_budget = true;
    // As a probe's: plain's verification can stand for its probe at the
    // global batch (search/meta_memory.cpp, Note [Plain's verification
    // times it]), and predicted reserved bytes sit beside the verified peak.
    options.record_events = true;
    options.snapshot_path = snapshots_.next(config);
    return run_trial_in_child(job_, config, options, child_);
  }

  std::optional<ProbeReport> measure_on_meta(const TrainingConfig& config) override {
    if (!compat::kMetaDeviceCounted) return std::nullopt;  // libtorch 1.13: no child is spent on it
    JobSpec meta_job = job_;
    meta_job.device = Device::kMeta;
    TrialOptions options;
    options.enforce_budget = false;  // the peak is the answer, whatever it is
    options.record_events = true;    // predicted reserved bytes, for CUDA budgets
    // One child serves the search's meta runs, one after another: a meta
    // run holds no data and no cache, so it reports the same in a fresh
    // process or after others (ChildTrial.MetaTrialsInOneChildReportWhatFreshChildrenDo),
    // and libtorch loads once instead of once per run.
    return meta_.run(meta_job, config, options);
  }

  std::string no_meta_device_reason() const override { return compat::meta_device_problem(); }

  /// Throws InputError, with the trial's one line, when a child finds that
  /// the job's device cannot run here (no NVIDIA driver, no device
  /// visible: require_cuda_trial). Costs one child start, no model load.
  void require_device() {
    TrialOptions options;
    options.device_check_only = true;
    const ProbeReport r = run_trial_in_child(job_, TrainingConfig{}, options, child_);
    if (r.outcome == TrialOutcome::kError && r.input_error) throw InputError(r.message);
  }

 private:
  static ChildTrialOptions child_options(const JobSpec& job) {
    ChildTrialOptions child;
    child.timeout_seconds = job.trial_timeout_seconds;
    return child;
  }
  JobSpec job_;
  ChildTrialOptions child_;
  TrialServer meta_;
  SnapshotPaths snapshots_;
};

// Note [Autotune and the sequence length]
// Rationale: a job whose inputs name "seq" trains at a length the user
// chose; the search's strategies trade memory for time at that length, and
// trading length for micro-batch would change what is trained (tokens per
// step, what attention sees), which no configuration may do behind the
// user's back. So every trial runs at job.seq_len, a range's max included:
// a step of variable-length training must hold its longest batch.
// Approach: with seq = [min, max], the chosen configuration runs once more at
// min, the midpoint and max (one micro-batch per step, as a probe) and each
// phase's peak is fitted in T (probes/seq_fit.h); the longest length under
// the usable budget is reported, the length the plan names stays max.
// With a length distribution (seq = { min, max, distribution }) the trials'
// warm-up and measured steps run at its max and their later steps, and the
// verification runs, at lengths drawn from it (trial/trial_runner.cpp, Note
// [Variable-length steps]); the runs at min, midpoint and max run at those
// lengths alone.
// Limitations: with accumulation, a later micro-batch holds the gradients
// as well: their bytes are added to forward's, loss's and backward's peaks
// (an upper bound for backward, whose peak may include some already).
AutotuneSequence autotune_sequence(const JobSpec& job, const SearchResult& search, const ChildTrialOptions& child) {
  AutotuneSequence q;
  q.length = *job.seq_len;
  q.min_length = job.seq_min;
  if (!job.seq_min || !search.chosen) return q;
  if (*job.seq_min == *job.seq_len) {
    q.problem = "the range holds one length";
    return q;
  }
  const TrainingConfig& chosen = search.trail[*search.chosen].config;
  SequenceFit fit;
  fit.length = *job.seq_len;
  fit.min_length = job.seq_min;
  fit.micro_batch = chosen.micro_batch;
  fit.usable_budget_bytes = job.usable_budget_bytes();
  std::set<int64_t> lengths = {*job.seq_min, (*job.seq_min + *job.seq_len) / 2, *job.seq_len};
  for (int64_t t : lengths) {
    JobSpec at_t = job;
    at_t.fix_seq_len(t);  // every step at t, not at drawn lengths (Note [Variable-length steps])
    at_t.global_batch = chosen.micro_batch;
    at_t.allow_remainder = false;
    TrainingConfig config = chosen;
    config.accumulation_steps = 1;
    TrialOptions options;
    options.min_timed_steps = 1;
    options.max_timed_steps = 1;
    options.enforce_budget = false;
    options.record_events = true;  // predicted reserved bytes, for CUDA budgets
    fmt::print(stderr, "autotune: the chosen configuration at length {}\n", t);
    const ProbeReport r = run_trial_in_child(at_t, config, options, child);
    if (r.outcome != TrialOutcome::kOk) {
      fmt::print(stderr, "autotune: length {} left out of the sequence fit: {}\n", t, outcome_text(r));
      continue;
    }
    SequenceProbe probe{chosen.micro_batch, t, phase_peaks_of(r, at_t)};
    if (chosen.accumulation_steps > 1)
      for (Phase p : {Phase::kForward, Phase::kLoss, Phase::kBackward})
        probe.phase_peaks[static_cast<std::size_t>(p)] +=
            budget_scale(r, at_t) * static_cast<double>(r.static_memory.gradient_bytes);
    fit.probes.push_back(probe);
  }
  try {
    fit_sequence_phases(fit);
    q.fit = std::move(fit);
  } catch (const InputError& e) {
    q.problem = e.what();
  }
  return q;
}

struct AutotuneFlags {
  std::string job_path;
  JobOverrides overrides;
  bool json = false;
  std::string emit_dir;
  int64_t max_verifications = 3;
  std::string memory_from = "meta";
  SnapshotFlags snapshots;
};

// The chosen configuration of a job with remainder = "last_smaller" may run
// the global batch with a smaller last micro-batch (31 as 8 x 3 + 7). No
// framework config expresses one (docs/recipes.md), nor does the plan, so
// --emit writes nothing and says which global batches would do.
void require_equal_micro_batches(const AutotuneReport& report, const std::string& emit_dir) {
  const TrainingConfig& c = report.search.trail[*report.search.chosen].config;
  const int64_t g = report.job.global_batch;
  if (c.micro_batch * c.accumulation_steps == g) return;
  const int64_t last = g - (c.accumulation_steps - 1) * c.micro_batch;
  throw InputError(fmt::format(
      "--emit {}: nothing written: the chosen configuration runs the global batch {} as {} x {} + {} (remainder = "
      "\"last_smaller\"), and every framework config (and plan.toml) takes equal micro-batches; a global batch that "
      "{} divides ({}) gives one",
      emit_dir, g, c.micro_batch, c.accumulation_steps - 1, last, c.micro_batch,
      divisible_global_batches(g, c.micro_batch)));
}

Plan plan_from(const AutotuneReport& report) {
  const TrailNode& best = report.search.trail[*report.search.chosen];
  const JobSpec& job = report.job;
  Plan plan;
  plan.config = best.config;
  plan.global_batch = job.global_batch;
  plan.optimizer = {
      job.optimizer.lr,  job.optimizer.weight_decay, job.optimizer.beta1,         job.optimizer.beta2,
      job.optimizer.eps, job.optimizer.momentum,     job.optimizer.max_grad_norm, job.optimizer.implementation};
  plan.device = job.device;
  plan.budget_bytes = job.budget_bytes;
  plan.headroom = job.headroom;
  plan.model_path = job.model_path;
  plan.job_spec_path = std::filesystem::absolute(report.job_path).lexically_normal().string();
  plan.measured_peak_bytes = budgeted_peak_bytes(*best.verification, report.search.budget_on_reserved);
  plan.predicted_peak_bytes = static_cast<int64_t>(best.predicted_peak_bytes);
  plan.measured_samples_per_second = best.verification->samples_per_second;
  if (best.config.offload_optimizer) plan.measured_host_peak_bytes = best.verification->host_peak_bytes;
  if (best.predicted_seconds > 0)
    plan.predicted_samples_per_second = static_cast<double>(job.global_batch) / best.predicted_seconds;
  plan.notes = report.search.notes;
  plan.trainable = job.trainable;
  plan.seq_len = job.seq_len;
  // Sizes DeepSpeed's ZeRO-2 buckets in the emitted files (recipes/plan.h).
  if (report.search.parameter_count > 0) plan.parameter_count = report.search.parameter_count;
  return plan;
}

// The retained activations per sample of the probes that checkpointed
// every block in the job's own precision and optimizer, without offload
// (the least of them); nullopt when none ran. Retained activations grow
// with the micro-batch from an intercept of 0 or more, so a probe at
// micro-batch s gives a lower bound at 1: retained(s) / s.
std::optional<int64_t> checkpointed_activations(const SearchResult& s, const TrainingConfig& job_config) {
  std::optional<int64_t> least;
  for (const ProbeReport& r : s.probes) {
    if (r.outcome != TrialOutcome::kOk || r.micro_batch < 1) continue;
    TrainingConfig c = job_config;
    c.micro_batch = r.micro_batch;
    c.checkpoint.mode = CheckpointPlan::Mode::kAll;
    if (r.config != to_string(c)) continue;
    const int64_t per_sample = r.retained_activation_bytes / r.micro_batch;
    if (!least || per_sample < *least) least = per_sample;
  }
  return least;
}

// A model that trains a learned attention bias where PyTorch would run cuDNN
// attention, which cannot (Note [Mask gradients] in
// probes/attention_model.cpp): the training script must turn cuDNN SDPA off
// for the memory the search counted, and for the step to run at all.
std::optional<std::string> learned_bias_note(const SearchResult& search) {
  for (const ProbeReport& r : search.probes)
    if (r.attention && r.attention->cudnn_passed_over_calls > 0)
      return fmt::format(
          "attention: the model passes a mask that requires grad (a learned bias) to scaled_dot_product_attention, "
          "and cuDNN attention, which PyTorch 2.11 prefers on {} for these calls, has no gradient for it (torch "
          "raises \"not differentiable with respect to argument 'attn_bias'\"); the memory above is the efficient "
          "kernel's: train with torch.backends.cuda.enable_cudnn_sdp(False) (read from PyTorch's sources, not yet "
          "seen on a GPU)",
          r.attention->target);
  return std::nullopt;
}

// Per-GPU memory under ZeRO / FSDP when nothing fits one device, from the
// measured parameters and the activations at micro-batch 1: plain's, or
// where the search measured checkpointing every block in the job's
// precision and optimizer and they are less, those (the table is a lower
// bound, and a model that fits no GPU trains with checkpointing: LLaMA-7B
// at 2048 tokens retains 37.21 GiB plain, 1.34 GiB checkpointed, which
// decides whether any row fits a 24 GB GPU).
NothingFits nothing_fits_table(const AutotuneReport& report) {
  const SearchResult& s = report.search;
  ZeroInputs inputs;
  inputs.parameters = s.parameter_count;
  inputs.frozen_parameters = s.frozen_parameter_count;
  // The job's own precision and optimizer as oomtune's step stores them
  // (autocast keeps fp32 weights; bf16_params is mixed precision).
  TrainingConfig job_config;
  job_config.precision = parse_precision(report.job.precision);
  job_config.optimizer = parse_optimizer(report.job.optimizer.kind);
  inputs.bytes =
      stored_bytes_per_parameter(job_config, report.job.optimizer.momentum > 0, report.job.trainable.frozen_bf16);
  const StaticMemory& m = s.static_memory;
  const double state =
      static_cast<double>(m.parameter_bytes + m.frozen_parameter_bytes + m.gradient_bytes + m.optimizer_state_bytes);
  inputs.activation_bytes = static_cast<int64_t>(std::max(s.baseline_peak.slope, s.baseline_peak(1.0) - state));
  if (const std::optional<int64_t> checkpointed = checkpointed_activations(s, job_config);
      checkpointed && *checkpointed < inputs.activation_bytes) {
    inputs.activation_bytes = *checkpointed;
    inputs.activation_source = "retained with activation checkpointing of every block";
  }
  inputs.gpus = 8;
  inputs.budget_bytes = s.usable_budget_bytes;
  // Where the budget is on reserved bytes (a CUDA or meta job), every GPU's
  // allocator holds the libraries' workspaces too, as the probes saw them.
  if (s.budget_on_reserved)
    for (const ProbeReport& r : s.probes)
      if (r.workspaces) inputs.workspace_bytes = std::max(inputs.workspace_bytes, r.workspaces->total_bytes());
  const ZeroTable table = zero_table(inputs);
  return {render_zero_table(table), zero_table_json(table)};
}

int run_autotune(const AutotuneFlags& flags) {
  AutotuneReport report;
  report.job_path = flags.job_path;
  report.job = load_job_spec(flags.job_path);
  apply_overrides(report.job, flags.overrides);
  require_device_support(report.job);
  default_host_budget(report.job, machine_memory_bytes());
  // On meta the trials measure memory only: the search chooses by memory
  // alone and verifies nothing (search/meta_memory.cpp, Note [Memory only]).
  const bool memory_only = report.job.device == Device::kMeta;
  if (memory_only && !flags.emit_dir.empty())
    throw InputError(
        fmt::format("{}: --emit writes a verified plan, and on device = \"meta\" nothing is "
                    "verified; autotune on the target device (device = \"cuda\") to emit one",
                    flags.job_path));
  if (!report.job.budget_bytes)
    throw InputError(
        fmt::format("{}: autotune needs a memory budget: set budget = \"8GiB\" or pass --budget", flags.job_path));
  if (!flags.emit_dir.empty() && std::filesystem::exists(flags.emit_dir) &&
      !std::filesystem::is_directory(flags.emit_dir))
    throw InputError(fmt::format("--emit {}: exists and is not a folder", flags.emit_dir));
  if (!flags.emit_dir.empty()) require_emit_folder(flags.emit_dir);  // now, not after the search
  if (!flags.emit_dir.empty() && report.job.allow_remainder && report.job.global_batch > 1)
    fmt::print(stderr,
               "autotune: note: remainder = \"last_smaller\": --emit writes the configs only if the chosen "
               "micro-batch divides the global batch {} (frameworks take equal micro-batches)\n",
               report.job.global_batch);
  fmt::print(stderr, "autotune: {} under {} on {}\n", report.job.model_path, format_bytes(*report.job.budget_bytes),
             device_name(report.job.device));
  ChildTrialRunner runner(report.job, flags.snapshots);
  // Whether a GPU answers, before the search's meta runs come first (a 7B
  // model's take minutes): a CUDA build asks a child (this process does
  // not load libtorch).
  if (report.job.device == Device::kCuda) runner.require_device();
  if (report.job.has_seq() && report.job.seq_lengths)
    fmt::print(stderr,
               "autotune: every trial's warm-up and measured step at sequence length {} (the longest of the job's "
               "seq), its later steps at lengths drawn from seq with seed {}\n",
               *report.job.seq_len, report.job.seed);
  else if (report.job.has_seq())
    fmt::print(stderr, "autotune: every trial at sequence length {} (the job's seq)\n", *report.job.seq_len);
  SearchOptions options;
  options.max_verifications = flags.max_verifications;
  options.memory_from = flags.memory_from == "meta" ? MemorySource::kMeta : MemorySource::kProbes;
  options.memory_only = memory_only;
  report.search =
      search(report.job, runner, options, [](const std::string& line) { fmt::print(stderr, "autotune: {}\n", line); });
  if (std::optional<std::string> note = learned_bias_note(report.search)) report.search.notes.push_back(*note);
  if (report.job.has_seq()) {
    ChildTrialOptions child;
    child.timeout_seconds = report.job.trial_timeout_seconds;
    report.sequence = autotune_sequence(report.job, report.search, child);
  }
  // No candidate chosen: "nothing fits" only when none ended its
  // verification for a reason other than memory (a timeout proves nothing),
  // and none predicted to fit is left unrun after runs out of memory (the
  // memory model was low: a smaller one may fit).
  const bool ran_out = !ran_out_candidates(report.search).empty();
  const bool unverified = !report.search.chosen && (!unverified_candidates(report.search).empty() ||
                                                    (ran_out && candidates_not_run(report.search) > 0));
  std::exception_ptr emit_failed;  // said after the report, which is not lost with it
  if (report.search.chosen && !flags.emit_dir.empty()) {
    try {
      require_equal_micro_batches(report, flags.emit_dir);
      for (const EmittedFile& file : emit_all(plan_from(report), flags.emit_dir))
        report.emitted_files.push_back(file.path);
    } catch (const Error&) {
      emit_failed = std::current_exception();
    }
  } else if (!report.search.chosen && !unverified && !ran_out &&
             report.search.parameter_count + report.search.frozen_parameter_count > 0) {
    // No count where no trial got past loading (search/fit.cpp, Note
    // [Parameters alone]): the report says so instead of a table. None
    // where verifications ran out of memory: the table would rest on the
    // memory model they found low (render_ran_out).
    report.nothing_fits = nothing_fits_table(report);
  }
  if (flags.json)
    fmt::print("{}\n", json_text(autotune_json(report), 2));
  else
    fmt::print("{}", render_autotune_text(report));
  if (emit_failed) std::rethrow_exception(emit_failed);
  if (report.search.chosen) return kExitOk;
  return unverified ? kExitUnverified : kExitNothingFits;
}

}  // namespace

void add_autotune_command(CLI::App& app, const Command& self, int* exit_code) {
  auto flags = std::make_shared<AutotuneFlags>();
  CLI::App* cmd = app.add_subcommand(self.name, self.help);
  cmd->add_option("job", flags->job_path, "Job spec (TOML)")->required();
  add_job_override_flags(*cmd, flags->overrides);
  cmd->add_option("--min-micro-batch", flags->overrides.min_micro_batch,
                  "Smallest micro-batch to try (overrides the file)");
  cmd->add_option("--max-micro-batch", flags->overrides.max_micro_batch,
                  "Largest micro-batch to try, e.g. for the data loader's host memory (overrides the file)");
  // A verification is what makes a candidate fit (DESIGN.md): none would report "nothing fits".
  cmd->add_option("--max-verifications", flags->max_verifications, "Real runs of the top candidates (default 3)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  cmd->add_option("--emit", flags->emit_dir,
                  "Write plan.toml and DeepSpeed/HF/Lightning/Accelerate configs for the chosen plan into DIR");
  cmd->add_option("--memory-from", flags->memory_from,
                  "meta (default): each configuration's peak measured on the meta device where the model runs "
                  "there (libtorch 2), else the probes' lines; probes: the lines only")
      ->check(CLI::IsMember({"meta", "probes"}));
  cmd->add_flag("--json", flags->json, "Print JSON instead of a table");
  add_snapshot_flags(*cmd, flags->snapshots);
  cmd->callback([flags, exit_code] { *exit_code = run_autotune(*flags); });
}

}  // namespace oomtune
