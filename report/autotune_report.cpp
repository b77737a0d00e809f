#include "report/autotune_report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/byte_size.h"
#include "common/json_text.h"
#include "common/seconds_text.h"
#include "search/model_fit.h"
#include "strategies/job_config.h"

namespace oomtune {
namespace {

// Bytes per second one way over PCIe 5.0 x16, the H100's and H200's link:
// 32 GT/s x 16 lanes / 8 bits, 128b/130b encoding (PCI-SIG, PCIe Base
// Specification 5.0). A floor for a copy's time: real pinned copies are slower.
constexpr double kPcie5x16BytesPerSecond = 32e9 * 16 / 8 * 128 / 130;

// What a chosen offload timed off the GPU leaves out: on a GPU each step
// copies the gradients to the host and the updated parameters back, each as
// many bytes as the gradients (strategies/master_weights.h; ZeRO-Offload),
// and runs the update on the host's CPU. On the CPU backend the host is the
// device's own memory, so neither is in the measured time.
// The chosen configuration's host memory, where it matters: optimizer
// offload keeps its state there, and a host budget was given to check
// (search/host_budget.cpp, Note [Host budget]); "" otherwise.
std::string host_memory_line(const JobSpec& job, const TrainingConfig& config, int64_t host_peak_bytes) {
  const std::optional<int64_t> usable = job.usable_host_budget_bytes();
  if (!config.offload_optimizer && !usable) return "";
  return fmt::format("          host memory {} at its peak; {}", format_bytes(host_peak_bytes),
                     usable
                         ? fmt::format("margin {} to the usable host budget", format_bytes(*usable - host_peak_bytes))
                         : "no host budget to check it against (host_budget, --host-budget)");
}

std::string offload_copies_text(int64_t gradient_bytes) {
  const int64_t copied = 2 * gradient_bytes;
  return fmt::format(
      "offload on a GPU also copies {} a step over PCIe (the gradients to the host, the parameters back: at "
      "least {} s at PCIe 5.0 x16's 63 GB/s) and updates on the host's CPU; not in this time, measured where the "
      "host is the device's own memory",
      format_bytes(copied), format_seconds(static_cast<double>(copied) / kPcie5x16BytesPerSecond));
}

// How far `predicted` lies from `measured`, percent of `measured`.
double percent_off(double predicted, int64_t measured) { return 100 * (predicted / static_cast<double>(measured) - 1); }

// The chosen configuration's meta peak against its verification's:
// "+1.23 % from the measured one"; where that would print 0.00 %, the
// bytes themselves ("48 B under the measured one": a model's tensor
// constants, in host memory on meta, are device memory on the CPU).
std::string meta_against_measured(int64_t meta, int64_t measured) {
  if (meta == measured) return "the same bytes as the measured one";
  const double percent = percent_off(static_cast<double>(meta), measured);
  if (std::fabs(percent) >= 0.005) return fmt::format("{:+.2f} % from the measured one", percent);
  return fmt::format("{} {} the measured one", format_bytes(std::abs(meta - measured)),
                     meta < measured ? "under" : "over");
}

std::string bytes_or_dash(const std::optional<int64_t>& bytes) { return bytes ? format_bytes(*bytes) : "-"; }

std::string short_config(const TrainingConfig& c, int64_t largest_fitting = 0) {
  std::string text = fmt::format("{}x{}", c.micro_batch, c.accumulation_steps);
  if (largest_fitting > c.micro_batch) text += fmt::format(" (max {})", largest_fitting);
  if (c.checkpoint.enabled()) text += " ckpt:" + to_string(c.checkpoint);
  if (c.optimizer != OptimizerKind::kAdamW) text += " " + to_string(c.optimizer);
  if (c.offload_optimizer) text += " offload";
  if (c.precision != Precision::kFp32) text += " " + to_string(c.precision);
  return text;
}

nlohmann::json node_json(const TrailNode& n) {
  nlohmann::json j = {{"node", n.node},
                      {"config", to_string(n.config)},
                      {"micro_batch", n.config.micro_batch},
                      {"accumulation_steps", n.config.accumulation_steps},
                      {"largest_fitting_micro_batch", n.largest_fitting_micro_batch},
                      {"predicted_peak_bytes", static_cast<int64_t>(n.predicted_peak_bytes)},
                      {"meta_peak_bytes",
                       n.meta_peak_bytes ? nlohmann::json(static_cast<int64_t>(*n.meta_peak_bytes)) : nlohmann::json()},
                      {"meta_tensor_peak_bytes", json_or_null(n.meta_tensor_peak_bytes)},
                      {"meta_reserved_bytes", json_or_null(n.meta_reserved_bytes)},
                      {"meta_host_peak_bytes", json_or_null(n.meta_host_peak_bytes)},
                      {"predicted_seconds_per_global_batch", n.predicted_seconds},
                      {"predicted_fit", n.predicted_fit},
                      {"note", n.note}};
  if (n.verification) j["verification"] = to_json(*n.verification);
  return j;
}

/// The decision trail as a table. Columns are as wide as their widest cell,
/// so a long node name or configuration does not shift the numbers after it.
/// With memory from meta, a "meta peak" column follows the predicted one,
/// which then says "-" for every node that has a meta figure and is left
/// out when all have one.
/// Where the budget caps reserved bytes (a CUDA target), the predicted and
/// meta columns are reserved bytes and say so.
std::string render_trail_table(const SearchResult& s) {
  const bool meta = s.memory_from == MemorySource::kMeta;
  const std::string figure = s.budget_on_reserved ? "reserved" : "peak";
  using Row = std::vector<std::string>;
  std::vector<Row> rows = {{"#", "node", "micro x accum + strategies", "pred. " + figure, "meas. " + figure, "pred. s",
                            "meas. s", "fits", "note"}};
  if (meta) rows[0].insert(rows[0].begin() + 4, "meta " + figure);
  for (std::size_t i = 0; i < s.trail.size(); ++i) {
    const TrailNode& n = s.trail[i];
    std::string measured_peak = "-", measured_seconds = "-", fits = n.predicted_fit ? "pred." : "no";
    if (n.verification) {
      const ProbeReport& v = *n.verification;
      const int64_t measured = budgeted_peak_bytes(v, s.budget_on_reserved);
      measured_peak = v.outcome == TrialOutcome::kOk ? format_bytes(measured) : to_string(v.outcome);
      if (v.outcome == TrialOutcome::kOk) measured_seconds = fmt::format("{:.4f}", v.timing.steady_step_seconds);
      fits = v.outcome == TrialOutcome::kOk && measured <= s.usable_budget_bytes ? "yes" : "no";
    } else if (n.predicted_fit && n.meta_peak_bytes) {
      fits = "meta";
    }
    // A node measured on meta was placed by that figure; the lines' guess
    // beside it (one probe per strategy there, for time) only misleads.
    const std::string predicted = n.meta_peak_bytes ? "-" : format_bytes(static_cast<int64_t>(n.predicted_peak_bytes));
    rows.push_back({std::to_string(i + 1), n.node, short_config(n.config, n.largest_fitting_micro_batch), predicted,
                    measured_peak, fmt::format("{:.4f}", n.predicted_seconds), measured_seconds, fits, n.note});
    if (meta)
      rows.back().insert(rows.back().begin() + 4,
                         n.meta_peak_bytes ? format_bytes(static_cast<int64_t>(*n.meta_peak_bytes)) : "-");
  }
  if (s.memory_only)  // no verification, no time: the measured peak and both seconds columns
    for (Row& row : rows) row.erase(row.begin() + 5, row.begin() + 8);
  // Every node placed on meta: no prediction of the lines to show.
  if (meta && std::all_of(rows.begin() + 1, rows.end(), [](const Row& row) { return row[3] == "-"; }))
    for (Row& row : rows) row.erase(row.begin() + 3);
  std::vector<std::size_t> width(rows[0].size());
  for (const Row& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  // Text columns (#, node, configuration, note) align left; numbers and the
  // verdict align right. The note, last, is not padded.
  const auto left = [](std::size_t c) { return c < 3; };
  std::string out;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::string text;
    for (std::size_t c = 0; c + 1 < rows[r].size(); ++c)
      text += left(c) ? fmt::format("{:<{}} ", rows[r][c], width[c]) : fmt::format("{:>{}} ", rows[r][c], width[c]);
    text += " " + rows[r].back();
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out += text + (r + 1 < rows.size() ? "\n" : "");
  }
  return out;
}

// The candidates predicted to fit that no verification ran, as a line of
// the "not verified" answers; empty when none is left.
std::string not_run_text(const SearchResult& s) {
  const std::size_t not_run = candidates_not_run(s);
  if (not_run == 0) return "";
  return fmt::format("          {} more predicted to fit {} not run: --max-verifications N runs more\n", not_run,
                     not_run == 1 ? "was" : "were");
}

// Candidates predicted to fit whose verification runs all ran over the
// budget (ran_out_candidates), the search's walks again below them
// included: the memory model is low for this job. With none predicted to
// fit left unrun, nothing fits (exit 3), and there is no ZeRO/FSDP table:
// its rows would come from the same low model (in one, a single GPU fits).
std::string render_ran_out(const SearchResult& s, const std::vector<const TrailNode*>& nodes, const JobSpec& job) {
  const bool one = nodes.size() == 1;
  int64_t smallest = nodes.front()->config.micro_batch;
  bool past_first_step = false;   // a run out of memory after a step
  bool all_in_first_step = true;  // every run out of memory in its first step (none finished over the budget)
  std::string snapshot;           // the first run's that wrote one (a GPU job)
  for (const TrailNode* node : nodes) {
    const ProbeReport& run = *node->verification;
    smallest = std::min(smallest, node->config.micro_batch);
    const bool out_of_memory = run.outcome == TrialOutcome::kOutOfMemory;
    past_first_step |= out_of_memory && run.steps_run > 0;
    all_in_first_step &= out_of_memory && run.steps_run == 0;
    if (snapshot.empty()) snapshot = run.snapshot_path;
  }
  const char* why = past_first_step     ? "later steps hold more than the probes measured"
                    : all_in_first_step ? "no run got past its first step"
                                        : "their peaks were above the memory model's";
  const std::string runs = fmt::format("{} verification run{} of {} steps (down to micro-batch {})",
                                       one ? "its" : "their", one ? "" : "s", job.verify_steps, smallest);
  if (candidates_not_run(s) > 0)
    return fmt::format(
               "nothing verified to fit: {} configuration{} predicted to fit ran out of memory in {}: {}, so the "
               "memory model is low for this job; the notes say what ended each\n",
               nodes.size(), one ? "" : "s", runs, why) +
           not_run_text(s);
  return fmt::format(
      "nothing fits: {} predicted to fit ran out of memory in {}, and none is left to run: {}, so the memory "
      "model is low for this job; the notes say what ended each\n"
      "          no ZeRO/FSDP table: its per-GPU figures would come from that same model{}\n",
      one ? "the one configuration" : fmt::format("all {} configurations", nodes.size()), runs, why,
      snapshot.empty() ? "" : fmt::format("; what held the memory when a run ran out: oomtune diagnose {}", snapshot));
}

// Candidates predicted to fit whose verification runs ended without a
// measurement (unverified_candidates): what ended them, and for timeouts
// what trial_timeout a verification of the fastest needs.
std::string render_unverified(const SearchResult& s, const std::vector<const TrailNode*>& nodes, const JobSpec& job) {
  std::map<std::string, int> counts;  // runs by outcome
  const TrailNode* fastest_timeout = nullptr;
  for (const TrailNode* node : nodes) {
    ++counts[to_string(node->verification->outcome)];
    if (node->verification->outcome == TrialOutcome::kTimeout &&
        (!fastest_timeout || node->predicted_seconds < fastest_timeout->predicted_seconds))
      fastest_timeout = node;
  }
  std::vector<std::string> parts;
  for (const auto& [outcome, runs] : counts) parts.push_back(fmt::format("{} {}", runs, outcome));
  const bool one = nodes.size() == 1;
  std::string out = fmt::format(
      "not verified: the verification run{} of {} configuration{} predicted to fit ended "
      "without a measurement ({}), so whether {} is unknown; the notes say what ended each\n",
      one ? "" : "s", nodes.size(), one ? "" : "s", fmt::join(parts, ", "), one ? "it fits" : "they fit");
  out += not_run_text(s);
  if (fastest_timeout)
    out += fmt::format(
        "          a verification runs {} steps of the global batch: the fastest of these is predicted "
        "at {} s per step, {:.0f} s in all plus start-up; trial_timeout is {:.0f} s: raise it\n",
        job.verify_steps, format_seconds(fastest_timeout->predicted_seconds),
        static_cast<double>(job.verify_steps) * fastest_timeout->predicted_seconds, job.trial_timeout_seconds);
  return out;
}

// A job's length distribution (JobSpec::seq_lengths, set) in words.
std::string distribution_text(const JobSpec& job) { return describe_lengths(*job.seq_lengths, job.seq_lengths_file); }

// The same as JSON: the distribution, its span, the histogram's file and
// size, and the seed the lengths are drawn with.
nlohmann::json distribution_json(const JobSpec& job) {
  const LengthDistribution& d = *job.seq_lengths;
  nlohmann::json j = {{"distribution", d.kind == LengthDistribution::Kind::kHistogram ? "histogram"
                                       : d.kind == LengthDistribution::Kind::kFixed   ? "fixed"
                                                                                      : "uniform"},
                      {"min", d.min},
                      {"max", d.max},
                      {"seed", job.seed}};
  if (d.kind == LengthDistribution::Kind::kHistogram) {
    j["file"] = job.seq_lengths_file;
    j["observed_lengths"] = d.observed.size();
  }
  return j;
}

// The chosen configuration's verification at drawn lengths (trial/
// trial_runner.cpp, Note [Variable-length steps]): which steps ran at which
// lengths. Empty when its steps had no drawn lengths.
std::string drawn_verification_text(const ProbeReport& v, const JobSpec& job) {
  const std::optional<DrawnLengths> drawn = drawn_lengths(v);
  if (!job.seq_lengths || !drawn) return "";
  return fmt::format(
      "          verified at lengths drawn from {} (seed {}): steps 3 to {} at {} to {} tokens (mean {:.0f}), steps 1 "
      "and 2 at the longest, {}; the time is the mean over the drawn steps\n",
      distribution_text(job), job.seed, v.step_lengths.size(), drawn->shortest, drawn->longest, drawn->mean,
      v.step_lengths[1]);
}

// The sequence lines: the length every trial ran at and, with a range, the
// longest sequence the chosen configuration fits.
std::string render_autotune_sequence(const AutotuneSequence& q, const JobSpec& job) {
  std::string out;
  if (job.seq_lengths) {
    out += fmt::format(
        "sequence  every trial's warm-up and measured step at T = {} tokens, the longest of {}; their later steps "
        "and the verification runs at lengths drawn from it (seed {}); the length stays as given\n",
        q.length, distribution_text(job), job.seed);
  } else if (!q.min_length) {
    out += fmt::format(
        "sequence  every trial at T = {} tokens (seq = {}); the length stays as given (seq = [min, max] asks for the "
        "longest that fits)\n",
        q.length, q.length);
    return out;
  } else {
    out += fmt::format(
        "sequence  every trial at T = {} tokens, the longest of seq = [{}, {}]; the length stays as given\n", q.length,
        *q.min_length, q.length);
  }
  if (!q.min_length) return out;
  if (!q.fit) {
    out += fmt::format("          longest sequence that fits: not fitted ({})\n", q.problem);
    return out;
  }
  const SequenceFit& f = *q.fit;
  std::set<int64_t> lengths;
  for (const SequenceProbe& p : f.probes) lengths.insert(p.length);
  out += fmt::format(
      "          longest sequence the chosen configuration fits: {} tokens at micro-batch {} ({}; fitted to "
      "lengths {}{})\n",
      f.longest_length, f.micro_batch,
      f.length_limit == Phase::kLoad ? std::string("no phase reaches the budget below the cap")
                                     : fmt::format("limited by {}", phase_name(f.length_limit)),
      fmt::join(lengths, ", "), f.longest_length > f.length ? fmt::format("; beyond {}: extrapolated", f.length) : "");
  return out;
}

nlohmann::json autotune_sequence_json(const AutotuneSequence& q) {
  nlohmann::json j = {{"length", q.length}, {"min_length", json_or_null(q.min_length)}, {"length_kept", true}};
  if (q.fit) {
    j["longest_length"] = q.fit->longest_length;
    j["longest_length_limited_by"] = std::string(phase_name(q.fit->length_limit));
    j["fit"] = sequence_fit_json(*q.fit);
  } else if (!q.problem.empty()) {
    j["problem"] = q.problem;
  }
  return j;
}

}  // namespace

std::string render_autotune_text(const AutotuneReport& report) {
  const SearchResult& s = report.search;
  const JobSpec& job = report.job;
  std::string out;
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  if (s.frozen_parameter_count > 0)
    line(fmt::format(
        "autotune  {}  ({} trainable + {} frozen parameters: {})", job.model_path, s.parameter_count,
        s.frozen_parameter_count,
        fmt::format("{} = [\"{}\"]", key_of(job.trainable.rule), fmt::join(job.trainable.globs, "\", \""))));
  else
    line(fmt::format("autotune  {}  ({} parameters)", job.model_path, s.parameter_count));
  line(fmt::format("budget    {} ({} usable after {:.0f} % headroom), device {}, global batch {}",
                   bytes_or_dash(job.budget_bytes), format_bytes(s.usable_budget_bytes), 100 * job.headroom,
                   device_name(job.device), job.global_batch));
  if (const std::optional<int64_t> host = job.usable_host_budget_bytes())
    line(
        fmt::format("host      {} ({} usable after {:.0f} % headroom{}) for optimizer offload's fp32 masters, "
                    "gradients and state",
                    format_bytes(*job.host_budget_bytes), format_bytes(*host), 100 * job.headroom,
                    job.host_budget_is_machines ? "; this machine's memory: host_budget sets another" : ""));
  if (s.baseline_micro_batches.empty()) {
    line(fmt::format("model     none: no configuration ran at micro-batch {}", s.smallest_micro_batch));
  } else {
    // One size ran (the next ran out of memory or time, or the job allows
    // no other): the memory slope is its retained activations' and the
    // time line is flat (search/fit.cpp, fit_models); say so where the
    // numbers are.
    const bool one_size = s.baseline_micro_batches.size() == 1;
    line(fmt::format("model     {} peak = {} + {} per sample{}", s.baseline_name,
                     format_bytes(static_cast<int64_t>(s.baseline_peak.intercept)),
                     format_bytes(static_cast<int64_t>(s.baseline_peak.slope)),
                     one_size ? " (the slope of its retained activations, a lower bound)" : ""));
    // Backward's activation peak passes that line within the job's
    // micro-batches: larger ones follow it (memory_model.cpp, Note
    // [Backward activation peak]).
    const BatchLine& activation = s.baseline_backward_activation;
    const auto largest = static_cast<double>(largest_micro_batch(job));
    if (activation.slope > s.baseline_peak.slope && activation(largest) > s.baseline_peak(largest)) {
      const double from =
          (s.baseline_peak.intercept - activation.intercept) / (activation.slope - s.baseline_peak.slope);
      line(
          fmt::format("          {} backward's activation peak = {} + {} per sample, above that line from "
                      "micro-batch {}",
                      s.baseline_name, format_bytes(static_cast<int64_t>(activation.intercept)),
                      format_bytes(static_cast<int64_t>(activation.slope)),
                      std::max<int64_t>(1, static_cast<int64_t>(std::floor(from)) + 1)));
    }
    // The optimizer's share only where the probes timed it
    // (search/memory_model.cpp, Note [Step time]).
    const std::string optimizer_step =
        s.baseline_optimizer_seconds > 0
            ? fmt::format("+ {} s per optimizer step", format_seconds(s.baseline_optimizer_seconds))
            : "";
    if (s.memory_only) {
      line("          no step time: the meta device computes shapes, not values");
    } else if (one_size) {
      const int64_t size = s.baseline_micro_batches.front();
      line(
          fmt::format("          {} step = {} s per micro-batch{} (measured at micro-batch {} only: larger "
                      "micro-batches are predicted as fast, an upper bound on their speed)",
                      s.baseline_name, format_seconds(s.baseline_seconds(static_cast<double>(size))),
                      optimizer_step.empty() ? "" : ", " + optimizer_step, size));
    } else {
      // One point may be plain's verification run (search/meta_memory.cpp,
      // Note [Plain's verification times it]).
      const std::string verified = s.baseline_verified_micro_batch > 0
                                       ? fmt::format("; at {} its verification run", s.baseline_verified_micro_batch)
                                       : "";
      line(fmt::format("          {} step = {} s + {} s per sample{} (both fitted to the {} {} at micro-batch {}{})",
                       s.baseline_name, format_seconds(s.baseline_seconds.intercept),
                       format_seconds(s.baseline_seconds.slope),
                       optimizer_step.empty() ? "" : " per micro-batch, " + optimizer_step, s.baseline_name,
                       verified.empty() ? "probes" : "runs", fmt::join(s.baseline_micro_batches, ", "), verified));
    }
  }
  if (s.memory_from == MemorySource::kMeta)
    line(fmt::format(
        "memory    each node's micro-batch chosen by its peak measured on the meta device ({} runs, "
        "exact storages, no compute); {}",
        s.meta_trials, s.memory_only ? "nothing verified or timed (memory only)" : "the lines above predict and time"));
  line("");
  if (!s.trail.empty()) {
    line(render_trail_table(s));
    line("");
  }
  if (s.chosen && !s.trail[*s.chosen].verification) {  // by memory alone (search/meta_memory.cpp, Note [Memory only])
    const TrailNode& best = s.trail[*s.chosen];
    line(fmt::format("chosen    {}  (by memory alone: not verified)", to_string(best.config)));
    line(fmt::format("          global batch {} = micro-batch {} x {} accumulation steps (exact)", job.global_batch,
                     best.config.micro_batch, best.config.accumulation_steps));
    // The fit was decided on reserved bytes where they were predicted
    // (model_fit.h, budget_scale), on the tensors' peak otherwise.
    const bool fit_on_reserved = s.budget_on_reserved && best.meta_tensor_peak_bytes && best.meta_reserved_bytes;
    if (fit_on_reserved) {
      line(fmt::format("          meta peak {} of tensors and cuBLAS workspaces",
                       format_bytes(*best.meta_tensor_peak_bytes)));
    } else {
      const auto peak = static_cast<int64_t>(best.meta_peak_bytes.value_or(best.predicted_peak_bytes));
      line(fmt::format("          meta peak {}; margin {} to the usable budget", format_bytes(peak),
                       format_bytes(s.usable_budget_bytes - peak)));
    }
    if (best.meta_reserved_bytes) {
      const int64_t margin = s.usable_budget_bytes - *best.meta_reserved_bytes;
      line(fmt::format(
          "          on a CUDA caching allocator ({}): {} reserved (predicted, cuBLAS workspaces included); {}",
          job.cuda_target, format_bytes(*best.meta_reserved_bytes),
          margin >= 0 ? fmt::format("margin {}{}", format_bytes(margin), fit_on_reserved ? " to the usable budget" : "")
                      : fmt::format("{} over the usable budget: the allocator's cache may run out where the "
                                    "tensors fit; verify on the GPU",
                                    format_bytes(-margin))));
    }
    if (best.meta_host_peak_bytes)
      if (const std::string host = host_memory_line(job, best.config, *best.meta_host_peak_bytes); !host.empty())
        line(host);
    line(
        "          the simplest configuration measured to fit, optimizer offload last: the meta device has no step "
        "time to rank by, and a fit over many steps is verified on the target device (autotune with device = "
        "\"cuda\")");
  } else if (s.chosen) {
    const TrailNode& best = s.trail[*s.chosen];
    const ProbeReport& v = *best.verification;
    line(fmt::format("chosen    {}", to_string(best.config)));
    line(fmt::format("          global batch {} = micro-batch {} x {} accumulation steps (exact)", job.global_batch,
                     best.config.micro_batch, best.config.accumulation_steps));
    // On a GPU the budget capped the allocator's reserved bytes, so the
    // margin is theirs (model_fit.h, budgeted_peak_bytes).
    const int64_t budgeted = budgeted_peak_bytes(v, s.budget_on_reserved);
    line(fmt::format("          measured peak {} over {} steps in a fresh process; margin {} to the usable budget",
                     budgeted_peak_text(v, s.budget_on_reserved), v.steps_run,
                     format_bytes(s.usable_budget_bytes - budgeted)));
    if (const std::string host = host_memory_line(job, best.config, v.host_peak_bytes); !host.empty()) line(host);
    if (budgeted != v.peak_bytes && best.meta_tensor_peak_bytes && best.meta_reserved_bytes && v.peak_bytes > 0)
      line(fmt::format(
          "          meta run of the same configuration: {} of tensors and cuBLAS workspaces, {:+.2f} % from "
          "the measured ones; {} reserved (predicted), {:+.2f} %",
          format_bytes(*best.meta_tensor_peak_bytes),
          percent_off(static_cast<double>(*best.meta_tensor_peak_bytes), v.peak_bytes),
          format_bytes(*best.meta_reserved_bytes),
          percent_off(static_cast<double>(*best.meta_reserved_bytes), budgeted)));
    else if (best.meta_peak_bytes && v.peak_bytes > 0)
      line(fmt::format("          meta peak {} of the same configuration, {}",
                       format_bytes(static_cast<int64_t>(*best.meta_peak_bytes)),
                       meta_against_measured(static_cast<int64_t>(*best.meta_peak_bytes), v.peak_bytes)));
    // A CPU job's fit counts tensors; what the GPU would reserve for the
    // same run is said beside it (trial_runner.cpp, Note [The budget on a
    // CUDA target]).
    if (!s.budget_on_reserved && v.reserved)
      if (const std::string cuda = cuda_budget_text(*v.reserved); !cuda.empty())
        line(fmt::format("          on CUDA ({}): {}", job.cuda_target, cuda));
    line(fmt::format("          {:.1f} samples/s measured ({:.4f} s per global batch)", v.samples_per_second,
                     v.timing.steady_step_seconds));
    if (best.config.offload_optimizer && job.device != Device::kCuda)
      line("          " + offload_copies_text(v.static_memory.gradient_bytes));
    out += drawn_verification_text(v, job);
    if (const std::string scratch = kernel_scratch_text(v.kernel_scratch); !scratch.empty())
      line("          kernel scratch " + scratch);
  } else if (const auto unverified = unverified_candidates(s); !unverified.empty()) {
    out += render_unverified(s, unverified, job);
  } else if (const auto ran_out = ran_out_candidates(s); !ran_out.empty()) {
    // walk.cpp, Note [Verifications that run out of memory]
    out += render_ran_out(s, ran_out, job);
  } else if (!s.parameters_alone.empty()) {  // search/fit.cpp, Note [Parameters alone]
    line("nothing fits one GPU: " + s.parameters_alone);
    if (!report.nothing_fits) {
      line(
          "          no ZeRO/FSDP table: the parameter count is unknown (no trial got past loading the weights); "
          "autotune with device = \"meta\" (libtorch 2) counts them without their memory");
    } else {
      out += report.nothing_fits->table;
      if (s.baseline_micro_batches.empty())
        line(
            "          activations were never measured (no plain probe got past loading), so the table counts "
            "none: its totals are lower bounds");
    }
  } else if (!s.least_memory_failure.empty()) {
    line(fmt::format("nothing fits: {}; the usable budget is {}", s.least_memory_failure,
                     format_bytes(s.usable_budget_bytes)));
    if (report.nothing_fits) {
      out += report.nothing_fits->table;
      line(
          "          activations were never measured (nothing ran), so the table counts none: its totals are "
          "lower bounds");
    }
  } else if (s.smallest_meta_peak_bytes) {
    line(fmt::format(
        "nothing fits: the least memory any configuration needs is {}{} (measured on meta: {}), the "
        "usable budget is {}",
        format_bytes(static_cast<int64_t>(*s.smallest_meta_peak_bytes)), s.budget_on_reserved ? " reserved" : "",
        s.smallest_meta_configuration, format_bytes(s.usable_budget_bytes)));
    if (report.nothing_fits) out += report.nothing_fits->table;
  } else {
    line(
        fmt::format("nothing fits: the least memory any configuration needs is {} (predicted, micro-batch {}), "
                    "the usable budget is {}",
                    format_bytes(static_cast<int64_t>(s.smallest_predicted_peak_bytes)), s.smallest_micro_batch,
                    format_bytes(s.usable_budget_bytes)));
    if (report.nothing_fits) out += report.nothing_fits->table;
  }
  if (report.sequence) {
    line("");
    out += render_autotune_sequence(*report.sequence, job);
  }
  if (!s.notes.empty()) {
    line("");
    for (const auto& note : s.notes) line("note: " + note);
  }
  const auto counted = [](auto n, const char* what) { return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s"); };
  line(fmt::format("trials    {} + {}{}", counted(s.probes.size(), "probe"),
                   counted(s.verification_trials, "verification run"),
                   s.meta_trials > 0 ? fmt::format(" + {} (memory only)", counted(s.meta_trials, "meta run")) : ""));
  for (const auto& path : report.emitted_files) line("wrote     " + path);
  return out;
}

nlohmann::json autotune_json(const AutotuneReport& report) {
  const SearchResult& s = report.search;
  nlohmann::json trail = nlohmann::json::array();
  for (const TrailNode& n : s.trail) trail.push_back(node_json(n));
  nlohmann::json probes = nlohmann::json::array();
  for (const ProbeReport& p : s.probes) probes.push_back(to_json(p));
  nlohmann::json j = {{"job", report.job_path},
                      {"model", report.job.model_path},
                      {"device", device_name(report.job.device)},
                      {"global_batch", report.job.global_batch},
                      {"budget_bytes", json_or_null(report.job.budget_bytes)},
                      {"usable_budget_bytes", s.usable_budget_bytes},
                      {"host_budget_bytes", json_or_null(report.job.host_budget_bytes)},
                      {"usable_host_budget_bytes", json_or_null(report.job.usable_host_budget_bytes())},
                      {"parameter_count", s.parameter_count},
                      {"frozen_parameter_count", s.frozen_parameter_count},
                      {"baseline_model",
                       {{"configuration", s.baseline_name},
                        {"peak_intercept_bytes", s.baseline_peak.intercept},
                        {"peak_bytes_per_sample", s.baseline_peak.slope},
                        {"backward_activation_intercept_bytes", s.baseline_backward_activation.intercept},
                        {"backward_activation_bytes_per_sample", s.baseline_backward_activation.slope},
                        {"seconds_intercept", s.baseline_seconds.intercept},
                        {"seconds_per_sample", s.baseline_seconds.slope},
                        {"optimizer_seconds", s.baseline_optimizer_seconds},
                        {"micro_batches", s.baseline_micro_batches},
                        {"verified_micro_batch", s.baseline_verified_micro_batch}}},
                      {"probes", probes},
                      {"trail", trail},
                      {"notes", s.notes},
                      {"verification_trials", s.verification_trials},
                      {"memory_from", to_string(s.memory_from)},
                      {"memory_only", s.memory_only},
                      {"budget_on_reserved", s.budget_on_reserved},
                      {"meta_trials", s.meta_trials},
                      {"smallest_predicted_peak_bytes", static_cast<int64_t>(s.smallest_predicted_peak_bytes)},
                      {"smallest_micro_batch", s.smallest_micro_batch},
                      {"largest_micro_batch", s.largest_micro_batch},
                      {"smallest_meta_peak_bytes",
                       s.smallest_meta_peak_bytes ? nlohmann::json(static_cast<int64_t>(*s.smallest_meta_peak_bytes))
                                                  : nlohmann::json()},
                      {"smallest_meta_configuration",
                       s.smallest_meta_peak_bytes ? nlohmann::json(s.smallest_meta_configuration) : nlohmann::json()},
                      {"emitted_files", report.emitted_files}};
  j["chosen"] = s.chosen ? node_json(s.trail[*s.chosen]) : nlohmann::json();
  if (report.nothing_fits) j["nothing_fits"] = report.nothing_fits->json;
  nlohmann::json unverified = nlohmann::json::array();
  for (const TrailNode* node : unverified_candidates(s)) unverified.push_back(node_json(*node));
  j["unverified"] = unverified;
  // search/walk.cpp, Note [Verifications that run out of memory]
  nlohmann::json ran_out = nlohmann::json::array();
  for (const TrailNode* node : ran_out_candidates(s)) ran_out.push_back(node_json(*node));
  j["ran_out_in_verification"] = ran_out;
  j["candidates_not_run"] = candidates_not_run(s);
  j["trial_timeout_seconds"] = report.job.trial_timeout_seconds;
  if (report.sequence) {
    j["sequence"] = autotune_sequence_json(*report.sequence);
    if (report.job.seq_lengths) {  // trial/trial_runner.cpp, Note [Variable-length steps]
      j["sequence"]["distribution"] = distribution_json(report.job);
      if (s.chosen && s.trail[*s.chosen].verification)
        j["sequence"]["verification_step_lengths"] = s.trail[*s.chosen].verification->step_lengths;
    }
  }
  j["least_memory_failure"] =
      s.least_memory_failure.empty() ? nlohmann::json() : nlohmann::json(s.least_memory_failure);
  j["parameters_alone"] = s.parameters_alone.empty() ? nlohmann::json() : nlohmann::json(s.parameters_alone);
  return j;
}

}  // namespace oomtune
