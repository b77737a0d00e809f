#include "report/sequence_fit.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "allocsim/length_peaks.h"
#include "common/byte_size.h"
#include "common/json_text.h"
#include "job/job_spec.h"
#include "search/memory_model.h"

namespace oomtune {
namespace {

std::string join_counts(const std::set<int64_t>& values) { return fmt::format("{}", fmt::join(values, ", ")); }

// Bytes per unit to a tenth (or `digits`), a fit's noise around zero shown
// as 0 (never "-0.0").
std::string per_unit(double bytes, int digits = 1) {
  const double tenth = std::pow(10.0, -digits) / 2;
  return fmt::format("{:.{}f} B", std::fabs(bytes) < tenth ? 0.0 : bytes, digits);
}

// "limited by backward", or that nothing reached the budget below the cap.
std::string limit_text(Phase phase) {
  return phase == Phase::kLoad ? std::string("no phase reaches the budget below the cap")
                               : fmt::format("limited by {}", phase_name(phase));
}

int64_t longest_probed(const SequenceFit& fit) {
  int64_t longest = 0;
  for (const SequenceProbe& p : fit.probes) longest = std::max(longest, p.length);
  return longest;
}

}  // namespace

double SequenceFit::predict(int64_t b, int64_t t) const {
  double peak = 0;
  for (Phase p : kStepPhases)
    if (const auto& f = phases[static_cast<std::size_t>(p)])
      peak = std::max(peak, (*f)(static_cast<double>(b), static_cast<double>(t)));
  return peak;
}

std::vector<Phase> SequenceFit::quadratic_phases() const {
  std::vector<Phase> out;
  for (Phase p : kStepPhases)
    if (const auto& f = phases[static_cast<std::size_t>(p)]; f && f->quadratic) out.push_back(p);
  return out;
}

void fit_sequence_phases(SequenceFit& fit, bool allow_quadratic) {
  for (Phase phase : kStepPhases) {
    std::vector<SeqPoint> points;
    for (const SequenceProbe& p : fit.probes)
      points.push_back({p.micro_batch, p.length, p.phase_peaks[static_cast<std::size_t>(phase)]});
    fit.phases[static_cast<std::size_t>(phase)] = fit_seq_peak(points, allow_quadratic);
  }
  if (!fit.usable_budget_bytes) return;
  const auto budget = static_cast<double>(*fit.usable_budget_bytes);
  fit.largest_micro_batch = kMaxGlobalBatch;
  fit.longest_length = kMaxSeqLen;
  for (Phase phase : kStepPhases) {
    const SeqPeakFit& f = *fit.phases[static_cast<std::size_t>(phase)];
    if (const int64_t b = largest_micro_batch(f, fit.length, budget, kMaxGlobalBatch); b < fit.largest_micro_batch) {
      fit.largest_micro_batch = b;
      fit.micro_batch_limit = phase;
    }
    if (const int64_t t = longest_length(f, fit.micro_batch, budget, kMaxSeqLen); t < fit.longest_length) {
      fit.longest_length = t;
      fit.length_limit = phase;
    }
  }
}

// Note [Sequence replay]
// Rationale: a phase's peak is the largest of its moments' live bytes, and
// the moment moves with T: a quadratic fitted to short lengths' peaks
// misses a later moment that overtakes them (allocsim/length_peaks.h). The
// step's events, fitted in T, give every moment at any length.
// Approach: at each micro-batch whose events were recorded, the step is
// replayed at the length asked; the bytes alive before it are the measured
// peak less the replay's at the longest length measured; between
// micro-batches the peaks are linear in B. The answers bisect over B and T
// (the peaks grow with both).
// Limitations: exact in T at the events' micro-batches only; linear in B
// between them; extrapolated past the longest length measured as the
// LengthModel's polynomials are.
std::array<double, kNumPhases> replay_phase_peaks(const std::vector<SequenceEvents>& events, int64_t b, int64_t t) {
  const auto at = [&](const SequenceEvents& e) {
    const auto live = allocsim::phase_live_peaks(e.model, t);
    std::array<double, kNumPhases> peaks{};
    for (Phase p : kStepPhases) {
      const auto i = static_cast<std::size_t>(p);
      peaks[i] = e.before_step[i] + static_cast<double>(live[i]);
    }
    return std::make_pair(peaks, live);
  };
  const auto bd = static_cast<double>(b);
  if (events.size() == 1) {
    const auto [peaks, live] = at(events.front());
    std::array<double, kNumPhases> out{};
    const double ratio = bd / static_cast<double>(events.front().micro_batch);
    for (Phase p : kStepPhases) {
      const auto i = static_cast<std::size_t>(p);
      out[i] = events.front().before_step[i] + ratio * static_cast<double>(live[i]);
    }
    return out;
  }
  std::size_t hi = 1;
  while (hi + 1 < events.size() && events[hi].micro_batch < b) ++hi;
  const SequenceEvents& e1 = events[hi - 1];
  const SequenceEvents& e2 = events[hi];
  const auto p1 = at(e1).first, p2 = at(e2).first;
  const double w = (bd - static_cast<double>(e1.micro_batch)) / static_cast<double>(e2.micro_batch - e1.micro_batch);
  std::array<double, kNumPhases> out{};
  for (Phase p : kStepPhases) {
    const auto i = static_cast<std::size_t>(p);
    out[i] = p1[i] + w * (p2[i] - p1[i]);
  }
  return out;
}

namespace {

// The largest phase of `peaks` and its phase.
std::pair<double, Phase> largest_phase(const std::array<double, kNumPhases>& peaks) {
  std::pair<double, Phase> out{0, Phase::kForward};
  for (Phase p : kStepPhases)
    if (peaks[static_cast<std::size_t>(p)] > out.first) out = {peaks[static_cast<std::size_t>(p)], p};
  return out;
}

// The largest n in [0, cap] with fits(n) (fits grows false with n), and the
// phase of the first n that does not fit (kLoad when cap fits).
template <typename Peaks>
std::pair<int64_t, Phase> bisect(int64_t cap, double budget, const Peaks& peaks_at) {
  const auto over = [&](int64_t n) { return largest_phase(peaks_at(n)); };
  if (over(cap).first <= budget) return {cap, Phase::kLoad};
  if (over(1).first > budget) return {0, over(1).second};
  int64_t lo = 1, hi = cap;  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (over(mid).first <= budget ? lo : hi) = mid;
  }
  return {lo, over(hi).second};
}

}  // namespace

