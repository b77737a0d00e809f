// Each node's memory measured on the meta device (search.h, Rules: Memory
// from meta).

#include "search/search_state.h"

#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"
#include "common/error.h"
#include "search/model_fit.h"
#include "search/sentences.h"
#include "strategies/accumulation.h"

namespace oomtune {

std::string to_string(MemorySource source) { return source == MemorySource::kMeta ? "meta" : "probes"; }

}  // namespace oomtune

namespace oomtune::search_detail {

// Note [Memory from meta]
// The lines predict a node's peak at micro-batches no probe ran, and add
// each strategy's effect to them as a shift and a ratio measured on the
// plain base: within a few per cent on the models the tests hold, but a
// line, where memory is not (accumulation keeps the gradients alive,
// checkpointing n blocks, pairs of strategies whose effects overlap). On
// the meta device a configuration allocates the same storages with the
// same lifetimes as on a real device, with no data and no compute
// (probes/memory_tracker.h, count_meta), so each node's micro-batch is
// decided by its own peak measured there: at the micro-batch and with the
// accumulation it would run. The lines still steer: a node starts at the
// micro-batch they predict to fit and moves up or down by measurement
// (assuming, as the lines do, that more samples per micro-batch never need
// less memory), so most nodes cost one or two meta runs of about half a
// second (the example GPT). The real probes are then needed for time only:
// plain at two sizes (the seconds line's intercept and slope) and each
// strategy at one (its time ratio), where the candidates run (Note [Timing
// probes on meta]). Candidates are still verified by real runs in fresh
// processes.
// The first meta run, the plain configuration at the global batch, tells
// whether meta works for the model at all (an operator without a meta
// kernel): if not, the whole search uses the lines and a note says why, as
// it does where the runner has no meta device (a libtorch before 2.0). A
// later meta run that fails leaves its node to the lines, and a note names
// it (note_meta_failures).
void Search::start_meta() {
  result_.memory_only = options_.memory_only;
  if (options_.memory_from != MemorySource::kMeta && !options_.memory_only) return;
  const ProbeReport* r = meta_run(with_micro_batch(base_, job_.global_batch, job_.global_batch));
  if (!r) {
    if (options_.memory_only) throw InputError(fmt::format("{}: {}", job_.model_path, runner_.no_meta_device_reason()));
    result_.notes.push_back("memory from the probes' lines: " + runner_.no_meta_device_reason());
    return;
  }
  if (r->outcome != TrialOutcome::kOk) {
    if (options_.memory_only)
      throw InputError(fmt::format("{}: the plain configuration does not run on the meta device: {}", job_.model_path,
                                   outcome_of(*r)));
    result_.notes.push_back(fmt::format("memory from the probes' lines, not from the meta device: {}", outcome_of(*r)));
    return;
  }
  meta_ = true;
  result_.memory_from = MemorySource::kMeta;
}

// The meta run of `c`, run once per configuration and kept; nullptr when
// the runner has no meta device.
const ProbeReport* Search::meta_run(const TrainingConfig& c) {
  const std::string key = to_string(c);
  auto run = meta_runs_.find(key);
  if (run == meta_runs_.end()) {
    std::optional<ProbeReport> r = runner_.measure_on_meta(c);
    if (!r) return nullptr;
    hold_to_host_budget(*r, c);
    ++result_.meta_trials;
    progress_(fmt::format("meta   {:<60} {}", describe(c),
                          r->outcome == TrialOutcome::kOk ? "peak " + format_bytes(r->peak_bytes) : outcome_of(*r)));
    run = meta_runs_.emplace(key, std::move(*r)).first;
  }
  return &run->second;
}

// The peak `c` needs by its meta run (on CUDA its predicted reserved
// bytes: model_fit.h, budget_scale); nullopt without meta or when the run
// failed.
std::optional<double> Search::meta_peak(const TrainingConfig& c) {
  if (!meta_) return std::nullopt;
  const ProbeReport* r = meta_run(c);
  if (r == nullptr || r->outcome != TrialOutcome::kOk) return std::nullopt;
  return budget_scale(*r, job_) * static_cast<double>(r->peak_bytes);
}

// The largest of `candidates` (descending) whose meta peak fits the budget,
// starting at `predicted` (the lines' answer; 0: none fits) and moving up
// or down by measurement; 0 when none fits, nullopt when a meta run failed
// (the node is left to the lines).
std::optional<int64_t> Search::largest_fitting_on_meta(const std::vector<int64_t>& candidates, int64_t predicted,
                                                       const TrainingConfig& config) {
  if (!meta_ || candidates.empty()) return std::nullopt;
  const auto budget = static_cast<double>(result_.usable_budget_bytes);
  const auto fits = [&](std::size_t i) -> std::optional<bool> {
    const std::optional<double> peak = meta_peak(with_micro_batch(config, candidates[i], job_.global_batch));
    if (!peak) return std::nullopt;
    return *peak <= budget;
  };
  std::size_t i = candidates.size() - 1;  // none predicted to fit: start at the smallest
  for (std::size_t k = 0; k < candidates.size(); ++k)
    if (candidates[k] == predicted) i = k;
  const std::optional<bool> start = fits(i);
  if (!start) return std::nullopt;
  if (*start) {
    for (; i > 0; --i) {
      const std::optional<bool> larger = fits(i - 1);
      if (!larger) return std::nullopt;
      if (!*larger) break;
    }
    return candidates[i];
  }
  while (++i < candidates.size()) {
    const std::optional<bool> smaller = fits(i);
    if (!smaller) return std::nullopt;
    if (*smaller) return candidates[i];
  }
  return 0;
}

// Note [Timing probes on meta]
// With memory from meta the real probes only time, and a time line is
// only as good as where it was measured: fitted to plain at G/8 and G/4,
// it extrapolated the example GPT's step to 32 x 1 and 16 x 2 (4 and 8
// times the samples of the probes), and its ranking decided which
// candidates were verified (docs/autotune.md: the lines' and meta's
// searches verified different candidates and chose differently among
// configurations within a few per cent). Memory is known before any probe
// runs, so the probes are placed where the candidates run: plain at G when
// its meta peak fits (the plain node) and at the accumulation node's
// micro-batch (the largest fitting below G, balanced), so the seconds line
// passes through both and each is predicted by its own measurement; when
// plain does not fit at G, at the accumulation node's micro-batch and the
// balanced one with one more micro-batch below it. Each strategy is timed
// at the largest of those when its own meta peak there, with the
// accumulation it would run with, fits the budget (its nodes run there or
// above: a strategy saves memory), else at the smallest (a probe above
// the budget might not fit a real device). Where meta cannot say (no
// plain micro-batch fits, a meta run failed, one valid micro-batch), the
// plain probes run at G/8 and G/4 as before; so they do with memory only
// (Note [Memory only]), which times nothing.
std::vector<int64_t> Search::timing_sizes() {
  std::vector<int64_t> fallback = probe_sizes(job_);
  if (fallback.size() > 2) fallback.resize(2);
  const int64_t g = job_.global_batch;
  const std::vector<int64_t> valid = valid_micro_batches(job_);
  std::vector<int64_t> below;  // descending
  for (auto it = valid.rbegin(); it != valid.rend(); ++it)
    if (*it < g) below.push_back(*it);
  if (!meta_ || options_.memory_only || below.empty()) return fallback;  // memory only: nothing to time
  const auto budget = static_cast<double>(result_.usable_budget_bytes);
  const std::optional<double> at_g = meta_peak(with_micro_batch(base_, g, g));  // start_meta's run
  const bool g_fits = valid.back() == g && at_g && *at_g <= budget;
  const std::optional<int64_t> largest = largest_fitting_on_meta(below, below.front(), base_);
  if (!largest || *largest == 0) return fallback;
  // The smallest valid micro-batch at or below `b` that needs as many
  // micro-batches as b (add_node's balanced split), by meta when asked.
  const auto balanced = [&](int64_t b, bool measured) -> std::optional<int64_t> {
    for (int64_t s : valid) {
      if (s > b || micro_batch_count(g, s) != micro_batch_count(g, b)) continue;
      if (!measured) return s;
      const std::optional<double> peak = meta_peak(with_micro_batch(base_, s, g));
      if (!peak) return std::nullopt;
      if (*peak <= budget) return s;
    }
    return b;
  };
  const std::optional<int64_t> accumulation = balanced(*largest, true);
  if (!accumulation) return fallback;
  std::set<int64_t> sizes = {*accumulation};
  if (g_fits) {
    sizes.insert(g);
    // Note [Plain's verification times it]
    plain_verification_times_g_ = options_.max_verifications >= 2;
  } else {
    for (int64_t s : below)
      if (s < *accumulation) {
        sizes.insert(*balanced(s, false));
        break;
      }
  }
  if (sizes.size() < 2) return fallback;
  return {sizes.begin(), sizes.end()};
}

// Note [Plain's verification times it]
// Rationale: where plain's meta peak fits at G, plain G x 1 is a candidate,
// and the simplest one, so it is verified whenever two or more runs are
// (choose.cpp: the simplest candidate always takes a slot). A timing probe
// of plain at G would run the same configuration in a fresh process a
// second time, for fewer steps. On the example GPT that probe cost 1.2 s
// of a 17 s autotune, and with it meta's search took longer than the
// lines' (docs/autotune.md).
// Approach: with max_verifications >= 2 the plain probe at G is plain's
// verification run itself (TrialRunner::verify: the job's verify_steps, the
// usable budget enforced, events recorded as a probe's are), run where the
// probe would have been; its timing and peaks give the lines their point
// at G, and verify_candidates uses the run instead of making it again
// (verified_). A verification that does not run to the end (out of
// memory under the usable budget where meta said it fits, an error, a
// timeout) drops plain G x 1 as any failed verification does, and the
// probe at G runs after all for the lines' point.
// A verification within the budget settles the strategies that only add
// work too (search.h, Rules: Work added): every checkpointing or offload
// node runs as many micro-batches as plain G x 1 or more, and recomputes
// or moves the optimizer step to the CPU, so none can be faster than a
// configuration already verified (choose.cpp counts a faster measurement
// of one as noise), and their probes are not run (fit_models says so in a
// note); the walk then has no checkpointing or offload nodes.
// Limitations: the lines' point at G comes from more steps than a probe's
// (the median of 19 timed steps against 2 to 6); both are medians of
// steady steps, so the seconds line is not tilted by the difference.

// The one micro-batch a strategy's probe times at (Note [Timing probes on
// meta]): the largest plain size that ran when `config`'s meta peak there
// fits the budget, else the smallest.
int64_t Search::strategy_timing_size(const TrainingConfig& config, const std::vector<int64_t>& ran) {
  if (options_.memory_only) return ran.front();  // nothing to time
  const std::optional<double> peak = meta_peak(with_micro_batch(config, ran.back(), job_.global_batch));
  return peak && *peak <= static_cast<double>(result_.usable_budget_bytes) ? ran.back() : ran.front();
}

// Names the configurations whose meta run failed: their nodes were
// predicted from the lines.
void Search::note_meta_failures() {
  if (!meta_) return;  // start_meta's note says why
  // Only the strategies of some node: a meta run that placed a timing
  // probe for a form no node uses (bf16 autocast before a fallback to bf16
  // parameters: Note [Timing probes on meta]) left no node to the lines.
  std::set<std::string> nodes;
  for (const TrailNode& node : result_.trail) nodes.insert(memory_key(node.config));
  std::vector<std::string> failed;
  for (const auto& [config, r] : meta_runs_)
    if (r.outcome != TrialOutcome::kOk && nodes.count(memory_key(parse_config_overrides(config, TrainingConfig{}))))
      failed.push_back(fmt::format("{} ({})", config, outcome_of(r)));
  if (!failed.empty())
    result_.notes.push_back(
        fmt::format("meta: {} configuration{} did not run on the meta device, so {} predicted "
                    "from the probes' lines: {}",
                    failed.size(), failed.size() == 1 ? "" : "s",
                    failed.size() == 1 ? "its node was" : "their nodes were", fmt::join(failed, "; ")));
}

// Note [Memory only]
// A job whose trials run on the meta device only (device = "meta": a model
// exported without its weights, or one no machine here can train) has no
// step time to rank by and nothing to verify. Every node is measured on
// meta all the same, and the choice is the simplest configuration
// measured to fit: the fewest strategies (each is a moving part, and
// most cost time: search.h, Ties), then the fewest micro-batches (each
// pays a pass's fixed cost), then the larger peak: of two equally simple
// fits, the one that saves less memory changes the step less
// (checkpointing one block recomputes less than checkpointing all). It is labelled
// unverified: its speed, and its fit over many steps, need the target
// device (DESIGN.md: fitting two steps is not fitting).
// Optimizer offload comes last, as in the decision tree (checkpointing,
// micro-batch, accumulation, 8-bit optimizer, then offload): a configuration
// that offloads is chosen only where none that keeps its optimizer on the
// device fits. Its cost grows with the parameters, not the batch: every
// step copies twice the gradients' bytes over PCIe and updates on the
// host's CPU (LLaMA-7B in fp32: 50.21 GiB, at least 0.86 s a step at PCIe
// 5.0 x16's rate, before the CPU's update), where checkpointing recomputes
// one forward. At 80 GB the fewest strategies chose offload alone (65.00 GiB
// reserved) over 8-bit AdamW + checkpointing (65.97 GiB), which fits too.
void Search::choose_by_memory() {
  const auto fewest = [&](const TrailNode& a, const TrailNode& b) {
    const std::size_t sa = strategy_count(a.config, job_base_), sb = strategy_count(b.config, job_base_);
    if (sa != sb) return sa < sb;
    if (a.config.accumulation_steps != b.config.accumulation_steps)
      return a.config.accumulation_steps < b.config.accumulation_steps;
    return *a.meta_peak_bytes > *b.meta_peak_bytes;
  };
  const auto simpler = [&](const TrailNode& a, const TrailNode& b) {
    if (a.config.offload_optimizer != b.config.offload_optimizer) return !a.config.offload_optimizer;
    return fewest(a, b);
  };
  for (std::size_t i = 0; i < result_.trail.size(); ++i) {
    const TrailNode& node = result_.trail[i];
    if (!node.predicted_fit || !node.meta_peak_bytes) continue;
    if (!result_.chosen || simpler(node, result_.trail[*result_.chosen])) result_.chosen = i;
  }
  // An offload fit that would have been chosen but for coming last says
  // why it lost (Note [Memory only]).
  bool offload_passed_over = false;
  for (std::size_t i = 0; i < result_.trail.size(); ++i) {
    TrailNode& node = result_.trail[i];
    if ((result_.chosen && i == *result_.chosen) || !node.note.empty() || !node.predicted_fit) continue;
    if (!node.meta_peak_bytes) {
      node.note = "predicted to fit (its meta run failed), not chosen by memory alone";
    } else if (result_.chosen && node.config.offload_optimizer && fewest(node, result_.trail[*result_.chosen])) {
      offload_passed_over = true;
      node.note =
          "fits (measured on meta) and is simpler, but offloads: the tree's last resort, its PCIe copies and CPU "
          "update cost time per parameter";
    } else {
      node.note = "fits (measured on meta), with more strategies or micro-batches";
    }
  }
  if (!result_.chosen) return;
  TrailNode& chosen = result_.trail[*result_.chosen];
  chosen.note = fmt::format(
      "chosen by memory alone: the simplest measured to fit{}, {}{} below the budget; "
      "not verified (no step time on meta)",
      offload_passed_over ? " without optimizer offload" : "",
      format_bytes(result_.usable_budget_bytes - static_cast<int64_t>(*chosen.meta_peak_bytes)),
      result_.budget_on_reserved ? " of reserved bytes" : "");
  const TrailNode* exact = nullptr;  // the simplest fit that keeps the job's optimizer
  for (const TrailNode& node : result_.trail)
    if (node.predicted_fit && node.meta_peak_bytes && node.config.optimizer == job_base_.optimizer &&
        (!exact || simpler(node, *exact)))
      exact = &node;
  const std::string optimizer = to_string(job_base_.optimizer);
  note_optimizer_change(exact ? fmt::format("the simplest measured to fit with {} is {} ({}; {}{} on meta)", optimizer,
                                            exact->node, describe(exact->config),
                                            format_bytes(static_cast<int64_t>(*exact->meta_peak_bytes)),
                                            result_.budget_on_reserved ? " reserved" : "")
                              : fmt::format("no configuration with {} was measured to fit", optimizer));
}

}  // namespace oomtune::search_detail
