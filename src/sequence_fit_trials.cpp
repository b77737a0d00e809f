#include "sequence_fit_trials.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

#include <fmt/format.h>

#include "allocsim/length_model.h"
#include "allocsim/length_peaks.h"
#include "allocsim/step_events_json.h"
#include "common/error.h"
#include "probe_trials.h"
#include "report/length_policies.h"
#include "search/model_fit.h"

namespace oomtune {
namespace {

// The step-events file of the fit trial at (b, t) (a temporary file).
std::string events_path_for(int64_t b, int64_t t) {
  return (std::filesystem::temp_directory_path() / fmt::format("oomtune-seq-{}-{}x{}.json", getpid(), b, t)).string();
}

// Note [Length replay]
// Rationale: a run whose batches vary in length asks the caching allocator
// for blocks of other sizes every step; cached blocks that fit no later
// request stay reserved, and reserved grows far past allocated (issue #47:
// 1.77x measured on an H100 for lengths uniform in 256-1024). The trials
// cannot show it: they count tensor storages, not a caching allocator.
// Approach: the step's events fitted in T at the configuration's
// micro-batch (or the largest one fitted) are replayed for `steps` steps at
// lengths drawn from the job's distribution with its seed, after the
// allocations alive across the step, under each policy
// (report/length_policies.h); the report recommends one.
// Limitations: those of LengthPolicies (one micro-batch per step).
void replay_drawn_lengths(SequenceFit& fit, const JobSpec& job, const TrainingConfig& config,
                          const std::vector<SequenceEvents>& events,
                          const std::map<int64_t, std::vector<int64_t>>& persistent, int64_t steps) {
  if (events.empty()) {
    fmt::print(stderr, "probe: no length replay: it needs the step's events at three lengths at one micro-batch\n");
    return;
  }
  const auto at_config = std::find_if(events.begin(), events.end(),
                                      [&](const SequenceEvents& e) { return e.micro_batch == config.micro_batch; });
  const SequenceEvents& step = at_config != events.end() ? *at_config : events.back();
  try {
    fit.length_policies = replay_length_policies(step.model, persistent.at(step.micro_batch), *job.seq_lengths,
                                                 describe_lengths(*job.seq_lengths, job.seq_lengths_file), job.seed,
                                                 steps, step.micro_batch, job.usable_budget_bytes());
  } catch (const InputError& e) {
    fmt::print(stderr, "probe: no length replay: {}\n", e.what());
  }
}

}  // namespace

std::vector<int64_t> default_fit_lengths(const JobSpec& job) {
  const int64_t t = *job.seq_len;
  std::vector<int64_t> lengths = job.seq_min ? std::vector<int64_t>{*job.seq_min, (*job.seq_min + t) / 2, t}
                                             : std::vector<int64_t>{t / 4, t / 2, t};
  lengths.erase(std::remove_if(lengths.begin(), lengths.end(), [](int64_t n) { return n < 1; }), lengths.end());
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
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
SequenceFit fit_sequence(const JobSpec& job, const TrainingConfig& config, const SequenceFitOptions& options,
                         std::optional<ActivationFit>& activation_fit) {
  const std::vector<int64_t>& batches = options.batches;
  const std::vector<int64_t>& lengths = options.lengths;
  SequenceFit fit;
  fit.length = *job.seq_len;
  fit.min_length = job.seq_min;
  fit.micro_batch = config.micro_batch;
  fit.usable_budget_bytes = job.usable_budget_bytes();
  fit.events_micro_batch = *std::max_element(batches.begin(), batches.end());
  std::vector<std::pair<int64_t, ProbeReport>> at_job_length;
  std::map<int64_t, std::vector<allocsim::LengthSample>> samples;                 // by micro-batch
  std::map<int64_t, std::pair<int64_t, std::array<double, kNumPhases>>> longest;  // by micro-batch: T, peaks
  std::map<int64_t, std::vector<int64_t>> persistent;  // by micro-batch: alive across the step (bytes)
  for (int64_t t : lengths) {
    JobSpec at_t = job;
    at_t.fix_seq_len(t);  // every step at t, not at drawn lengths (Note [Variable-length steps])
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
      allocsim::StepEvents step = allocsim::read_step_events(events);
      samples[b].push_back({t, std::move(step.events)});
      persistent[b] = std::move(step.persistent_bytes);
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
  answer_from_events(fit, events, options.predict_lengths);
  if (job.seq_lengths) replay_drawn_lengths(fit, job, config, events, persistent, options.replay_steps);
  return fit;
}

}  // namespace oomtune