void answer_from_events(SequenceFit& fit, const std::vector<SequenceEvents>& events,
                        const std::vector<int64_t>& predict_lengths) {
  for (int64_t t : predict_lengths) {
    SequencePrediction p;
    p.micro_batch = fit.micro_batch;
    p.length = t;
    if (!events.empty()) {
      p.phase_peaks = replay_phase_peaks(events, fit.micro_batch, t);
    } else {
      for (Phase phase : kStepPhases)
        if (const auto& f = fit.phases[static_cast<std::size_t>(phase)])
          p.phase_peaks[static_cast<std::size_t>(phase)] =
              (*f)(static_cast<double>(fit.micro_batch), static_cast<double>(t));
    }
    p.peak_bytes = largest_phase(p.phase_peaks).first;
    p.fit_peak_bytes = fit.predict(fit.micro_batch, t);
    fit.predictions.push_back(p);
  }
  if (events.empty()) return;
  fit.answers_from_events = true;
  if (!fit.usable_budget_bytes) return;
  const auto budget = static_cast<double>(*fit.usable_budget_bytes);
  // The events' peaks at the job's length, once: linear in B between them.
  std::tie(fit.largest_micro_batch, fit.micro_batch_limit) =
      bisect(kMaxGlobalBatch, budget, [&](int64_t b) { return replay_phase_peaks(events, b, fit.length); });
  std::tie(fit.longest_length, fit.length_limit) =
      bisect(kMaxSeqLen, budget, [&](int64_t t) { return replay_phase_peaks(events, fit.micro_batch, t); });
}

std::vector<QuadraticOperator> quadratic_operators(const allocsim::LengthModel& model, int64_t length) {
  std::map<std::pair<std::string, Phase>, QuadraticOperator> groups;
  const double t = static_cast<double>(length);
  for (const auto& [index, op] : model.quadratic_requests()) {
    const auto& c = model.coefficients(index);
    const Phase phase = model.events()[index].phase;
    QuadraticOperator& g = groups[{op, phase}];
    g.op = op;
    g.phase = phase;
    ++g.requests;
    g.bytes += static_cast<int64_t>(std::llround(std::max(0.0, c[0] + c[1] * t + c[2] * t * t)));
  }
  std::vector<QuadraticOperator> out;
  for (auto& [key, g] : groups) out.push_back(std::move(g));
  std::stable_sort(out.begin(), out.end(),
                   [](const QuadraticOperator& a, const QuadraticOperator& b) { return a.bytes > b.bytes; });
  return out;
}

