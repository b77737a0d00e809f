// The search's probes: the plain configuration's sizes, the walk up and
// down them, and each probe's record (search.h, Rules: Probes).

#include "search/search_state.h"

#include <algorithm>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"
#include "common/error.h"
#include "search/sentences.h"
#include "strategies/job_config.h"

namespace oomtune::search_detail {

std::vector<int64_t> probe_sizes(const JobSpec& job) {
  const int64_t g = job.global_batch;
  const int64_t top = largest_micro_batch(job);
  const int64_t bottom = std::min(job.min_micro_batch, top);  // e.g. BatchNorm needs more than one sample
  std::set<int64_t> sizes;
  for (int64_t s : {g / 8, g / 4, g / 2}) sizes.insert(std::clamp<int64_t>(s, bottom, top));
  if (sizes.size() < 2 && top > bottom) sizes.insert(std::min<int64_t>(bottom + 1, top));
  return {sizes.begin(), sizes.end()};
}

namespace {

// `message` with the argument list of "forward(...) failed: " emptied: the
// inputs' shapes, which name the micro-batch (ModelSession::forward). A
// tuple argument nests one level: "forward(inputs=(ids: Long 4x16)) failed".
std::string without_forward_arguments(const std::string& message) {
  static const std::regex kArguments(R"(forward\((?:[^()]|\([^()]*\))*\) failed: )");
  return std::regex_replace(message, kArguments, "forward() failed: ", std::regex_constants::format_first_only);
}

}  // namespace

bool same_failure(const ProbeReport& a, const ProbeReport& b) {
  return a.outcome == b.outcome && without_forward_arguments(a.message) == without_forward_arguments(b.message);
}

// Weights that ran out of memory while loading: no micro-batch can help.
bool ran_out_loading(const ProbeReport& r) {
  return r.outcome == TrialOutcome::kOutOfMemory && r.phase_at_failure == Phase::kLoad;
}

// A failure every larger micro-batch would repeat: it needs more memory, or
// its steps take longer than ones that already ran past the trial timeout.
bool fails_larger_too(TrialOutcome outcome) {
  return outcome == TrialOutcome::kOutOfMemory || outcome == TrialOutcome::kTimeout;
}

// The micro-batches below `below` that the plain probes step down to when
// fewer than two ran: halving, then the job's smallest, in descending order.
std::vector<int64_t> step_down_sizes(const JobSpec& job, int64_t below) {
  const int64_t bottom = std::min(job.min_micro_batch, largest_micro_batch(job));
  std::vector<int64_t> sizes;
  for (int64_t s = below / 2; s > bottom; s /= 2) sizes.push_back(s);
  if (bottom < below) sizes.push_back(bottom);
  return sizes;
}

ProbeReport Search::probe(TrainingConfig config, int64_t micro_batch) {
  config.micro_batch = micro_batch;
  config.accumulation_steps = 1;
  ProbeReport r = runner_.probe(config);
  hold_to_host_budget(r, config);
  progress_(fmt::format("probe  {:<60} {}", describe(config),
                        r.outcome != TrialOutcome::kOk ? outcome_of(r)
                        // A meta trial has no step time (StepTiming::measured): none is printed.
                        : r.timing.measured ? fmt::format("peak {}, {:.4f} s/step", format_bytes(r.peak_bytes),
                                                          r.timing.steady_step_seconds)
                                            : fmt::format("peak {}, no step time (meta)", format_bytes(r.peak_bytes))));
  if (r.outcome == TrialOutcome::kOutOfMemory && !ran_out_loading(r)) rule_out_from(config, micro_batch);
  if (r.outcome == TrialOutcome::kOk) largest_ran_micro_batch_ = std::max(largest_ran_micro_batch_, micro_batch);
  result_.probes.push_back(r);
  return r;
}

// Plain at the global batch for the lines: its verification run where
// that times it (Note [Plain's verification times it], meta_memory.cpp),
// else a probe, as after a verification that did not run to the end.
ProbeReport Search::plain_at_global_batch() {
  const int64_t g = job_.global_batch;
  if (plain_verification_times_g_ && base_ == job_base_) {
    const TrainingConfig c = with_micro_batch(base_, g, g);
    const auto [early, added] = verified_.emplace(to_string(c), ProbeReport{});
    if (added) early->second = verify(c);
    if (early->second.outcome == TrialOutcome::kOk) {
      result_.baseline_verified_micro_batch = g;
      return early->second;
    }
  }
  return probe(base_, g);
}

// Whether plain G x 1's verification ran while probing and fitted the
// budget (Note [Plain's verification times it], meta_memory.cpp).
bool Search::plain_verified_at_global_batch() const {
  const int64_t g = job_.global_batch;
  const auto ran = verified_.find(to_string(with_micro_batch(base_, g, g)));
  return ran != verified_.end() && fits_budget(ran->second);
}

// Walks up `sizes`; a probe that runs out of memory or time ends the walk,
// since larger micro-batches need more of both, as does an error above the
// sizes that ran (Note [An error that comes with the size], fit.cpp). When
// fewer than two sizes ran by then (the probes' RAM guard is a multiple of
// the budget, so a tight budget can stop the walk at G/8), it goes down
// from the smallest size tried until two have run: two points fit the
// lines, and a budget too small for G/8 is a "nothing fits" answer or a
// small micro-batch, not an error. Down means halving after running out of
// memory (such a probe stops at its first allocation over the guard, so it
// is cheap). When nothing ran before a timeout, it goes up from the
// smallest micro-batch instead and stops at the first one that fails for
// memory or time: each timeout costs the whole trial_timeout (a model that
// hangs times out at every size, and costs two).
// `p` may hold probes of base_ that already ran; they are not run again.
//
// Note [An error that does not depend on the micro-batch]
// An error at the smallest micro-batch does not end the walk up: BatchNorm
// refuses one sample per channel and runs at two. But when nothing has run
// and two sizes fail with the same message, word for word, about the
// user's input (`output` names no key of the model's dict; a loss that
// does not fit the output), the error does not depend on the micro-batch:
// the message names no shape that grows with it. The walk stops there
// rather than repeat the same error at every larger size. The shapes of
// forward's arguments, which a forward's error begins with, are left out of
// the comparison ("forward(input_ids: Long 2x200) failed: index out of
// range in self" at 1 and 2: a sequence past the model's positions); what
// the cause itself says about shapes still counts.
Search::PlainProbes Search::probe_plain(const std::vector<int64_t>& sizes, PlainProbes p) {
  auto probe_at = [&](int64_t s) {
    if (const auto known = p.ran.find(s); known != p.ran.end()) return known->second.outcome;
    if (const auto known = p.failed.find(s); known != p.failed.end()) return known->second.outcome;
    ProbeReport r = s == job_.global_batch ? plain_at_global_batch() : probe(base_, s);
    // A model file that does not load will not load at any micro-batch.
    if (r.outcome == TrialOutcome::kError && r.input_error && r.phase_at_failure == Phase::kLoad)
      throw InputError(r.message);
    const TrialOutcome outcome = r.outcome;
    (outcome == TrialOutcome::kOk ? p.ran : p.failed).emplace(s, std::move(r));
    return outcome;
  };
  std::optional<int64_t> stopped_at;
  const ProbeReport* last_error = nullptr;
  for (int64_t s : sizes) {
    const TrialOutcome outcome = probe_at(s);
    if (outcome == TrialOutcome::kError) {
      // Note [An error that does not depend on the micro-batch]
      const ProbeReport& error = p.failed.at(s);
      if (p.ran.empty() && last_error && error.input_error && last_error->input_error &&
          same_failure(error, *last_error))
        return p;
      last_error = &error;
      // Note [An error that comes with the size] (fit.cpp): larger sizes
      // would fail alike; with one size run, the walk goes down for a second.
      if (fails_for_its_size(error, s)) {
        stopped_at = s;
        break;
      }
    }
    if (!fails_larger_too(outcome)) continue;
    stopped_at = s;
    break;
  }
  // Note [An error that comes with the size] (fit.cpp): every size erred,
  // none about the user's input: they may all be too large, so the walk
  // goes down from the smallest.
  if (!stopped_at && p.ran.empty() && std::all_of(sizes.begin(), sizes.end(), [&](int64_t s) {
        const auto f = p.failed.find(s);
        return f != p.failed.end() && f->second.outcome == TrialOutcome::kError && !f->second.input_error;
      }))
    stopped_at = sizes.front();
  if (p.ran.size() >= 2 || !stopped_at || ran_out_loading(p.failed.at(*stopped_at))) return p;
  std::vector<int64_t> down = step_down_sizes(job_, sizes.front());
  const bool up_from_smallest = p.ran.empty() && p.failed.at(*stopped_at).outcome == TrialOutcome::kTimeout;
  if (up_from_smallest) std::reverse(down.begin(), down.end());
  for (int64_t s : down) {
    const TrialOutcome outcome = probe_at(s);
    if (p.ran.size() >= 2) return p;
    if (up_from_smallest && fails_larger_too(outcome)) break;
  }
  // One size ran and the smaller ones erred (BatchNorm at 1), or the next
  // larger one failed: the second point lies between it and the smallest
  // larger size that failed for memory or time.
  if (p.ran.size() != 1) return p;
  const int64_t low = p.ran.begin()->first;
  int64_t high = *stopped_at;
  for (auto f = p.failed.upper_bound(low); f != p.failed.end(); ++f)
    if (fails_larger_too(f->second.outcome)) high = std::min(high, f->first);
  while (p.ran.size() < 2 && high - low > 1) {
    const int64_t middle = low + (high - low) / 2;
    if (!fails_larger_too(probe_at(middle))) break;
    high = middle;
  }
  return p;
}

}  // namespace oomtune::search_detail
