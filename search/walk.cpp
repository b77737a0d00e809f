// The walk: every node of the tree, each at the largest micro-batch
// predicted to fit (search.h, Rules).

#include "search/search_state.h"

#include <algorithm>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"
#include "common/seconds_text.h"
#include "search/sentences.h"
#include "strategies/accumulation.h"
#include "strategies/job_config.h"

namespace oomtune::search_detail {

CheckpointPlan checkpoint_every_block() {
  CheckpointPlan plan;
  plan.mode = CheckpointPlan::Mode::kAll;
  return plan;
}

TrainingConfig with_micro_batch(TrainingConfig c, int64_t micro_batch, int64_t global_batch) {
  c.micro_batch = micro_batch;
  c.accumulation_steps = micro_batch_count(global_batch, micro_batch);
  return c;
}

// Adds the node for `config` at the largest valid micro-batch that is
// predicted to fit (at most `largest`), balanced (see the Rules), or at
// the largest valid one within reach if none fits (what it would need).
// With `exact`, only micro-batch `largest` itself is tried.
// `alternative`: the models of a rescue alternative (Note [Rescue]),
// whose node is named tree_name as it is; else models_.
void Search::add_node(const std::string& tree_name, const TrainingConfig& config, int64_t largest, bool exact,
                      const StepModels* alternative) {
  const StepModels& models = alternative ? *alternative : models_;
  // After a rescue the nodes carry the rescued strategies (Note [Rescue]),
  // all but a rescued 8-bit AdamW that offload replaced.
  const std::string rescued = alternative ? "" : rescue_label(rescue_strategies_ & strategies_used(config, job_base_));
  const std::string name = rescued.empty() ? tree_name : tree_name == "plain" ? rescued : tree_name + " + " + rescued;
  const std::vector<int64_t> valid = valid_micro_batches(job_);
  if (valid.empty()) return;
  if (exact && std::find(valid.begin(), valid.end(), largest) == valid.end()) return;
  if (valid.front() > largest) {  // e.g. accumulation when only the global batch itself is a valid micro-batch
    result_.notes.push_back(
        largest < 1 ? fmt::format("{}: not possible (the global batch is {} sample: no smaller micro-batch)", name,
                                  job_.global_batch)
                    : fmt::format("{}: not possible (no valid micro-batch is {} or less; valid: {})", name, largest,
                                  fmt::join(valid, ", ")));
    return;
  }
  const auto budget = static_cast<double>(result_.usable_budget_bytes);
  const int64_t out_of_memory = smallest_out_of_memory(config);
  const int64_t g = job_.global_batch;
  TrailNode node;
  node.node = name;
  std::vector<int64_t> candidates;  // descending
  for (auto it = valid.rbegin(); it != valid.rend(); ++it)
    if (*it <= largest && (!exact || *it == largest) && *it < out_of_memory) candidates.push_back(*it);
  const auto predicted_fits = [&](int64_t b) {
    return predict(models, with_micro_batch(config, b, g), g).peak_bytes <= budget;
  };
  for (int64_t b : candidates)
    if (predicted_fits(b)) {
      node.largest_fitting_micro_batch = b;
      break;
    }
  // Note [Memory from meta] (meta_memory.cpp)
  const std::optional<int64_t> measured = largest_fitting_on_meta(candidates, node.largest_fitting_micro_batch, config);
  if (measured) node.largest_fitting_micro_batch = *measured;
  const auto fits = [&](int64_t b) {
    if (measured)
      if (const std::optional<double> peak = meta_peak(with_micro_batch(config, b, g))) return *peak <= budget;
    return predicted_fits(b);
  };
  int64_t at = valid.front();  // the largest valid micro-batch within reach, else the smallest
  for (int64_t b : valid)
    if (b <= largest) at = b;
  if (node.largest_fitting_micro_batch > 0) {
    const int64_t steps = micro_batch_count(g, node.largest_fitting_micro_batch);
    at = node.largest_fitting_micro_batch;
    // Ascending: the first that needs as few micro-batches and fits is the
    // balanced one (a smaller first micro-batch can still lose: the later
    // ones run with the gradients alive).
    for (int64_t b : valid)
      if (b <= at && micro_batch_count(g, b) == steps && fits(b)) {
        at = b;
        break;
      }
  }
  node.config = with_micro_batch(config, at, g);
  const StepPrediction p = predict(models, node.config, g);
  node.predicted_peak_bytes = p.peak_bytes;
  node.predicted_seconds = p.seconds_per_global_batch;
  if (measured) {
    node.meta_peak_bytes = meta_peak(node.config);
    if (const ProbeReport* r = meta_run(node.config); r && r->outcome == TrialOutcome::kOk) {
      // A CUDA run's allocated bytes hold the cuBLAS workspaces too.
      node.meta_tensor_peak_bytes = r->peak_bytes + (r->workspaces ? r->workspaces->beside_peaks_bytes() : 0);
      if (r->reserved) node.meta_reserved_bytes = r->reserved->peak_reserved_bytes;
      node.meta_host_peak_bytes = r->host_peak_bytes;
    }
  }
  const double peak = node.meta_peak_bytes.value_or(p.peak_bytes);
  node.predicted_fit = peak <= budget && at < out_of_memory;
  if (peak > budget)
    node.note = fmt::format("{} not to fit: {}{} > budget {}", node.meta_peak_bytes ? "measured on meta" : "predicted",
                            format_bytes(static_cast<int64_t>(peak)), result_.budget_on_reserved ? " reserved" : "",
                            format_bytes(result_.usable_budget_bytes));
  else if (!node.predicted_fit)
    node.note = fmt::format("does not fit: its probe ran out of memory at micro-batch {} (measured)", out_of_memory);
  // The configuration goes last: its length varies the most.
  progress_(fmt::format("node   {:<42} {:<9} {:>11} {:<12} {}", name, node.meta_peak_bytes ? "meta" : "predicted",
                        format_bytes(static_cast<int64_t>(peak)), node.predicted_fit ? "fits" : "does not fit",
                        describe(node.config)));
  result_.trail.push_back(std::move(node));
}

// Probes run under a guard of at least the budget, so a probe out of
// memory at micro-batch s proves that its configuration fits at no
// micro-batch of s or more, accumulating or not (the later micro-batches
// add the gradients). This bounds what a line through one point cannot:
// it has no slope (a rescued base that runs only at the smallest size).
std::string Search::memory_key(TrainingConfig c) {
  c.micro_batch = 0;
  c.accumulation_steps = 1;
  return to_string(c);
}
void Search::rule_out_from(const TrainingConfig& c, int64_t micro_batch) {
  auto [at, added] = out_of_memory_at_.emplace(memory_key(c), micro_batch);
  if (!added) at->second = std::min(at->second, micro_batch);
}
int64_t Search::smallest_out_of_memory(const TrainingConfig& c) const {
  const auto at = out_of_memory_at_.find(memory_key(c));
  return at == out_of_memory_at_.end() ? std::numeric_limits<int64_t>::max() : at->second;
}

// The first n of the blocks checkpoint_all_ checkpoints.
CheckpointPlan Search::first_blocks(int64_t n) const {
  CheckpointPlan plan = checkpoint_all_;
  if (plan.mode == CheckpointPlan::Mode::kPaths) {
    plan.paths.resize(static_cast<std::size_t>(n));
  } else {
    plan.mode = CheckpointPlan::Mode::kFirstN;
    plan.first_n = n;
  }
  return plan;
}

// Note [Pairs]
// The usual recipe for a model too large for its GPU combines strategies:
// bf16 with 8-bit AdamW, or with optimizer offload, and checkpointing on
// top (8-bit AdamW and offload do not combine: offload moves the job's
// full-precision optimizer). Together they fit where each alone does not,
// so the walk predicts those pairs too, from the effects measured one at
// a time on the base: predict() adds their shifts and multiplies their
// slope and time ratios, as it does for a strategy with checkpointing.
// They cost no probe. Where the effects overlap the sum over-predicts:
// offload measured on fp32 moves the state but not the fp32 masters that
// bf16 parameters add, which offload moves to the host too. Measured
// (bf16 autocast, 2-core CPU): the two pairs of the small test GPT at
// 8 x 1 to the byte; the example GPT at 34 MiB, 8-bit AdamW + bf16 8 x 4
// at 30.04 MiB predicted and measured. bf16 does not multiply into
// checkpointing's slope: it shrinks what checkpointing keeps less than the
// activations it was measured on, so the lines probe that pair and use its
// own effect (memory_model.cpp, Note [bf16 with checkpointing]); with it
// the four pairs with checkpointing on top meet their runs to the byte
// too. Every candidate is verified by a real run before it is chosen.
void Search::walk_tree() {
  const int64_t g = job_.global_batch;
  const int64_t below_g = g - 1;
  const bool ckpt = models_.effect(Strategy::kCheckpointing).available;
  const StrategyContext strategies = context();
  TrainingConfig all = base_;
  all.checkpoint = checkpoint_all_;

  add_node("plain", base_, g, /*exact=*/true);
  if (ckpt) {
    const double budget = static_cast<double>(result_.usable_budget_bytes);
    for (int64_t n = 1; n < models_.checkpoint_blocks; ++n) {
      TrainingConfig first = base_;
      first.checkpoint = first_blocks(n);
      if (predict(models_, with_micro_batch(first, g, g), g).peak_bytes <= budget) {
        add_node(fmt::format("checkpointing (first {} of {} blocks)", n, models_.checkpoint_blocks), first, g,
                 /*exact=*/true);
        break;
      }
    }
    add_node("checkpointing (" + checkpoint_label_ + ")", all, g, /*exact=*/true);
  }
  add_node("micro-batch + accumulation", base_, below_g);
  if (ckpt) add_node("micro-batch + accumulation + checkpointing", all, below_g);
  // Each strategy, each optimizer strategy with bf16 (Note [Pairs]), and
  // each of those with checkpointing.
  const auto available = [&](StrategySet set) {
    for (const StrategyRow& row : strategy_table())
      if (set.test(static_cast<std::size_t>(row.id)) && !models_.effect(row.id).available) return false;
    return true;
  };
  const auto add_nodes = [&](StrategySet set) {
    if (!available(set)) return;
    const std::string name = strategies_label(set, strategies);
    add_node(name, with_strategies(base_, set, strategies), g);
    if (ckpt) add_node(name + " + checkpointing", with_strategies(all, set, strategies), g);
  };
  for (const StrategyRow& row : strategy_table())
    if (row.id != Strategy::kCheckpointing) add_nodes(just(row.id));
  for (const StrategyRow& row : strategy_table())
    if (row.optimizer_state) add_nodes(just(row.id) | just(Strategy::kBf16));
  for (const RescueAlternative& alternative : rescue_alternatives_) {
    const StepModels own = rescue_alternative_models(alternative);
    add_node(alternative.name, alternative.config, g, /*exact=*/false, &own);
  }

  // The least memory any combination needs, for the "nothing fits"
  // report: every block checkpointed, bf16, and whichever optimizer row
  // (or none) is predicted to hold the least.
  const std::vector<int64_t> valid = valid_micro_batches(job_);
  if (valid.empty()) return;
  StrategySet least;
  for (Strategy s : {Strategy::kCheckpointing, Strategy::kBf16})
    if (available(just(s))) least |= just(s);
  std::vector<StrategySet> least_sets = {least};
  for (const StrategyRow& row : strategy_table())
    if (row.optimizer_state && available(just(row.id))) least_sets.push_back(least | just(row.id));
  const auto least_config = [&](StrategySet set) {
    return with_micro_batch(with_strategies(base_, set, strategies), valid.front(), g);
  };
  double smallest = -1;
  for (StrategySet set : least_sets) {
    const double peak = predict(models_, least_config(set), g).peak_bytes;
    if (smallest < 0 || peak < smallest) smallest = peak;
  }
  result_.smallest_micro_batch = valid.front();
  result_.largest_micro_batch = valid.back();
  result_.smallest_predicted_peak_bytes = smallest;
  // Memory from meta and nothing predicted to fit: the same combinations
  // measured there (most already are, as nodes) replace the lines' guess
  // (LLaMA-7B at 24 GB: offload + bf16 parameters + checkpointing measured
  // 25.67 GiB where the lines predicted 75.32 GiB).
  if (!meta_ ||
      std::any_of(result_.trail.begin(), result_.trail.end(), [](const TrailNode& n) { return n.predicted_fit; }))
    return;
  for (StrategySet set : least_sets) {
    const TrainingConfig c = least_config(set);
    const std::optional<double> peak = meta_peak(c);
    if (!peak || (result_.smallest_meta_peak_bytes && *peak >= *result_.smallest_meta_peak_bytes)) continue;
    result_.smallest_meta_peak_bytes = *peak;
    result_.smallest_meta_configuration = set.any() ? strategies_label(set, strategies) : std::string("plain");
    result_.smallest_meta_configuration += fmt::format(", micro-batch {} x {}", c.micro_batch, c.accumulation_steps);
  }
}

// Note [Verifications that run out of memory]
// Rationale: a verification runs many steps in a fresh process, and a
//   configuration predicted to fit can still run out of memory there (a
//   ResNet-50 batch that passed two steps under 16 GiB ran out at step 5
//   of a fresh run, every time; one sample less ran 100 steps:
//   DESIGN.md). Such a node used to be dropped and no other size of it
//   tried: where every candidate ran out, autotune answered "nothing
//   fits" with a least-memory prediction far below the budget, and where
//   a slower strategy fitted, it won over the same node one size down.
// Approach: a verification over the budget (out of device memory, or
//   finished above it) rules its configuration out at its micro-batch and
//   above, as a probe out of memory does (rule_out_from). After the
//   verifications, the tree is walked again: each such node is placed at
//   the largest valid micro-batch below, and the configurations that were
//   no candidate before and are predicted faster than every run that
//   fitted are verified, up to max_verifications more runs in all
//   (verification_cap_). The choice is among every run that fitted, in any
//   walk.
// Limitations: one size down per walk, with the same memory model (the
//   run says the model is low, not by how much): a job that outgrows its
//   prediction by several sizes spends the extra runs and ends without a
//   choice, saying so (report: ran out in verification).
//
// walk_again: the tree again, after a verification lowered max_micro_batch
// (Note [An error that comes with the size], fit.cpp) or ran out of memory
// (above). The nodes whose run failed stay in the trail, with their runs;
// the new walk's nodes follow, but for those with a failed node's
// configuration; a node whose configuration ran already carries that run.
// The notes of the walk before are not repeated.
void Search::walk_again(const std::string& why) {
  const std::size_t kept_notes = result_.notes.size();
  std::vector<TrailNode> failed;
  std::set<std::string> failed_configs;
  for (TrailNode& node : result_.trail)
    if (node.verification && !fits_budget(*node.verification)) {
      failed_configs.insert(to_string(node.config));
      failed.push_back(std::move(node));
    }
  result_.trail = std::move(failed);
  const std::size_t first_new = result_.trail.size();
  result_.chosen.reset();
  if (!verification_cap_) verification_cap_ = result_.verification_trials + options_.max_verifications;
  progress_(fmt::format("walk   again {}", why));
  walk_tree();
  note_meta_failures();
  result_.trail.erase(
      std::remove_if(result_.trail.begin() + static_cast<std::ptrdiff_t>(first_new), result_.trail.end(),
                     [&](const TrailNode& node) { return failed_configs.count(to_string(node.config)); }),
      result_.trail.end());
  for (std::size_t i = first_new; i < result_.trail.size(); ++i)
    if (const auto ran = verified_.find(to_string(result_.trail[i].config)); ran != verified_.end())
      result_.trail[i].verification = ran->second;
  const auto repeated = [&](const std::string& note) {
    return std::find(result_.notes.begin(), result_.notes.begin() + static_cast<std::ptrdiff_t>(kept_notes), note) !=
           result_.notes.begin() + static_cast<std::ptrdiff_t>(kept_notes);
  };
  result_.notes.erase(
      std::remove_if(result_.notes.begin() + static_cast<std::ptrdiff_t>(kept_notes), result_.notes.end(), repeated),
      result_.notes.end());
}

// Note [Divisors only]
// With remainder = "error" (the default) a micro-batch must divide the
// global batch, so a global batch with few divisors leaves the walk few
// sizes: 31 allows 1 and 31, and a node that fits at 7 runs at 1, with 31
// micro-batches where 5 would do. The search keeps to the job's rule, but
// says what the rule costs when it costs speed: the node predicted fastest
// at the largest size its lines fit, when that needs fewer micro-batches
// than the node's own configuration and is no divisor, and is predicted
// faster than the chosen one (beyond the timing tie). The way out the note
// gives first is a global batch that size divides: every framework takes
// equal micro-batches, and `oomtune emit` refuses a plan with a smaller
// last one (docs/recipes.md), which remainder = "last_smaller" would give.
void Search::note_remainder() {
  if (job_.allow_remainder || !result_.chosen) return;
  const TrailNode& chosen = result_.trail[*result_.chosen];
  const int64_t g = job_.global_batch;
  const int64_t top = largest_micro_batch(job_);
  const auto budget = static_cast<double>(result_.usable_budget_bytes);
  struct Candidate {
    double seconds;
    const TrailNode* node;
    TrainingConfig config;
  };
  std::vector<Candidate> faster;  // than the chosen one, beyond the tie
  for (const TrailNode& node : result_.trail) {
    const bool rescue_alternative =
        std::any_of(rescue_alternatives_.begin(), rescue_alternatives_.end(),
                    [&](const RescueAlternative& a) { return a.name == node.node; });  // not models_' lines
    if (rescue_alternative || node.config.micro_batch >= top) continue;
    const auto fits = [&](int64_t b) {
      return b < smallest_out_of_memory(node.config) &&
             predict(models_, with_micro_batch(node.config, b, g), g).peak_bytes <= budget;
    };
    // Bisection for the largest size that fits: the peak grows with the
    // micro-batch. The node's own size fits when the node does.
    int64_t low = std::max(job_.min_micro_batch, node.config.micro_batch), high = top + 1;
    if (!fits(low)) continue;
    while (high - low > 1) {
      const int64_t mid = low + (high - low) / 2;
      (fits(mid) ? low : high) = mid;
    }
    const int64_t steps = micro_batch_count(g, low);
    const int64_t balanced = (g + steps - 1) / steps;  // the smallest size with that many micro-batches
    if (steps >= node.config.accumulation_steps || g % balanced == 0) continue;
    const TrainingConfig config = with_micro_batch(node.config, balanced, g);
    const double seconds = predict(models_, config, g).seconds_per_global_batch;
    if (seconds < kTimingTieRatio * chosen.predicted_seconds) faster.push_back({seconds, &node, config});
  }
  std::stable_sort(faster.begin(), faster.end(),
                   [](const Candidate& a, const Candidate& b) { return a.seconds < b.seconds; });
  // Where the nodes' memory came from meta, the lines' answer must fit there too.
  const auto on_meta_too = [&](const Candidate& c) {
    const std::optional<double> peak = meta_peak(c.config);
    return !peak || *peak <= budget;
  };
  const auto found = std::find_if(faster.begin(), faster.end(), on_meta_too);
  if (found == faster.end()) return;
  const TrailNode* best = found->node;
  const TrainingConfig& best_config = found->config;
  const double best_seconds = found->seconds;
  const std::vector<int64_t> valid = valid_micro_batches(job_);
  const int64_t m = best_config.micro_batch;
  const int64_t last = g - (best_config.accumulation_steps - 1) * m;
  const auto samples_per_second = [&](double seconds) { return static_cast<double>(g) / seconds; };
  result_.notes.push_back(fmt::format(
      "remainder: a micro-batch must divide the global batch {}, which leaves micro-batches {}; {} is predicted to fit "
      "at "
      "micro-batch {}, at {:.1f} samples/s against the chosen configuration's predicted {:.1f}. A global batch "
      "that {} divides ({}) lets the search try it with equal micro-batches, as every framework takes them; "
      "remainder = \"last_smaller\" runs {} as {} x {} + {}, which oomtune emit cannot write",
      g,
      valid.size() <= 8 ? fmt::format("{}", fmt::join(valid, ", "))
                        : fmt::format("{}, ..., {}", fmt::join(valid.begin(), valid.begin() + 4, ", "), valid.back()),
      best->node, m, samples_per_second(best_seconds), samples_per_second(chosen.predicted_seconds), m,
      divisible_global_batches(g, m), g, m, best_config.accumulation_steps - 1, last));
}

}  // namespace oomtune::search_detail
