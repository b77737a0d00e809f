// The rescue: when plain runs at no micro-batch, the strategies that make
// it run (search.h, Rules: Rescue; Note [Rescue] below).

#include "search/search_state.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/error.h"
#include "search/model_fit.h"
#include "search/sentences.h"
#include "strategies/job_config.h"

namespace oomtune::search_detail {

// Note [Rescue]
// Plain out of memory at every micro-batch down to the smallest is the
// case a user most needs answered (AdamW keeps 16 bytes per parameter:
// weights, gradients and two moments of a 7B model do not fit an 80 GB
// GPU). The strategies are then tried at that micro-batch. First the
// combination that needs the least memory (checkpointing every block,
// optimizer offload, and bf16 when allowed): when even it runs out, nothing
// fits one device, measured (the probes' guard is at least the budget).
// Otherwise the simplest combination that runs (fewest strategies, then
// the tree's order) becomes the base in place of plain: its lines come from
// its own probes, the other strategies' effects are measured on top of it,
// and every node carries it. The other combinations of as many strategies
// are probed there too (but the one the walk predicts: offload in place of
// a rescued 8-bit AdamW): each that runs is probed at twice that
// micro-batch as well and becomes a node of its own, fitted to its probes
// (rescue_alternative_models), since a faster one may hide there
// (checkpointing rescues, 8-bit AdamW alone also runs and does not
// recompute). When the base recomputes (checkpointing) or moves state
// to the host (offload), 8-bit AdamW + bf16, the one combination that
// does neither, is such an alternative too, probed the same way. Other
// larger combinations without the base are not predicted: plain gives no
// line to predict them from, and the effects measured on the base did
// not transfer (real gpt_small, checkpointing rescued: 8-bit AdamW's
// lines plus bf16's effect on the base put 8-bit AdamW + bf16 at 6.02 MiB
// at 8 x 1; it measured 4.49).

bool Search::needs_rescue(const ProbeReport& failure) const {
  // Parameters over the budget ended the search before (Note [Parameters alone]).
  return failure.outcome == TrialOutcome::kOutOfMemory && !ran_out_loading(failure);
}

// The job's configuration with `strategies` on: checkpointing every
// block (the rescue comes before checkpointing's own probe).
TrainingConfig Search::rescue_config(StrategySet strategies) const {
  StrategyContext every_block = context();
  every_block.checkpoint_all = checkpoint_every_block();
  return with_strategies(job_base_, strategies, every_block);
}

// A rescue alternative's models (Note [Rescue]): memory lines through its
// probes (through one, the slope of its retained activations, a lower
// bound); the micro-batches' time the base's line scaled by the
// alternative's mean measured ratio to it, as a strategy's time ratio
// scales it (so the base and the alternative rank alike at other
// micro-batches), and its optimizer step as measured (memory_model.cpp,
// Note [Step time]).
// Called after fit_models. No strategy effects: its configuration holds
// its strategies.
StepModels Search::rescue_alternative_models(const RescueAlternative& alternative) const {
  StepModels m;
  std::vector<int64_t> sizes;
  std::vector<std::array<double, kNumPhases>> peaks;
  std::vector<const ProbeReport*> ran;
  std::vector<double> seconds, ratios, optimizer_seconds;
  for (const ProbeReport& r : alternative.probes) {
    sizes.push_back(r.micro_batch);
    peaks.push_back(phase_peaks_of(r, job_));
    ran.push_back(&r);
    seconds.push_back(forward_backward_seconds(r));
    optimizer_seconds.push_back(r.timing.steady_optimizer_seconds);
    const double base_seconds = models_.seconds(static_cast<double>(r.micro_batch));
    if (base_seconds > 0) ratios.push_back(seconds.back() / base_seconds);
  }
  m.optimizer_seconds = mean_of(optimizer_seconds);
  const PhaseLines slopes = retained_slopes(alternative.probes.front());
  m.phases = fit_phase_lines(sizes, peaks, &slopes);
  fit_backward_activation(m, ran, job_, slopes[kBackwardIndex].slope, slopes[kBackwardIndex].slope);
  if (ratios.size() == sizes.size()) {
    const double ratio = mean_of(ratios);
    m.seconds = {models_.seconds.intercept * ratio, models_.seconds.slope * ratio};
  } else {
    m.seconds = fit_time_line(sizes, seconds);
  }
  m.gradient_bytes = alternative.probes.front().static_memory.gradient_bytes;
  m.base_precision = alternative.config.precision;
  return m;
}

// Records the combination `strategies` that `at_smallest` probed at
// micro-batch `smallest` without the rescued base (Note [Rescue]): when it
// ran, probed at twice that micro-batch too (a measured slope) and kept
// for its node.
void Search::add_rescue_alternative(StrategySet strategies, const ProbeReport& at_smallest, int64_t smallest) {
  const std::string base = rescue_label(rescue_strategies_);
  if (at_smallest.outcome != TrialOutcome::kOk) {
    result_.notes.push_back(fmt::format("{} (without {}): not available (micro-batch {}: {})", rescue_label(strategies),
                                        base, smallest, outcome_of(at_smallest)));
    return;
  }
  RescueAlternative alternative{rescue_label(strategies), rescue_config(strategies), {at_smallest}};
  std::string second;
  if (2 * smallest <= largest_micro_batch(job_)) {
    ProbeReport r = probe(alternative.config, 2 * smallest);
    if (r.outcome == TrialOutcome::kOk)
      alternative.probes.push_back(std::move(r));
    else
      second = fmt::format("; micro-batch {}: {}", 2 * smallest, outcome_of(r));
  }
  const bool one = alternative.probes.size() == 1;
  result_.notes.push_back(fmt::format(
      "{} also runs at micro-batch {} (without {}{}): its node is fitted to {}, its time line is the base's times "
      "its measured ratio to it",
      alternative.name, one ? fmt::format("{}", smallest) : fmt::format("{} and {}", smallest, 2 * smallest), base,
      second,
      one ? "that one probe, its memory lines with the slope of its retained activations (a lower bound)"
          : "those probes"));
  rescue_alternatives_.push_back(std::move(alternative));
}

// Whether a rescue whose base is `strategies` probes 8-bit AdamW + bf16
// as an alternative beyond those of as many strategies (Note [Rescue]):
// when the base is checkpointing or offload alone, and the job allows
// both (its AdamW, allow_bf16 on fp32).
bool Search::probes_pair(StrategySet strategies) const {
  return (strategies == just(Strategy::kCheckpointing) || strategies == just(Strategy::kOffload)) &&
         job_base_.optimizer == OptimizerKind::kAdamW && job_.allow_bf16 && job_base_.precision == Precision::kFp32;
}

// The plain probes of base_ after rescuing it, or nullopt when nothing
// fits (Note [Rescue]). Throws InputError when no combination runs and
// the least-memory one failed for a reason other than memory.
std::optional<Search::PlainProbes> Search::rescue(const std::vector<int64_t>& sizes, const PlainProbes& plain) {
  const int64_t smallest = plain.failed.begin()->first;
  const ProbeReport& plain_failure = plain.first_failure();
  const StrategySet eight_bit_bf16 = just(Strategy::kAdamW8bit) | just(Strategy::kBf16);
  // The rows that may rescue and that the job allows on its own base.
  StrategySet possible;
  for (const StrategyRow& row : strategy_table())
    if (row.rescue && row.allowed(job_, base_)) possible.set(static_cast<std::size_t>(row.id));
  // Note [Host budget] (host_budget.cpp): offload's state over the host budget.
  if (possible.test(static_cast<std::size_t>(Strategy::kOffload)) && !offload_fits_host(plain_failure.parameter_count))
    possible.reset(static_cast<std::size_t>(Strategy::kOffload));
  const bool bf16 = possible.test(static_cast<std::size_t>(Strategy::kBf16));
  std::vector<StrategySet> order;  // fewest strategies first, then the tree's order
  for (std::size_t count = 1; count <= possible.count(); ++count)
    for (unsigned long bits = 1; bits < (1UL << kNumStrategies); ++bits) {
      const StrategySet s(bits);
      if ((s & ~possible).none() && !conflicting(s) && s.count() == count) order.push_back(s);
    }
  std::map<unsigned long, ProbeReport> tried;
  auto try_strategies = [&](StrategySet s) -> const ProbeReport& {
    if (const auto known = tried.find(s.to_ulong()); known != tried.end()) return known->second;
    ProbeReport r = probe(rescue_config(s), smallest);
    if (s.test(static_cast<std::size_t>(Strategy::kBf16)) && bf16_form_ == Precision::kBf16 && form_failed(r)) {
      result_.notes.push_back(bf16_fallback_note(r));  // Note [bf16 fallback]
      bf16_form_ = Precision::kBf16Params;
      r = probe(rescue_config(s), smallest);
    }
    return tried.emplace(s.to_ulong(), std::move(r)).first->second;
  };
  // Without offload (the host budget), 8-bit AdamW keeps the least state.
  const StrategySet optimizer_least =
      possible.test(static_cast<std::size_t>(Strategy::kOffload))     ? just(Strategy::kOffload)
      : possible.test(static_cast<std::size_t>(Strategy::kAdamW8bit)) ? just(Strategy::kAdamW8bit)
                                                                      : StrategySet();
  const StrategySet least =
      just(Strategy::kCheckpointing) | optimizer_least | (bf16 ? just(Strategy::kBf16) : StrategySet());
  const ProbeReport& least_report = try_strategies(least);
  if (least_report.outcome == TrialOutcome::kOutOfMemory) {
    result_.least_memory_failure = fmt::format(
        "plain and even the configuration that needs the least memory ({}) ran out of memory at micro-batch {} "
        "(measured: {})",
        rescue_label(least), smallest, least_report.message);
    result_.smallest_micro_batch = smallest;
    result_.parameter_count = plain_failure.parameter_count;
    result_.frozen_parameter_count = plain_failure.frozen_parameter_count;
    result_.static_memory = plain_failure.static_memory;
    return std::nullopt;
  }
  for (StrategySet s : order) {
    const ProbeReport& r = try_strategies(s);
    if (r.outcome != TrialOutcome::kOk) continue;
    base_ = rescue_config(s);
    rescue_strategies_ = s;
    result_.notes.push_back(fmt::format(
        "plain ran out of memory at every micro-batch down to {} ({}); {} is the simplest combination that runs "
        "there, so the configurations below build on it, except the other combinations of {}{} (probed there "
        "too); other larger combinations without it are not predicted",
        smallest, plain_failure.message, rescue_label(s), s.count() == 1 ? "one strategy" : "as many strategies",
        probes_pair(s) ? fmt::format(" and {}", rescue_label(eight_bit_bf16)) : ""));
    PlainProbes seeded;
    seeded.ran.emplace(smallest, r);
    PlainProbes probes = probe_plain(sizes, std::move(seeded));
    // The combinations before s in `order` ran out; those after it with as
    // many strategies are the alternatives.
    const StrategySet eight_bit = just(Strategy::kAdamW8bit);
    const StrategySet swapped = (s & eight_bit).any() ? (s & ~eight_bit) | just(Strategy::kOffload) : StrategySet();
    for (auto it = std::find(order.begin(), order.end(), s) + 1; it != order.end(); ++it)
      if (it->count() == s.count() && *it != swapped) add_rescue_alternative(*it, try_strategies(*it), smallest);
    if (probes_pair(s)) add_rescue_alternative(eight_bit_bf16, try_strategies(eight_bit_bf16), smallest);
    return probes;
  }
  throw InputError(fmt::format("{}: no configuration could run at micro-batch {}: plain: {}; {}: {}", job_.model_path,
                               smallest, without_model_path(plain_failure.message), rescue_label(least),
                               outcome_of(least_report)));
}

}  // namespace oomtune::search_detail