std::string render_sequence_text(const SequenceFit& fit) {
  std::string out;
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  std::set<int64_t> batches, lengths;
  for (const SequenceProbe& p : fit.probes) {
    batches.insert(p.micro_batch);
    lengths.insert(p.length);
  }
  line(fmt::format("sequence  T = {} tokens{}; {} probes at micro-batch {} x length {}", fit.length,
                   fit.min_length ? fmt::format(" (the longest of seq = [{}, {}])", *fit.min_length, fit.length) : "",
                   fit.probes.size(), join_counts(batches), join_counts(lengths)));
  line("          peak = fixed + B x (per sample + per token x T + per token^2 x T^2), bytes against the budget");
  line(fmt::format("{:<10} {:>12} {:>12} {:>12} {:>12} {:>4} {:>13}", "phase", "fixed", "per sample", "per token",
                   "per token^2", "T^2", "max residual"));
  for (Phase phase : kStepPhases) {
    const auto& f = fit.phases[static_cast<std::size_t>(phase)];
    if (!f) continue;
    line(fmt::format("{:<10} {:>12} {:>12} {:>12} {:>12} {:>4} {:>11.2f} %", phase_name(phase),
                     format_bytes(static_cast<int64_t>(std::llround(f->fixed))),
                     f->sample_term ? per_unit(f->per_sample) : "-", per_unit(f->per_token),
                     f->quadratic ? per_unit(f->per_token_sq, 3) : "-", f->quadratic ? "yes" : "no",
                     100.0 * f->max_relative_residual));
  }
  std::vector<std::string> quadratic;
  for (Phase p : fit.quadratic_phases()) quadratic.emplace_back(phase_name(p));
  line(fmt::format("T^2 term  {}", quadratic.empty()
                                       ? std::string(fit.events_fitted && fit.quadratic_operators.empty()
                                                         ? "in no phase: no request of the step grows with T^2"
                                                         : "in no phase: every peak is a line in T (within 1 % of "
                                                           "its span)")
                                       : fmt::format("in {} (a line in T misses by more than 1 % of the span)",
                                                     fmt::join(quadratic, ", "))));
  if (!fit.events_fitted) {
    line("T^2 tensors not named: that needs the step's events at three lengths at one micro-batch");
  } else if (fit.quadratic_operators.empty()) {
    line(fmt::format("T^2 tensors none: no request of the step grows with T^2 (events at micro-batch {})",
                     fit.events_micro_batch));
  } else {
    int64_t requests = 0;
    for (const QuadraticOperator& q : fit.quadratic_operators) requests += q.requests;
    line(fmt::format("T^2 tensors {} requests grow with T^2 (bytes at micro-batch {}, T = {}):", requests,
                     fit.events_micro_batch, fit.length));
    // One column for the operators, as wide as the longest name.
    const auto name = [](const QuadraticOperator& q) { return q.op.empty() ? "(unknown operator)" : q.op; };
    std::size_t width = 48;
    for (const QuadraticOperator& q : fit.quadratic_operators) width = std::max(width, name(q).size());
    for (const QuadraticOperator& q : fit.quadratic_operators)
      line(fmt::format("            {:<{}} {:>3} x in {:<9} {:>12}", name(q), width, q.requests, phase_name(q.phase),
                       format_bytes(q.bytes)));
  }
  for (const SequencePrediction& p : fit.predictions)
    line(fmt::format("predicted peak {} at micro-batch {}, T = {} ({}; largest phase {}{})",
                     format_bytes(static_cast<int64_t>(std::llround(p.peak_bytes))), p.micro_batch, p.length,
                     fit.answers_from_events ? "the step's events replayed" : "the phase fits",
                     phase_name(largest_phase(p.phase_peaks).second),
                     fit.answers_from_events
                         ? fmt::format("; the phase fits give {}",
                                       format_bytes(static_cast<int64_t>(std::llround(p.fit_peak_bytes))))
                         : ""));
  if (fit.usable_budget_bytes) {
    const int64_t longest = longest_probed(fit);
    line(fmt::format("budget    {} usable ({}): largest micro-batch at T = {}: {} ({})",
                     format_bytes(*fit.usable_budget_bytes),
                     fit.answers_from_events ? "the step's events replayed" : "from the phase fits", fit.length,
                     fit.largest_micro_batch, limit_text(fit.micro_batch_limit)));
    line(fmt::format(
        "          longest sequence at micro-batch {}: {} tokens (limited by {}{})", fit.micro_batch,
        fit.longest_length, phase_name(fit.length_limit),
        fit.longest_length > longest ? fmt::format("; beyond the longest probe, {}: extrapolated", longest) : ""));
  }
  if (fit.length_policies) out += render_length_policies_text(*fit.length_policies);
  return out;
}

