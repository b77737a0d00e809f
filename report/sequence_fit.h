#pragma once
// SequenceFit: what `oomtune probe` adds for a job whose inputs name "seq"
// (docs/sequence_length.md): each step phase's peak fitted in micro-batch
// and sequence length (probes/seq_fit.h), the requests that grow with T²
// and the operators that made them (allocsim/length_model.h), and the two
// answers under the budget. Its renderers (text lines, JSON). No libtorch.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "allocsim/length_model.h"
#include "common/phase.h"
#include "probes/seq_fit.h"
#include "report/length_policies.h"

namespace oomtune {

/// One probe of the sequence fit.
struct SequenceProbe {
  int64_t micro_batch = 0;                       // COUNT: samples
  int64_t length = 0;                            // COUNT: tokens
  std::array<double, kNumPhases> phase_peaks{};  // bytes against the budget (search/model_fit.h, phase_peaks_of)
};

/// The requests of one operator in one phase that grow with T².
struct QuadraticOperator {
  std::string op;  // "aten::softmax"; "" when the tracker did not know it
  Phase phase = Phase::kLoad;
  int64_t requests = 0;  // COUNT
  int64_t bytes = 0;     // SUM: their bytes at the job's length and the events' micro-batch
};

/// A predicted step at one (micro-batch, length).
struct SequencePrediction {
  int64_t micro_batch = 0;                       // COUNT
  int64_t length = 0;                            // COUNT: tokens
  std::array<double, kNumPhases> phase_peaks{};  // bytes against the budget
  double peak_bytes = 0;                         // the largest phase
  double fit_peak_bytes = 0;                     // what the phase fits give instead (SequenceFit::predict)
};

/// The step's events at one micro-batch, fitted in T (LengthModel), and per
/// phase the bytes alive before the step that the events do not show
/// (weights, optimizer state, buffers: the measured phase peak less the
/// events' live peak, at the longest length measured).
struct SequenceEvents {
  int64_t micro_batch = 0;  // COUNT
  allocsim::LengthModel model;
  std::array<double, kNumPhases> before_step{};  // bytes against the budget
};

/// The sequence-length part of a probe.
struct SequenceFit {
  int64_t length = 0;                                        // COUNT: the job's T (tokens)
  std::optional<int64_t> min_length;                         // COUNT: with `seq = [min, max]`, min
  int64_t micro_batch = 0;                                   // COUNT: the probed configuration's micro-batch
  std::vector<SequenceProbe> probes;                         // the (B, T) probes the fits used
  std::array<std::optional<SeqPeakFit>, kNumPhases> phases;  // the step phases' fits
  bool events_fitted = false;                          // a LengthModel was fitted (three lengths at one micro-batch)
  int64_t events_micro_batch = 0;                      // COUNT: the micro-batch of those event streams
  std::vector<QuadraticOperator> quadratic_operators;  // largest bytes first; empty: none grows with T²
  std::optional<int64_t> usable_budget_bytes;          // SUM: the budget less headroom, if any
  int64_t largest_micro_batch = 0;              // COUNT: at `length`, under the usable budget (kMaxGlobalBatch caps it)
  Phase micro_batch_limit = Phase::kLoad;       // the phase that limits it
  int64_t longest_length = 0;                   // COUNT: at `micro_batch`, under the usable budget (kMaxSeqLen caps it)
  Phase length_limit = Phase::kLoad;            // the phase that limits it
  bool answers_from_events = false;             // the answers and predictions replay the step's events (else the fits)
  std::vector<SequencePrediction> predictions;  // at the lengths the probe was asked to predict
  std::optional<LengthPolicies> length_policies;  // a job with a length distribution: the replay of many steps

  /// The largest phase fit at (b, t), bytes: the step's predicted peak.
  double predict(int64_t b, int64_t t) const;
  /// The phases whose fit kept the T² term.
  std::vector<Phase> quadratic_phases() const;
};

/// Fits every phase of `probes` (fit_seq_peak, passing `allow_quadratic`:
/// false where the step's events show no T² request) and, with a budget, answers
/// from the fits (answer_from_events replaces them where events were
/// recorded):
/// largest_micro_batch and longest_length (the smallest over the phases).
/// Throws InputError as fit_seq_peak does.
void fit_sequence_phases(SequenceFit& fit, bool allow_quadratic = true);

/// Per-phase peaks (bytes against the budget) at micro-batch `b` and length
/// `t` from `events` (non-empty, ascending micro-batches): at each events
/// micro-batch the live peaks of the step replayed at `t`
/// (allocsim/length_peaks.h) plus before_step; linear in B through the two
/// nearest micro-batches (with one, the events' bytes scale with B / its
/// micro-batch).
std::array<double, kNumPhases> replay_phase_peaks(const std::vector<SequenceEvents>& events, int64_t b, int64_t t);

/// Replaces `fit`'s answers with the replay's (largest micro-batch at
/// fit.length, longest length at fit.micro_batch, by bisection: peaks grow
/// with B and T) and adds a prediction at fit.micro_batch for each of
/// `predict_lengths`; sets answers_from_events. Without events, predicts
/// from the fits. Note [Sequence replay] in sequence_fit.cpp.
void answer_from_events(SequenceFit& fit, const std::vector<SequenceEvents>& events,
                        const std::vector<int64_t>& predict_lengths);

/// The requests of `model` that grow with T², grouped by operator and phase,
/// with their bytes at `length` (round(c0 + c1·T + c2·T²)); largest first.
std::vector<QuadraticOperator> quadratic_operators(const allocsim::LengthModel& model, int64_t length);

/// The text lines of `fit` (each ending in "\n").
std::string render_sequence_text(const SequenceFit& fit);
/// JSON with the same numbers; units in the key names.
nlohmann::json sequence_fit_json(const SequenceFit& fit);

}  // namespace oomtune
