#include "allocsim/length_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "common/error.h"

namespace oomtune::allocsim {
namespace {

std::string event_name(const std::vector<AllocEvent>& events, std::size_t index) {
  const AllocEvent& e = events[index];
  return e.op.empty() ? fmt::format("event {}", index) : fmt::format("event {} ({})", index, e.op);
}

/// partners() of one sample (see the header).
std::vector<std::size_t> pair_events(const LengthSample& sample) {
  std::vector<std::size_t> partner(sample.events.size(), LengthModel::kCarriedIn);
  std::unordered_map<std::uint64_t, std::size_t> live;
  for (std::size_t i = 0; i < sample.events.size(); ++i) {
    const AllocEvent& e = sample.events[i];
    if (e.kind == AllocEventKind::kAlloc) {
      if (!live.emplace(e.id, i).second)
        throw InputError(fmt::format("step at T={}: {} allocates id {}, which is already live", sample.length,
                                     event_name(sample.events, i), e.id));
      continue;
    }
    const auto it = live.find(e.id);
    if (it == live.end()) continue;  // made before the step
    partner[i] = it->second;
    partner[it->second] = i;
    live.erase(it);
  }
  return partner;
}

/// {c0, c1, c2} through (t[k], y[k]): Newton's divided differences on the
/// first three points (two: a line). Long double: T² of a long context is
/// ~1e10 and byte counts ~1e11, far inside its 64-bit mantissa.
std::array<double, 3> solve(const std::vector<long double>& t, const std::vector<long double>& y) {
  const long double d01 = (y[1] - y[0]) / (t[1] - t[0]);
  if (t.size() == 2) return {static_cast<double>(y[0] - d01 * t[0]), static_cast<double>(d01), 0.0};
  const long double d12 = (y[2] - y[1]) / (t[2] - t[1]);
  const long double c2 = (d12 - d01) / (t[2] - t[0]);
  const long double c1 = d01 - c2 * (t[0] + t[1]);
  const long double c0 = y[0] - c1 * t[0] - c2 * t[0] * t[0];
  return {static_cast<double>(c0), static_cast<double>(c1), static_cast<double>(c2)};
}

long double evaluate(const std::array<double, 3>& c, long double t) { return c[0] + c[1] * t + c[2] * t * t; }

}  // namespace

LengthModel LengthModel::fit(const std::vector<LengthSample>& samples) {
  if (samples.empty()) throw InputError("length model: no steps to fit");
  for (const LengthSample& s : samples)
    if (s.length < 1) throw InputError(fmt::format("length model: a step at length {} (lengths are >= 1)", s.length));

  const LengthSample& first = samples.front();
  const std::vector<std::size_t> partners = pair_events(first);
  for (const LengthSample& s : samples) {
    if (s.events.size() != first.events.size())
      throw InputError(fmt::format("length model: the step has {} events at T={} but {} at T={}: not the same step",
                                   first.events.size(), first.length, s.events.size(), s.length));
    const std::vector<std::size_t> other = pair_events(s);
    for (std::size_t i = 0; i < s.events.size(); ++i)
      if (s.events[i].kind != first.events[i].kind || other[i] != partners[i])
        throw InputError(fmt::format("length model: {} differs between T={} and T={} ({}): not the same step",
                                     event_name(first.events, i), first.length, s.length,
                                     s.events[i].kind != first.events[i].kind         ? "alloc vs free"
                                     : first.events[i].kind == AllocEventKind::kAlloc ? "freed elsewhere"
                                                                                      : "frees another allocation"));
  }

  // One byte count per distinct length; repeated lengths must agree.
  std::map<int64_t, const LengthSample*> by_length;
  for (const LengthSample& s : samples) {
    const auto [it, inserted] = by_length.emplace(s.length, &s);
    if (inserted) continue;
    for (std::size_t i = 0; i < s.events.size(); ++i)
      if (s.events[i].bytes != it->second->events[i].bytes && s.events[i].kind == AllocEventKind::kAlloc)
        throw InputError(fmt::format("length model: two steps at T={} differ at {}: {} vs {} bytes", s.length,
                                     event_name(first.events, i), it->second->events[i].bytes, s.events[i].bytes));
  }
  if (by_length.size() < 2)
    throw InputError(fmt::format("length model: every step is at T={}; at least two lengths are needed", first.length));

  LengthModel model;
  model.events_ = first.events;
  model.partners_ = partners;
  model.coefficients_.assign(first.events.size(), {0.0, 0.0, 0.0});
  for (const auto& [length, sample] : by_length) model.lengths_.push_back(length);

  std::vector<long double> t, y;
  for (std::size_t i = 0; i < first.events.size(); ++i) {
    if (first.events[i].kind != AllocEventKind::kAlloc) continue;
    t.clear();
    y.clear();
    for (const auto& [length, sample] : by_length) {
      t.push_back(static_cast<long double>(length));
      y.push_back(static_cast<long double>(sample->events[i].bytes));
    }
    std::array<double, 3> c = solve(t, y);
    // A T² term worth less than half a byte at the longest length is a
    // rounding residue of a linear request: drop it and refit the line.
    if (c[2] != 0.0 && std::fabs(c[2]) * t.back() * t.back() < 0.5L) {
      c = solve({t[0], t.back()}, {y[0], y.back()});
    }
    for (std::size_t k = 0; k < t.size(); ++k)
      if (std::fabs(evaluate(c, t[k]) - y[k]) > 0.5L)
        throw InputError(fmt::format(
            "length model: {}: {} bytes at T={}, the fit gives {:.1f}: its size is not a polynomial of degree <= 2 "
            "in the length",
            event_name(first.events, i), static_cast<int64_t>(y[k]), static_cast<int64_t>(t[k]),
            static_cast<double>(evaluate(c, t[k]))));
    model.coefficients_[i] = c;
  }
  return model;
}

std::vector<AllocEvent> LengthModel::at(int64_t length) const {
  if (length < 1) throw InputError(fmt::format("length model: length {} (lengths are >= 1)", length));
  std::vector<AllocEvent> events = events_;
  const auto t = static_cast<long double>(length);
  for (std::size_t i = 0; i < events.size(); ++i)
    if (events[i].kind == AllocEventKind::kAlloc)
      events[i].bytes = std::max<int64_t>(0, std::llround(evaluate(coefficients_[i], t)));
  return events;
}

bool LengthModel::quadratic() const {
  return std::any_of(coefficients_.begin(), coefficients_.end(), [](const auto& c) { return c[2] != 0.0; });
}

std::vector<std::pair<std::size_t, std::string>> LengthModel::quadratic_requests() const {
  std::vector<std::size_t> indices;
  for (std::size_t i = 0; i < coefficients_.size(); ++i)
    if (coefficients_[i][2] != 0.0) indices.push_back(i);
  std::stable_sort(indices.begin(), indices.end(),
                   [&](std::size_t a, std::size_t b) { return coefficients_[a][2] > coefficients_[b][2]; });
  std::vector<std::pair<std::size_t, std::string>> out;
  for (std::size_t i : indices) out.emplace_back(i, events_[i].op);
  return out;
}

std::size_t LengthModel::carried_out() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < events_.size(); ++i)
    if (events_[i].kind == AllocEventKind::kAlloc && partners_[i] == kCarriedIn) ++n;
  return n;
}

std::size_t LengthModel::carried_in() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < events_.size(); ++i)
    if (events_[i].kind == AllocEventKind::kFree && partners_[i] == kCarriedIn) ++n;
  return n;
}

}  // namespace oomtune::allocsim
