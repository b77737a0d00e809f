// The sequence part of a probe report (report/sequence_fit.h) rendered from
// probes made from known per-phase coefficients, so every number in it is
// computable by hand: forward = 40 MiB + B·(64 KiB·T + 256 B·T²), loss =
// 40 MiB + B·(4 KiB + 96 KiB·T), backward = 48 MiB + B·(128 KiB·T + 512
// B·T²), optimizer = 60 MiB; budget 1 GiB less 5 %. The golden file
// tests/search/golden/probe_sequence.txt was reviewed line by line against
// them; regenerate with OOMTUNE_UPDATE_GOLDEN=1 and review again before
// committing.

#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>

#include "common/byte_size.h"
#include "report/probe_summary.h"
#include "report/sequence_fit.h"
#include "support/golden_file.h"

namespace oomtune {
namespace {

double forward(double b, double t) { return 40 * kMiB + b * (65536 * t + 256 * t * t); }
double loss(double b, double t) { return 40 * kMiB + b * (4096 + 98304 * t); }
double backward(double b, double t) { return 48 * kMiB + b * (131072 * t + 512 * t * t); }
double optimizer(double, double) { return 60 * kMiB; }

SequenceFit example_fit() {
  SequenceFit fit;
  fit.length = 512;
  fit.micro_batch = 4;
  fit.usable_budget_bytes = static_cast<int64_t>(1024 * kMiB * 0.95);
  for (int64_t t : {128, 256, 512})
    for (int64_t b : {1, 2, 4}) {
      SequenceProbe p;
      p.micro_batch = b;
      p.length = t;
      const double bd = static_cast<double>(b), td = static_cast<double>(t);
      p.phase_peaks[static_cast<std::size_t>(Phase::kForward)] = forward(bd, td);
      p.phase_peaks[static_cast<std::size_t>(Phase::kLoss)] = loss(bd, td);
      p.phase_peaks[static_cast<std::size_t>(Phase::kBackward)] = backward(bd, td);
      p.phase_peaks[static_cast<std::size_t>(Phase::kOptimizer)] = optimizer(bd, td);
      fit.probes.push_back(p);
    }
  fit.events_fitted = true;
  fit.events_micro_batch = 4;
  // What a LengthModel of 2 blocks' eager attention would name at B = 4,
  // 4 heads, T = 512: 4·4·512²·4 bytes = 16 MiB a tensor.
  fit.quadratic_operators = {{"aten::softmax", Phase::kForward, 2, static_cast<int64_t>(32 * kMiB)},
                             {"aten::masked_fill", Phase::kForward, 2, static_cast<int64_t>(32 * kMiB)},
                             {"aten::_softmax_backward_data", Phase::kBackward, 2, static_cast<int64_t>(32 * kMiB)}};
  fit_sequence_phases(fit);
  answer_from_events(fit, {}, {1024});  // no events: predicted from the phase fits
  return fit;
}

TEST(SequenceReport, TextMatchesTheReviewedGoldenFile) {
  const std::string actual = render_sequence_text(example_fit());
  const auto path = std::filesystem::path(OOMTUNE_SOURCE_DIR) / "tests/search/golden/probe_sequence.txt";
  testing::expect_golden_file(path, actual);
}

// The answers, from the closed forms: at T = 512 a sample costs backward
// 128 KiB·512 + 512·512² = 192 MiB, so (972.8 - 48) / 192 = 4.8: 4 fit; at
// B = 4, backward's 4·(131072·T + 512·T²) <= 924.8 MiB gives T = 566.
TEST(SequenceReport, AnswersTheBudgetFromTheLimitingPhase) {
  const SequenceFit fit = example_fit();
  const double budget = static_cast<double>(*fit.usable_budget_bytes);
  EXPECT_EQ(fit.largest_micro_batch, static_cast<int64_t>(std::floor((budget - 48 * kMiB) / (192 * kMiB))));
  EXPECT_EQ(fit.micro_batch_limit, Phase::kBackward);
  const double a = 4 * 512.0, b = 4 * 131072.0, c = -(budget - 48 * kMiB);
  EXPECT_EQ(fit.longest_length, static_cast<int64_t>(std::floor((-b + std::sqrt(b * b - 4 * a * c)) / (2 * a))));
  EXPECT_EQ(fit.length_limit, Phase::kBackward);
  EXPECT_EQ(fit.quadratic_phases(), (std::vector<Phase>{Phase::kForward, Phase::kBackward}));
  EXPECT_NEAR(fit.predict(2, 1024), backward(2, 1024), 1e-6 * backward(2, 1024));
  ASSERT_EQ(fit.predictions.size(), 1u);
  EXPECT_NEAR(fit.predictions[0].peak_bytes, backward(4, 1024), 1e-6 * backward(4, 1024));
  EXPECT_FALSE(fit.answers_from_events);
}

TEST(SequenceReport, JsonNamesTheTermsAndTheAnswers) {
  const nlohmann::json j = sequence_fit_json(example_fit());
  EXPECT_EQ(j.at("length"), 512);
  EXPECT_EQ(j.at("quadratic_phases"), (nlohmann::json{"forward", "backward"}));
  EXPECT_EQ(j.at("phases").at("loss").at("quadratic"), false);
  EXPECT_NEAR(j.at("phases").at("loss").at("bytes_per_sample").get<double>(), 4096, 1e-3);
  EXPECT_NEAR(j.at("phases").at("forward").at("bytes_per_sample_token_squared").get<double>(), 256, 1e-6);
  EXPECT_EQ(j.at("largest_micro_batch"), 4);
  EXPECT_EQ(j.at("largest_micro_batch_limited_by"), "backward");
  EXPECT_EQ(j.at("longest_length_limited_by"), "backward");
  EXPECT_EQ(j.at("quadratic_operators").at(0).at("op"), "aten::softmax");
  EXPECT_EQ(j.at("probes").size(), 9u);
}

// A job without "seq" prints nothing of it: the probe's text and JSON stay
// as they were.
TEST(SequenceReport, AProbeWithoutSeqShowsNone) {
  ProbeSummary summary;
  summary.report.outcome = TrialOutcome::kOk;
  EXPECT_EQ(render_probe_text(summary).find("sequence"), std::string::npos);
  EXPECT_FALSE(probe_summary_json(summary).contains("sequence"));
  summary.sequence = example_fit();
  EXPECT_NE(render_probe_text(summary).find("sequence  T = 512 tokens"), std::string::npos);
  EXPECT_TRUE(probe_summary_json(summary).contains("sequence"));
}

}  // namespace
}  // namespace oomtune
