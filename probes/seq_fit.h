#pragma once
// A peak's bytes as a function of the micro-batch B and the sequence length
// T, fitted by least squares to probes at several (B, T) (issue #47):
//
//   peak(B, T) = fixed + per_sample·B + per_token·B·T + per_token_sq·B·T²
//
// Rules:
// - fixed: weights, gradients, optimizer state and buffers, which neither B
//   nor T changes; per_token: embeddings, projections, MLP activations and
//   logits (B·T·width); per_token_sq: eager attention's scores, their
//   softmax and dropout (B·heads·T², allocsim/length_model.h); per_sample:
//   what grows with B alone (inputs of a fixed length beside the sequence).
// - per_sample is fitted only when the probes ran at two or more
//   micro-batches (with one it cannot be told from `fixed`); per_token needs
//   two or more lengths.
// - per_token_sq is kept only where the data needs it: with three or more
//   lengths, when the fit without it misses some probe by more than
//   kSeqLinearTolerance of the probes' span. A model without attention keeps
//   a line in T; the fit says which it kept (SeqPeakFit::quadratic).
// No libtorch.

#include <cstdint>
#include <vector>

namespace oomtune {

/// The largest miss, as a fraction of the span of the probes' bytes (the
/// largest less the smallest: the part B and T change), that the fit
/// without the T² term may leave before the term is kept: 1 %. Measured
/// against the span, not the peak, so that the weights and optimizer state
/// of a large model do not hide the attention scores of short probes; 1 %
/// lies above a line's misses when a step's peak moves to another moment
/// between lengths, well below the T² part of eager attention at the
/// lengths probed (docs/sequence_length.md).
constexpr double kSeqLinearTolerance = 0.01;

/// One probe: its micro-batch, sequence length and peak.
struct SeqPoint {
  int64_t micro_batch = 0;  // COUNT: samples (B)
  int64_t length = 0;       // COUNT: tokens per sequence (T)
  double bytes = 0;         // the peak measured there (bytes)
};

/// peak(B, T) = fixed + per_sample·B + per_token·B·T + per_token_sq·B·T².
struct SeqPeakFit {
  double fixed = 0;                  // bytes
  double per_sample = 0;             // bytes per sample
  double per_token = 0;              // bytes per sample per token
  double per_token_sq = 0;           // bytes per sample per token²
  bool sample_term = false;          // per_sample was fitted (two or more micro-batches)
  bool quadratic = false;            // per_token_sq was kept (the data needs it)
  double max_relative_residual = 0;  // max |bytes - fit| / bytes over the probes
  double linear_miss = 0;            // max |bytes - line| / span of the fit without T² (what decided)
  /// Bytes at micro-batch `b` and length `t`.
  double operator()(double b, double t) const {
    return fixed + b * (per_sample + per_token * t + per_token_sq * t * t);
  }
};

/// Fits `points`; without `allow_quadratic` (the step's events show no
/// request growing with T², allocsim/length_model.h) the T² term is never
/// kept: a peak that moves between moments is a largest of lines, whose
/// bend is not a T² tensor. Throws InputError when they hold fewer than two
/// distinct lengths, a micro-batch or length < 1, or bytes that are not
/// finite.
SeqPeakFit fit_seq_peak(const std::vector<SeqPoint>& points, bool allow_quadratic = true);

/// COUNT: the largest micro-batch B >= 0 with fit(B, length) <= budget
/// (bytes); `cap` when the fit does not grow with B (or B beyond it fits).
int64_t largest_micro_batch(const SeqPeakFit& fit, int64_t length, double budget, int64_t cap);

/// COUNT: the longest length T >= 0 with fit(micro_batch, T) <= budget
/// (bytes), solving the quadratic in T; `cap` when the fit does not grow with
/// T (or T beyond it fits). 0 when nothing fits, not even T = 1.
int64_t longest_length(const SeqPeakFit& fit, int64_t micro_batch, double budget, int64_t cap);

}  // namespace oomtune
