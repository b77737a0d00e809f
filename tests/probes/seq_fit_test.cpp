// The peak's fit in micro-batch and sequence length (probes/seq_fit.h),
// against points made from known coefficients: the fit must give them back,
// keep the T² term only when the points need it, and answer the budget
// questions as the closed forms do.

#include "probes/seq_fit.h"

#include <cmath>

#include <gtest/gtest.h>

#include "common/error.h"

namespace oomtune {
namespace {

constexpr double kFixed = 10 * 1048576.0;  // 10 MiB of weights and optimizer state
constexpr double kPerSample = 4096;        // a fixed-length input: 4 KiB per sample
constexpr double kPerToken = 64 * 1024;    // 64 KiB per token per sample
constexpr double kPerTokenSq = 256;        // 4 heads x 4 bytes x (scores, softmax, dropout, mask)

std::vector<SeqPoint> grid(double per_token_sq, std::vector<int64_t> batches = {1, 2, 4}) {
  std::vector<SeqPoint> points;
  for (int64_t t : {128, 256, 512})
    for (int64_t b : batches) {
      const double bt = static_cast<double>(b), tt = static_cast<double>(t);
      points.push_back({b, t, kFixed + bt * (kPerSample + kPerToken * tt + per_token_sq * tt * tt)});
    }
  return points;
}

TEST(SeqFit, GivesBackTheCoefficientsOfAQuadraticStep) {
  const SeqPeakFit fit = fit_seq_peak(grid(kPerTokenSq));
  EXPECT_TRUE(fit.quadratic);
  EXPECT_TRUE(fit.sample_term);
  EXPECT_NEAR(fit.fixed, kFixed, 1e-6 * kFixed);
  EXPECT_NEAR(fit.per_sample, kPerSample, 1e-3 * kPerSample);
  EXPECT_NEAR(fit.per_token, kPerToken, 1e-6 * kPerToken);
  EXPECT_NEAR(fit.per_token_sq, kPerTokenSq, 1e-6 * kPerTokenSq);
  EXPECT_LT(fit.max_relative_residual, 1e-9);
  // At a length it did not see.
  const double want = kFixed + 2 * (kPerSample + kPerToken * 1024 + kPerTokenSq * 1024 * 1024);
  EXPECT_NEAR(fit(2, 1024), want, 1e-6 * want);
}

TEST(SeqFit, KeepsNoT2TermALineDoesNotNeed) {
  const SeqPeakFit fit = fit_seq_peak(grid(0));
  EXPECT_FALSE(fit.quadratic);
  EXPECT_EQ(fit.per_token_sq, 0);
  EXPECT_NEAR(fit.per_token, kPerToken, 1e-6 * kPerToken);
  // A T² term too small to matter (a millionth of the probes' span) stays out too.
  EXPECT_FALSE(fit_seq_peak(grid(0.001)).quadratic);
}

TEST(SeqFit, OneMicroBatchFitsNoPerSampleTerm) {
  const SeqPeakFit fit = fit_seq_peak(grid(kPerTokenSq, {2}));
  EXPECT_FALSE(fit.sample_term);
  EXPECT_TRUE(fit.quadratic);
  // kPerSample is folded into the fixed bytes at B = 2.
  EXPECT_NEAR(fit.fixed, kFixed + 2 * kPerSample, 1e-6 * kFixed);
  EXPECT_NEAR(fit.per_token_sq, kPerTokenSq, 1e-6 * kPerTokenSq);
}

TEST(SeqFit, TwoLengthsFitALine) {
  std::vector<SeqPoint> points = grid(kPerTokenSq);
  points.erase(points.begin() + 6, points.end());  // T = 128 and 256 only
  EXPECT_FALSE(fit_seq_peak(points).quadratic);
}

TEST(SeqFit, RefusesPointsItCannotFit) {
  std::vector<SeqPoint> one_length = {{1, 128, 1e6}, {2, 128, 2e6}};
  EXPECT_THROW(fit_seq_peak(one_length), InputError);
  EXPECT_THROW(fit_seq_peak({{0, 128, 1e6}, {1, 256, 2e6}}), InputError);
  EXPECT_THROW(fit_seq_peak({{1, 128, NAN}, {1, 256, 2e6}}), InputError);
}

TEST(SeqFit, AnswersTheBudgetQuestionsInClosedForm) {
  SeqPeakFit fit;
  fit.fixed = kFixed;
  fit.per_sample = kPerSample;
  fit.per_token = kPerToken;
  fit.per_token_sq = kPerTokenSq;
  fit.quadratic = true;
  const double per_sample_at_512 = kPerSample + kPerToken * 512 + kPerTokenSq * 512 * 512;
  // 7.5 samples' worth above the fixed bytes: 7 fit.
  EXPECT_EQ(largest_micro_batch(fit, 512, kFixed + 7.5 * per_sample_at_512, 1 << 20), 7);
  EXPECT_EQ(largest_micro_batch(fit, 512, kFixed - 1, 1 << 20), 0);
  EXPECT_EQ(largest_micro_batch(fit, 512, 1e18, 64), 64);
  // fit(4, 1000) is the budget: 1000 tokens fit, 1001 do not.
  EXPECT_EQ(longest_length(fit, 4, fit(4, 1000), 1 << 24), 1000);
  EXPECT_EQ(longest_length(fit, 4, fit(4, 1001) - 1, 1 << 24), 1000);
  EXPECT_EQ(longest_length(fit, 4, fit(4, 1) - 1, 1 << 24), 0);
  // Without the T² term the answer is the line's.
  fit.per_token_sq = 0;
  EXPECT_EQ(longest_length(fit, 4, fit(4, 3000), 1 << 24), 3000);
  // A fit that does not grow with T is capped.
  fit.per_token = 0;
  EXPECT_EQ(longest_length(fit, 4, kFixed + 1e9, 1 << 24), 1 << 24);
}

}  // namespace
}  // namespace oomtune
