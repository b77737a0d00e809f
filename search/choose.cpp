// Verification and the choice: the fastest verified candidate, ties to
// the simplest (search.h, Rules: Ties); and the search's entry points.

#include "search/search_state.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"
#include "common/error.h"
#include "common/seconds_text.h"
#include "search/model_fit.h"
#include "search/sentences.h"
#include "strategies/job_config.h"

namespace oomtune::search_detail {

std::size_t strategy_count(const TrainingConfig& c, const TrainingConfig& job_base) {
  return (c.accumulation_steps > 1 ? 1 : 0) + strategies_used(c, job_base).count();
}

Search::Search(const JobSpec& job, TrialRunner& runner, const SearchOptions& options,
               const std::function<void(const std::string&)>& progress)
    : job_(job), runner_(runner), options_(options), progress_(progress) {
  base_.micro_batch = job.global_batch;
  base_.optimizer = parse_optimizer(job.optimizer.kind);
  base_.precision = parse_precision(job.precision);
  job_base_ = base_;
}

SearchResult Search::run() {
  if (!job_.usable_budget_bytes())
    throw InputError(fmt::format("{}: autotune needs a memory budget (budget = \"8GiB\" or --budget)",
                                 job_.spec_path.empty() ? "job" : job_.spec_path));
  result_.usable_budget_bytes = *job_.usable_budget_bytes();
  result_.budget_on_reserved = budget_on_reserved(job_);
  require_a_valid_micro_batch("");
  start_meta();
  if (fit_models()) {
    walk_tree();
    note_meta_failures();
    if (options_.memory_only) {
      choose_by_memory();
    } else {
      // Note [An error that comes with the size] (fit.cpp)
      // and Note [Verifications that run out of memory] (walk.cpp)
      while (const std::optional<std::string> why = verify_candidates()) walk_again(*why);
      note_remainder();
    }
  }
  return std::move(result_);
}

// A verification run that finished within the usable budget: its reserved
// bytes on a GPU (budgeted_peak_bytes), its tensors' elsewhere.
bool Search::fits_budget(const ProbeReport& r) const {
  return r.outcome == TrialOutcome::kOk && budgeted(r) <= result_.usable_budget_bytes;
}

int64_t Search::budgeted(const ProbeReport& r) const { return budgeted_peak_bytes(r, result_.budget_on_reserved); }

// Rules: The optimizer step alone (search.h). The reference is the first
// run in `simplest_first` that differs from node i only in the optimizer's
// kind, the job's; speeds are samples/s, settled for the runs before i.
void Search::count_optimizer_step_alone(std::size_t i, const std::vector<std::size_t>& simplest_first,
                                        std::map<std::size_t, double>& speed) {
  const TrailNode& node = result_.trail[i];
  if (node.config.optimizer == job_base_.optimizer) return;
  for (std::size_t j : simplest_first) {
    const TrailNode& other = result_.trail[j];
    TrainingConfig with_job_optimizer = node.config;
    with_job_optimizer.optimizer = job_base_.optimizer;
    if (j == i || with_job_optimizer != other.config) continue;
    const ProbeReport& run = *node.verification;
    const ProbeReport& reference = *other.verification;
    const double step = run.timing.steady_optimizer_seconds, reference_step = reference.timing.steady_optimizer_seconds;
    // Unless a step was not timed (a meta run, a report without it), or the
    // caching allocator freed its cache and retried in either run: a run at
    // its cap stalls in forward and backward too, which a strategy that
    // saves memory can spare it.
    auto retried = [](const ProbeReport& r) {
      return r.measured_reserved && r.measured_reserved->num_alloc_retries > 0;
    };
    if (step <= 0 || reference_step <= 0 || retried(run) || retried(reference)) return;
    const double samples = run.samples_per_second * run.timing.steady_step_seconds;
    const double rest = samples / speed[j] - reference_step;  // seconds outside the optimizer step
    if (rest <= 0) return;
    const double counted = samples / (rest + step);
    if (std::abs(counted - speed[i]) < 0.005 * speed[i]) return;  // a note only where it moves the speed
    result_.notes.push_back(fmt::format(
        "{}: verified at {:.1f} samples/s; it changes only the optimizer step, timed apart at {} s against {} "
        "s for {} ({:.1f} samples/s), so it counts at {:.1f} (the rest of the step is the same work: its "
        "difference is timing noise)",
        node.node, speed[i], format_seconds(step), format_seconds(reference_step), other.node, speed[j], counted));
    speed[i] = counted;
    return;
  }
}

// Runs the verification of `config`, counted and shown.
ProbeReport Search::verify(const TrainingConfig& config) {
  ProbeReport r = runner_.verify(config);
  hold_to_host_budget(r, config);
  ++result_.verification_trials;
  if (r.outcome == TrialOutcome::kOk) largest_ran_micro_batch_ = std::max(largest_ran_micro_batch_, config.micro_batch);
  progress_(fmt::format("verify {:<60} {}", describe(config),
                        r.outcome == TrialOutcome::kOk ? fmt::format("peak {}, {:.1f} samples/s over {} steps",
                                                                     budgeted_peak_text(r, result_.budget_on_reserved),
                                                                     r.samples_per_second, r.steps_run)
                                                       : outcome_of(r)));
  return r;
}

std::optional<std::string> Search::verify_candidates() {
  // After a walk again, only configurations that were no candidate before
  // and are predicted faster than every run that fitted (Note
  // [Verifications that run out of memory], walk.cpp); a node whose
  // configuration ran already carries its run (walk_again).
  double fastest_fitting = std::numeric_limits<double>::infinity();  // predicted seconds
  for (const TrailNode& node : result_.trail)
    if (node.verification && fits_budget(*node.verification))
      fastest_fitting = std::min(fastest_fitting, node.predicted_seconds);
  std::vector<std::size_t> order;
  std::set<std::string> seen;
  for (std::size_t i = 0; i < result_.trail.size(); ++i) {
    const TrailNode& node = result_.trail[i];
    const std::string config = to_string(node.config);
    if (node.predicted_fit && !node.verification && !candidates_before_.count(config) &&
        node.predicted_seconds < fastest_fitting && seen.insert(config).second)
      order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return result_.trail[a].predicted_seconds < result_.trail[b].predicted_seconds;
  });
  // The simplest candidate (fewest strategies, then predicted fastest) is
  // always among those verified, in the last slot if the predictions did
  // not rank it higher: it is the reference the strategies must beat, and
  // predicted times from short probes are noisy (example GPT, 256 MiB:
  // plain was predicted 4 % slower than 8-bit AdamW and never run).
  const auto slots = static_cast<std::size_t>(std::max<int64_t>(0, options_.max_verifications));
  if (slots >= 2 && order.size() > slots) {
    const auto simplest = std::min_element(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return strategy_count(result_.trail[a].config, job_base_) < strategy_count(result_.trail[b].config, job_base_);
    });  // the first of the fewest: order is by predicted time
    if (simplest >= order.begin() + static_cast<std::ptrdiff_t>(slots))
      std::rotate(order.begin() + static_cast<std::ptrdiff_t>(slots - 1), simplest, simplest + 1);
  }
  // Plain's verification that ran while probing (Note [Plain's
  // verification times it], meta_memory.cpp) takes the first slot: it is
  // the simplest candidate, in the slots as ranked too. (After a walk
  // again, a node whose configuration ran carries its run and is no
  // candidate here.)
  std::stable_partition(order.begin(), order.end(),
                        [&](std::size_t i) { return verified_.count(to_string(result_.trail[i].config)) > 0; });
  int64_t succeeded = 0, failed = 0;
  bool ran_out = false;  // a run over the budget: Note [Verifications that run out of memory]
  for (std::size_t i : order) {
    if (succeeded >= options_.max_verifications) break;
    if (failed >= options_.max_extra_verifications && succeeded > 0) break;
    if (succeeded + failed >= options_.max_verifications + options_.max_extra_verifications) break;
    TrailNode& node = result_.trail[i];
    auto ran = verified_.find(to_string(node.config));
    if (ran == verified_.end()) {
      if (verification_cap_ && result_.verification_trials >= *verification_cap_) break;
      ran = verified_.emplace(to_string(node.config), verify(node.config)).first;
    }
    const ProbeReport& r = ran->second;
    node.verification = r;
    if (fits_budget(r)) {
      ++succeeded;
    } else {
      ++failed;
      // A run over the budget rules its configuration out from its
      // micro-batch up (rule_out_from, below); any other failure drops it.
      const std::string low =
          fmt::format("the memory model was low: ruled out from micro-batch {} up", node.config.micro_batch);
      node.note =
          r.outcome == TrialOutcome::kOk
              ? fmt::format("verified peak {} is over the budget: {}",
                            budgeted_peak_text(r, result_.budget_on_reserved), low)
              : fmt::format("verified run: {} after {} steps ({}); {}", to_string(r.outcome), r.steps_run, r.message,
                            r.outcome == TrialOutcome::kOutOfMemory && !over_host_budget(r) ? low : "dropped");
      const std::string note = fmt::format("{}: {}", node.node, node.note);
      if (std::find(result_.notes.begin(), result_.notes.end(), note) == result_.notes.end())
        result_.notes.push_back(note);  // a node one size down can fail in the same words
      if (fails_for_its_size(r, node.config.micro_batch)) {
        lower_max_micro_batch(node.config.micro_batch, r, largest_ran_micro_batch_);
        return fmt::format("with micro-batches of {} or less", largest_micro_batch(job_));
      }
      if (r.outcome == TrialOutcome::kOk || (r.outcome == TrialOutcome::kOutOfMemory && !over_host_budget(r))) {
        rule_out_from(node.config, node.config.micro_batch);  // Note [Verifications that run out of memory]
        ran_out = true;
      }
    }
  }
  if (ran_out && (!verification_cap_ || result_.verification_trials < *verification_cap_)) {
    for (const TrailNode& node : result_.trail)
      if (node.predicted_fit) candidates_before_.insert(to_string(node.config));
    return std::string("below the micro-batches whose verification ran out of memory");
  }
  // The fastest verified configuration wins; within kTimingTieRatio of
  // it, the simplest (Rules: Ties).
  std::vector<std::size_t> fitting;
  for (std::size_t i = 0; i < result_.trail.size(); ++i) {
    const TrailNode& node = result_.trail[i];
    if (node.verification && fits_budget(*node.verification)) fitting.push_back(i);
  }
  // Rules: Work added (search.h): a verified run that differs from another
  // verified one only by strategies that add work cannot be faster than it,
  // and measured faster it measured noise (ResNet-50, 2-core CPU under load:
  // its first block checkpointed ran 4.7 samples/s, plain 4.1, and was
  // chosen; the example GPT-2 fixture on the CPU: offload 665 samples/s,
  // plain 589). It counts at the other's speed. The simpler runs settle
  // first, so a run compares with speeds already settled.
  std::map<std::size_t, double> speed;
  for (std::size_t i : fitting) speed[i] = result_.trail[i].verification->samples_per_second;
  std::vector<std::size_t> simplest_first = fitting;
  std::stable_sort(simplest_first.begin(), simplest_first.end(), [&](std::size_t a, std::size_t b) {
    return strategy_count(result_.trail[a].config, job_base_) < strategy_count(result_.trail[b].config, job_base_);
  });
  for (std::size_t i : simplest_first) {
    const TrainingConfig& config = result_.trail[i].config;
    count_optimizer_step_alone(i, simplest_first, speed);
    for (std::size_t j : simplest_first) {
      const TrainingConfig& other = result_.trail[j].config;
      TrainingConfig without = config;
      std::vector<std::string> removed, work;
      for (const StrategyRow& row : strategy_table()) {
        if (row.turn_off == nullptr || !row.used(config, job_base_) || row.used(other, job_base_)) continue;
        row.turn_off(without);
        removed.push_back(row.probe_name);
        work.push_back(row.only_adds_work);
      }
      if (removed.empty() || without != other || speed[j] >= speed[i]) continue;
      result_.notes.push_back(fmt::format(
          "{}: verified at {:.1f} samples/s, faster than the same configuration without {} ({:.1f}); {} cannot "
          "make a step faster, so it counts at {:.1f} (timing noise)",
          result_.trail[i].node, speed[i], fmt::join(removed, " and "), speed[j], fmt::join(work, " and "), speed[j]));
      speed[i] = speed[j];
    }
  }
  // The fastest verified run of those `eligible` keeps, and within
  // kTimingTieRatio of it the simplest, then the one with most margin.
  auto simpler = [&](std::size_t a, std::size_t b) {
    const std::size_t sa = strategy_count(result_.trail[a].config, job_base_),
                      sb = strategy_count(result_.trail[b].config, job_base_);
    if (sa != sb) return sa < sb;
    return budgeted(*result_.trail[a].verification) < budgeted(*result_.trail[b].verification);
  };
  auto choose_among = [&](auto eligible) -> std::optional<std::size_t> {
    double fastest = 0;
    for (std::size_t i : fitting)
      if (eligible(i)) fastest = std::max(fastest, speed[i]);
    std::optional<std::size_t> chosen;
    for (std::size_t i : fitting) {
      if (!eligible(i) || speed[i] < kTimingTieRatio * fastest) continue;
      if (!chosen || simpler(i, *chosen)) chosen = i;
    }
    return chosen;
  };
  double fastest = 0;
  for (const auto& [i, sps] : speed) fastest = std::max(fastest, sps);
  result_.chosen = choose_among([](std::size_t) { return true; });
  if (!result_.chosen) {
    // Nothing verified to fit: the candidates no run reached say so (the
    // report counts them, not_run_text).
    for (TrailNode& node : result_.trail)
      if (node.note.empty() && node.predicted_fit && !node.verification)
        node.note = "predicted to fit; not verified (verification budget spent)";
    return std::nullopt;
  }
  const TrailNode& best = result_.trail[*result_.chosen];
  // "115.0 samples/s", and where a rule above counts the run otherwise
  // "115.0 samples/s, counted at 104.5", so a row never reads slower than
  // a faster-measured one without saying why.
  auto measured_speed = [&](std::size_t i) {
    const double sps = result_.trail[i].verification->samples_per_second;
    const auto counted = speed.find(i);
    return counted == speed.end() || std::abs(counted->second - sps) < 0.05
               ? fmt::format("{:.1f} samples/s", sps)
               : fmt::format("{:.1f} samples/s, counted at {:.1f}", sps, counted->second);
  };
  for (std::size_t i = 0; i < result_.trail.size(); ++i) {
    TrailNode& node = result_.trail[i];
    if (i == *result_.chosen) {
      node.note =
          fmt::format("chosen: {}, {}, {} below the budget",
                      speed[i] >= fastest ? "fastest verified"
                                          : fmt::format("simplest within {:.0f} % of the fastest verified "
                                                        "({:.1f} samples/s)",
                                                        100 * (1 - kTimingTieRatio), fastest),
                      measured_speed(i), format_bytes(result_.usable_budget_bytes - budgeted(*node.verification)));
    } else if (node.note.empty() && node.verification && speed.count(i) && speed[i] >= kTimingTieRatio * fastest) {
      node.note = fmt::format(
          "verified, {}: as fast within {:.0f} % (a tie), but more strategies or "
          "less margin than the chosen one",
          measured_speed(i), 100 * (1 - kTimingTieRatio));
    } else if (node.note.empty() && node.verification) {
      node.note = fmt::format("verified, but slower: {}", measured_speed(i));
    } else if (node.note.empty() && node.predicted_fit) {
      // A prediction within the tie ratio is not "slower": checkpointing
      // clamped to 1x printed "predicted slower (3.06 s vs 3.06 s ...)".
      // A node that might have won also says what the chosen one measured
      // (example GPT at 2 GiB: slow first plain probes predicted 8-bit
      // AdamW at 2.03 s against plain's 3.06 s; both ran at 9.4 samples/s).
      const std::string times = fmt::format("{} s vs {} s per global batch", format_seconds(node.predicted_seconds),
                                            format_seconds(best.predicted_seconds));
      auto unverified = [&](const std::string& verdict) {
        return fmt::format("{} ({}; the chosen one measured {} s); not verified (verification budget spent)", verdict,
                           times, format_seconds(best.verification->timing.steady_step_seconds));
      };
      if (node.predicted_seconds < best.predicted_seconds)
        node.note = unverified("predicted faster");
      else if (kTimingTieRatio * node.predicted_seconds <= best.predicted_seconds)
        node.note = unverified(fmt::format("predicted as fast within {:.0f} %", 100 * (1 - kTimingTieRatio)));
      else
        node.note = fmt::format("predicted slower ({})", times);
    }
  }
  // The one the same rules choose among those that keep the job's optimizer.
  const std::optional<std::size_t> keeps_optimizer =
      choose_among([&](std::size_t i) { return result_.trail[i].config.optimizer == job_base_.optimizer; });
  const TrailNode* exact = keeps_optimizer ? &result_.trail[*keeps_optimizer] : nullptr;
  const std::string optimizer = to_string(job_base_.optimizer);
  note_optimizer_change(exact ? fmt::format("the fastest verified configuration with {} is {} ({}, {:.1f} samples/s)",
                                            optimizer, exact->node, describe(exact->config),
                                            exact->verification->samples_per_second)
                              : fmt::format("no verified configuration with {} fits", optimizer));
  return std::nullopt;
}

