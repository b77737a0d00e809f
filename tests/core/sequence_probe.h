#pragma once
// Probing a job whose inputs name "seq" through the oomtune binary, and
// checking the sequence fit's prediction at a length it did not see
// (sequence_probe_test.cpp; lora_fixture_test.cpp for the LoRA fixture).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_oomtune.h"

namespace oomtune::testing {

/// `oomtune probe ARGS --json`, parsed; null (and a failure) when it fails.
inline nlohmann::json probe_json(const std::string& args) {
  const RunResult r = run_oomtune("probe " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

/// Bytes: the peak at micro-batch `b` and length `t` that the probe JSON's
/// "sequence" fit predicts: its largest phase.
inline double predicted_peak(const nlohmann::json& sequence, double b, double t) {
  double peak = 0;
  for (const auto& [phase, f] : sequence.at("phases").items())
    peak = std::max(peak,
                    f.at("fixed_bytes").get<double>() +
                        b * (f.at("bytes_per_sample").get<double>() + t * f.at("bytes_per_sample_token").get<double>() +
                             t * t * f.at("bytes_per_sample_token_squared").get<double>()));
  return peak;
}

/// Bytes: a probe's measured step peak over its phases (on the CPU the
/// allocated bytes the fit's probes give too; kernel scratch apart).
inline double measured_peak(const nlohmann::json& probe) {
  double peak = 0;
  for (const char* phase : {"forward", "loss", "backward", "optimizer"})
    peak = std::max(peak, probe.at("report").at("phases").at(phase).at("peak_bytes").get<double>());
  return peak;
}

/// Probes `job` (a TOML path) at lengths 128, 256, 512 and micro-batches 1
/// and 2, with a prediction at length 1024 and micro-batch 2, runs a trial
/// there, and expects the probe's prediction (the step's events replayed)
/// within `tolerance` (a fraction of the measured peak). Prints it, the
/// phase fits' own prediction (predicted_peak) and their errors.
inline void expect_unseen_length_within(const std::string& job, const std::string& what, double tolerance) {
  const auto fit = probe_json(job + " --seq 512 --config micro_batch=2 --fit-batches 1,2 --fit-lengths 128,256,512 " +
                              "--predict-lengths 1024");
  ASSERT_TRUE(fit.contains("sequence"));
  const auto run = probe_json(job + " --seq 1024 --config micro_batch=2 --no-fit");
  ASSERT_TRUE(run.contains("report"));
  const auto& s = fit.at("sequence");
  ASSERT_TRUE(s.at("answers_from_events").get<bool>());
  ASSERT_EQ(s.at("predictions").size(), 1u);
  const double predicted = s.at("predictions").at(0).at("peak_bytes");
  const double from_fits = predicted_peak(s, 2, 1024);
  EXPECT_NEAR(s.at("predictions").at(0).at("fit_peak_bytes").get<double>(), from_fits, 1e-6 * from_fits);
  const double measured = measured_peak(run);
  const double error = (predicted - measured) / measured, fits_error = (from_fits - measured) / measured;
  std::printf(
      "%s: T = 1024, micro-batch 2: measured %.0f bytes; predicted %.0f (events replayed, error %+.3f %%), phase "
      "fits %.0f (error %+.3f %%)\n",
      what.c_str(), measured, predicted, 100 * error, from_fits, 100 * fits_error);
  EXPECT_LT(std::fabs(error), tolerance) << what << ": predicted " << predicted << ", measured " << measured;
}

}  // namespace oomtune::testing
