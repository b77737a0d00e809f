#include "probes/seq_fit.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "common/error.h"

namespace oomtune {
namespace {

constexpr std::size_t kMaxTerms = 4;  // 1, B, B·T, B·T²

// The columns of one point: 1, B, B·T, B·T², of which `terms` are used.
struct Terms {
  bool sample = false;
  bool quadratic = false;
  std::size_t count() const { return 2 + (sample ? 1 : 0) + (quadratic ? 1 : 0); }
};

std::array<double, kMaxTerms> row_of(const SeqPoint& p, const Terms& terms) {
  const double b = static_cast<double>(p.micro_batch), t = static_cast<double>(p.length);
  std::array<double, kMaxTerms> row{};
  std::size_t i = 0;
  row[i++] = 1.0;
  if (terms.sample) row[i++] = b;
  row[i++] = b * t;
  if (terms.quadratic) row[i++] = b * t * t;
  return row;
}

// Least squares by the normal equations of the columns scaled to a largest
// |value| of 1 (B·T² reaches 10^9 where 1 is 1), solved by Gauss-Jordan
// elimination with partial pivoting.
std::array<double, kMaxTerms> least_squares(const std::vector<SeqPoint>& points, const Terms& terms) {
  const std::size_t n = terms.count();
  std::array<double, kMaxTerms> scale{};
  for (const SeqPoint& p : points) {
    const auto row = row_of(p, terms);
    for (std::size_t i = 0; i < n; ++i) scale[i] = std::max(scale[i], std::fabs(row[i]));
  }
  std::array<std::array<double, kMaxTerms + 1>, kMaxTerms> a{};
  for (const SeqPoint& p : points) {
    auto row = row_of(p, terms);
    for (std::size_t i = 0; i < n; ++i) row[i] /= scale[i];
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) a[i][j] += row[i] * row[j];
      a[i][n] += row[i] * p.bytes;
    }
  }
  for (std::size_t c = 0; c < n; ++c) {
    std::size_t pivot = c;
    for (std::size_t r = c + 1; r < n; ++r)
      if (std::fabs(a[r][c]) > std::fabs(a[pivot][c])) pivot = r;
    std::swap(a[c], a[pivot]);
    if (std::fabs(a[c][c]) < 1e-12) continue;  // a column the points cannot tell apart: left at 0
    for (std::size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (std::size_t k = c; k <= n; ++k) a[r][k] -= f * a[c][k];
    }
  }
  std::array<double, kMaxTerms> x{};
  for (std::size_t i = 0; i < n; ++i)
    if (std::fabs(a[i][i]) >= 1e-12) x[i] = a[i][n] / a[i][i] / scale[i];
  return x;
}

SeqPeakFit fit_with(const std::vector<SeqPoint>& points, const Terms& terms) {
  const std::array<double, kMaxTerms> x = least_squares(points, terms);
  SeqPeakFit fit;
  std::size_t i = 0;
  fit.fixed = x[i++];
  if (terms.sample) fit.per_sample = x[i++];
  fit.per_token = x[i++];
  if (terms.quadratic) fit.per_token_sq = x[i++];
  fit.sample_term = terms.sample;
  fit.quadratic = terms.quadratic;
  for (const SeqPoint& p : points) {
    const double miss = std::fabs(p.bytes - fit(static_cast<double>(p.micro_batch), static_cast<double>(p.length)));
    fit.max_relative_residual = std::max(fit.max_relative_residual, p.bytes > 0 ? miss / p.bytes : miss);
  }
  return fit;
}

}  // namespace

SeqPeakFit fit_seq_peak(const std::vector<SeqPoint>& points, bool allow_quadratic) {
  std::set<int64_t> batches, lengths;
  for (const SeqPoint& p : points) {
    if (p.micro_batch < 1 || p.length < 1)
      throw InputError(
          fmt::format("sequence fit: micro-batch and length must be >= 1, got {} x {}", p.micro_batch, p.length));
    if (!std::isfinite(p.bytes))
      throw InputError(fmt::format("sequence fit: the peak at {} x {} is not a number", p.micro_batch, p.length));
    batches.insert(p.micro_batch);
    lengths.insert(p.length);
  }
  if (lengths.size() < 2)
    throw InputError(fmt::format("sequence fit: needs probes at two or more lengths, got {}", lengths.size()));
  Terms terms;
  terms.sample = batches.size() >= 2;
  SeqPeakFit linear = fit_with(points, terms);
  double low = points.front().bytes, high = low, miss = 0;
  for (const SeqPoint& p : points) {
    low = std::min(low, p.bytes);
    high = std::max(high, p.bytes);
    miss =
        std::max(miss, std::fabs(p.bytes - linear(static_cast<double>(p.micro_batch), static_cast<double>(p.length))));
  }
  linear.linear_miss = high > low ? miss / (high - low) : 0;
  if (!allow_quadratic || lengths.size() < 3 || linear.linear_miss <= kSeqLinearTolerance) return linear;
  terms.quadratic = true;
  SeqPeakFit quadratic = fit_with(points, terms);
  quadratic.linear_miss = linear.linear_miss;
  return quadratic;
}

int64_t largest_micro_batch(const SeqPeakFit& fit, int64_t length, double budget, int64_t cap) {
  const double t = static_cast<double>(length);
  const double per_sample = fit.per_sample + fit.per_token * t + fit.per_token_sq * t * t;
  if (per_sample <= 0) return fit.fixed <= budget ? cap : 0;
  const auto fits = [&](double b) { return fit(b, t) <= budget; };
  double b = std::floor((budget - fit.fixed) / per_sample);
  if (b >= static_cast<double>(cap)) return cap;
  // The closed form's rounding, settled against the fit itself.
  while (b + 1 <= static_cast<double>(cap) && fits(b + 1)) ++b;
  while (b > 0 && !fits(b)) --b;
  return b < 0 ? 0 : static_cast<int64_t>(b);
}

int64_t longest_length(const SeqPeakFit& fit, int64_t micro_batch, double budget, int64_t cap) {
  const double b = static_cast<double>(micro_batch);
  // b·q·T² + b·p·T <= budget - fixed - b·s
  const double qa = b * fit.per_token_sq, qb = b * fit.per_token, room = budget - fit.fixed - b * fit.per_sample;
  const auto fits = [&](double t) { return fit(b, t) <= budget; };
  double t = 0;
  if (qa > 0)
    t = (-qb + std::sqrt(qb * qb + 4 * qa * std::max(0.0, room))) / (2 * qa);
  else if (qb > 0)
    t = room / qb;
  else
    return room >= 0 ? cap : 0;
  t = std::floor(t);
  if (t >= static_cast<double>(cap)) return cap;
  // The closed form's rounding, settled against the fit itself.
  while (t + 1 <= static_cast<double>(cap) && fits(t + 1)) ++t;
  while (t > 0 && !fits(t)) --t;
  return t < 1 ? 0 : static_cast<int64_t>(t);
}

}  // namespace oomtune
