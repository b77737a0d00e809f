#pragma once
// Least-squares line through measured points, for memory and time models
// such as retained activations = a + b * batch.

#include <vector>

namespace oomtune {

/// y = intercept + slope * x, fitted by ordinary least squares.
struct LinearFit {
  double intercept = 0;              // units of y
  double slope = 0;                  // units of y per unit of x
  double max_relative_residual = 0;  // max |y_i - fit(x_i)| / |y_i| over the points
  double operator()(double x) const { return intercept + slope * x; }
};

/// Fits `ys` against `xs` (same length, at least two distinct x). Throws
/// std::invalid_argument otherwise.
LinearFit fit_line(const std::vector<double>& xs, const std::vector<double>& ys);

}  // namespace oomtune