nlohmann::json sequence_fit_json(const SequenceFit& fit) {
  nlohmann::json probes = nlohmann::json::array();
  for (const SequenceProbe& p : fit.probes) {
    nlohmann::json peaks = nlohmann::json::object();
    for (Phase phase : kStepPhases)
      peaks[std::string(phase_name(phase))] = p.phase_peaks[static_cast<std::size_t>(phase)];
    probes.push_back({{"micro_batch", p.micro_batch}, {"length", p.length}, {"phase_peak_bytes", peaks}});
  }
  nlohmann::json phases = nlohmann::json::object();
  for (Phase phase : kStepPhases) {
    const auto& f = fit.phases[static_cast<std::size_t>(phase)];
    if (!f) continue;
    phases[std::string(phase_name(phase))] = {{"fixed_bytes", f->fixed},
                                              {"bytes_per_sample", f->per_sample},
                                              {"bytes_per_sample_token", f->per_token},
                                              {"bytes_per_sample_token_squared", f->per_token_sq},
                                              {"sample_term", f->sample_term},
                                              {"quadratic", f->quadratic},
                                              {"max_relative_residual", f->max_relative_residual},
                                              {"linear_miss_of_span", f->linear_miss}};
  }
  nlohmann::json quadratic = nlohmann::json::array();
  for (const QuadraticOperator& q : fit.quadratic_operators)
    quadratic.push_back(
        {{"op", q.op}, {"phase", std::string(phase_name(q.phase))}, {"requests", q.requests}, {"bytes", q.bytes}});
  nlohmann::json quadratic_phases = nlohmann::json::array();
  for (Phase p : fit.quadratic_phases()) quadratic_phases.push_back(std::string(phase_name(p)));
  nlohmann::json j = {{"length", fit.length},
                      {"min_length", json_or_null(fit.min_length)},
                      {"micro_batch", fit.micro_batch},
                      {"probes", probes},
                      {"phases", phases},
                      {"quadratic_phases", quadratic_phases},
                      {"events_fitted", fit.events_fitted},
                      {"events_micro_batch", fit.events_micro_batch},
                      {"quadratic_operators", quadratic}};
  j["usable_budget_bytes"] = json_or_null(fit.usable_budget_bytes);
  j["answers_from_events"] = fit.answers_from_events;
  nlohmann::json predictions = nlohmann::json::array();
  for (const SequencePrediction& p : fit.predictions) {
    nlohmann::json peaks = nlohmann::json::object();
    for (Phase phase : kStepPhases)
      peaks[std::string(phase_name(phase))] = p.phase_peaks[static_cast<std::size_t>(phase)];
    predictions.push_back({{"micro_batch", p.micro_batch},
                           {"length", p.length},
                           {"peak_bytes", p.peak_bytes},
                           {"fit_peak_bytes", p.fit_peak_bytes},
                           {"phase_peak_bytes", peaks}});
  }
  j["predictions"] = predictions;
  j["length_policies"] = fit.length_policies ? length_policies_json(*fit.length_policies) : nlohmann::json(nullptr);
  if (fit.usable_budget_bytes) {
    j["largest_micro_batch"] = fit.largest_micro_batch;
    j["largest_micro_batch_limited_by"] = std::string(phase_name(fit.micro_batch_limit));
    j["longest_length"] = fit.longest_length;
    j["longest_length_limited_by"] = std::string(phase_name(fit.length_limit));
  }
  return j;
}

}  // namespace oomtune