// 8-bit AdamW wins on speed (or, by memory alone, on simplicity) as any
// strategy does, but unlike the others it changes what training computes
// (blockwise-quantized states): say so, with `alternative`, the clause that
// names the best configuration that keeps the job's optimizer.
void Search::note_optimizer_change(const std::string& alternative) {
  const TrailNode& best = result_.trail[*result_.chosen];
  if (best.config.optimizer == job_base_.optimizer) return;
  std::string how = "other updates";
  for (const StrategyRow& row : strategy_table())
    if (row.changes_updates && row.used(best.config, job_base_))
      how = fmt::format(fmt::runtime(row.changes_updates), to_string(job_base_.optimizer));
  result_.notes.push_back(fmt::format("the chosen configuration trains with {} instead of the job's {} ({}); {}",
                                      to_string(best.config.optimizer), to_string(job_base_.optimizer), how,
                                      alternative));
}

}  // namespace oomtune::search_detail

namespace oomtune {

std::vector<int64_t> valid_micro_batches(const JobSpec& job) {
  std::vector<int64_t> sizes;
  const int64_t top = largest_micro_batch(job);
  for (int64_t b = job.min_micro_batch; b <= top; ++b)
    if (job.allow_remainder || job.global_batch % b == 0) sizes.push_back(b);
  return sizes;
}

std::vector<const TrailNode*> unverified_candidates(const SearchResult& result) {
  std::vector<const TrailNode*> nodes;
  for (const TrailNode& node : result.trail)
    if (node.verification && node.verification->outcome != TrialOutcome::kOk &&
        node.verification->outcome != TrialOutcome::kOutOfMemory)
      nodes.push_back(&node);
  return nodes;
}

std::vector<const TrailNode*> ran_out_candidates(const SearchResult& result) {
  std::vector<const TrailNode*> nodes;
  for (const TrailNode& node : result.trail)
    if (node.predicted_fit && node.verification &&
        (node.verification->outcome == TrialOutcome::kOutOfMemory ||
         (node.verification->outcome == TrialOutcome::kOk &&
          budgeted_peak_bytes(*node.verification, result.budget_on_reserved) > result.usable_budget_bytes)))
      nodes.push_back(&node);
  return nodes;
}

std::size_t candidates_not_run(const SearchResult& result) {
  // Nodes can share a configuration (the search verifies each once).
  std::set<std::string> verified, not_run;
  for (const TrailNode& n : result.trail)
    if (n.verification) verified.insert(to_string(n.config));
  for (const TrailNode& n : result.trail)
    if (n.predicted_fit && !verified.count(to_string(n.config))) not_run.insert(to_string(n.config));
  return not_run.size();
}

SearchResult search(const JobSpec& job, TrialRunner& runner, const SearchOptions& options,
                    const std::function<void(const std::string&)>& progress) {
  return search_detail::Search(job, runner, options, progress).run();
}

}  // namespace oomtune
