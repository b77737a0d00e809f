// `oomtune probe` on jobs whose inputs name "seq" (issue #47): the T² term
// is found on the example GPT's eager attention (its scores and softmax
// named) and absent on a model without attention; and the fit at lengths
// 128, 256 and 512 predicts the peak at 1024, which the probes did not see,
// within 3 % of a trial run there (docs/sequence_length.md).

#include <cmath>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "job/length_distribution.h"
#include "sequence_probe.h"
#include "support/require_file.h"
#include "test_jobs.h"

namespace oomtune {
namespace {

using testing::expect_unseen_length_within;
using testing::probe_json;
using testing::RunResult;

// A language-model job on `model` with input_ids and targets ["batch",
// "seq"] in [0, 1000), next-token cross-entropy; the budget large enough
// that nothing is refused.
std::string seq_job(const std::string& name, const std::string& model, int64_t seq) {
  return testing::write_temp_file(name + ".toml",
                                  "model = \"" + model + "\"\nglobal_batch = 2\nseq = " + std::to_string(seq) + R"(
budget = "4GiB"

[[inputs]]
name = "input_ids"
shape = ["batch", "seq"]
dtype = "int64"
range = [0, 1000]

[[inputs]]
name = "targets"
shape = ["batch", "seq"]
dtype = "int64"
range = [0, 1000]

[loss]
kind = "cross_entropy"
target = "targets"
)");
}

TEST(SequenceProbe, FindsTheT2TermOfEagerAttention) {
  OOMTUNE_REQUIRE_FILE(testing::example_model("gpt_seq"));
  const auto j = probe_json(seq_job("gpt_seq_t2", testing::example_model("gpt_seq"), 64) +
                            " --fit-batches 1,2 --fit-lengths 16,32,64");
  ASSERT_TRUE(j.contains("sequence"));
  const auto& s = j.at("sequence");
  EXPECT_EQ(s.at("probes").size(), 6u);
  // Attention's scores are saved for backward and live through forward's peak.
  const auto phases = s.at("quadratic_phases").get<std::vector<std::string>>();
  EXPECT_NE(std::find(phases.begin(), phases.end(), "forward"), phases.end()) << s.dump(1);
  EXPECT_NE(std::find(phases.begin(), phases.end(), "backward"), phases.end()) << s.dump(1);
  ASSERT_TRUE(s.at("events_fitted").get<bool>());
  bool softmax = false;
  int64_t requests = 0;
  for (const auto& q : s.at("quadratic_operators")) {
    softmax = softmax || q.at("op").get<std::string>().find("softmax") != std::string::npos;
    requests += q.at("requests").get<int64_t>();
  }
  EXPECT_TRUE(softmax) << s.at("quadratic_operators").dump(1);
  EXPECT_GE(requests, 8);  // at least one scores and one softmax tensor in each of the 4 blocks
  // The answers are there, under the job's usable budget (4 GiB less 5 %).
  EXPECT_GE(s.at("largest_micro_batch").get<int64_t>(), 1);
  EXPECT_GE(s.at("longest_length").get<int64_t>(), 64);
}

TEST(SequenceProbe, FindsNoT2TermWithoutAttention) {
  OOMTUNE_REQUIRE_FILE(testing::test_model("token_mlp"));
  const auto j = probe_json(seq_job("token_mlp_t2", testing::test_model("token_mlp"), 64) +
                            " --fit-batches 1,2 --fit-lengths 16,32,64");
  ASSERT_TRUE(j.contains("sequence"));
  const auto& s = j.at("sequence");
  EXPECT_TRUE(s.at("quadratic_phases").empty()) << s.dump(1);
  EXPECT_TRUE(s.at("events_fitted").get<bool>());
  EXPECT_TRUE(s.at("quadratic_operators").empty()) << s.at("quadratic_operators").dump(1);
  for (const auto& [phase, fit] : s.at("phases").items())
    EXPECT_EQ(fit.at("bytes_per_sample_token_squared").get<double>(), 0) << phase;
}

TEST(SequenceProbe, PredictsTheGptsPeakAtAnUnseenLengthWithin3Percent) {
  OOMTUNE_REQUIRE_FILE(testing::example_model("gpt_seq"));
  expect_unseen_length_within(seq_job("gpt_seq_3pc", testing::example_model("gpt_seq"), 512),
                              "example GPT (gpt_seq.pt)", 0.03);
}

// The flags of the sequence fit name themselves when a job has no "seq".
TEST(SequenceProbe, SeqFlagsNeedASeqInput) {
  const std::string job = std::string(OOMTUNE_EXAMPLES_DIR) + "/gpt.toml";
  const RunResult seq = testing::run_oomtune("probe " + job + " --seq 128");
  EXPECT_EQ(seq.exit_code, 2);
  EXPECT_EQ(testing::last_line(seq.err), "oomtune: --seq: no input of " + job + " names \"seq\" in its shape");
  const RunResult lengths = testing::run_oomtune("probe " + job + " --fit-lengths 16,32");
  EXPECT_EQ(lengths.exit_code, 2);
  EXPECT_EQ(testing::last_line(lengths.err),
            "oomtune: --fit-lengths: no input of " + job + " names \"seq\" in its shape");
  const std::string seq_job_path = seq_job("gpt_seq_flags", testing::example_model("gpt_seq"), 64);
  const RunResult one = testing::run_oomtune("probe " + seq_job_path + " --fit-lengths 32,32");
  EXPECT_EQ(one.exit_code, 2);
  EXPECT_EQ(testing::last_line(one.err), "oomtune: --fit-lengths: the sequence fit needs two or more distinct lengths");
}

// autotune keeps the length as given: every trial at the range's max; with
// seq = [min, max] it fits the chosen configuration over lengths in the
// range and reports the longest sequence that fits, beyond the max here
// (the token MLP at 64 tokens holds a few MiB of a 24 MiB budget).
// A job whose lengths vary (seq = { min, max }): the probe fits the step at
// min, the midpoint and max, and replays --replay-steps steps at lengths
// drawn with the job's seed through the caching-allocator simulator under
// each policy (docs/sequence_length.md, "Variable lengths").
TEST(SequenceProbe, AVariableLengthJobReplaysItsDrawnLengths) {
  OOMTUNE_REQUIRE_FILE(testing::example_model("gpt_seq"));
  std::string text = testing::slurp(seq_job("gpt_seq_varlen0", testing::example_model("gpt_seq"), 64));
  text.replace(text.find("seq = 64"), 8, "seq = { min = 16, max = 64 }\nseed = 9");
  const std::string job = testing::write_temp_file("gpt_seq_varlen.toml", text);
  const auto j = probe_json(job + " --config micro_batch=2 --fit-batches 2 --replay-steps 40");
  ASSERT_TRUE(j.contains("sequence"));
  const auto& s = j.at("sequence");
  EXPECT_EQ(s.at("min_length"), 16);
  EXPECT_EQ(s.at("probes").size(), 3u);  // 16, 40, 64 at micro-batch 2
  const auto& lp = s.at("length_policies");
  ASSERT_TRUE(lp.is_object()) << s.dump(1);
  EXPECT_EQ(lp.at("distribution"), "uniform over 16 to 64 tokens");
  EXPECT_EQ(lp.at("seed"), 9);
  EXPECT_EQ(lp.at("steps"), 40);
  EXPECT_EQ(lp.at("micro_batch"), 2);
  ASSERT_EQ(lp.at("policies").size(), 5u);
  // The job's draws: padding to a power of two runs the tokens computed
  // from them here.
  const std::vector<int64_t> drawn = draw_lengths(LengthDistribution::uniform(16, 64), 40, 9);
  double tokens = 0, padded = 0;
  for (int64_t t : drawn) {
    tokens += static_cast<double>(t);
    padded += t <= 16 ? 16 : t <= 32 ? 32 : 64;
  }
  const auto& power_of_two = lp.at("policies").at(4);
  EXPECT_EQ(power_of_two.at("name"), "padded to a power of two");
  EXPECT_NEAR(power_of_two.at("padded_tokens_ratio").get<double>(), padded / tokens, 1e-12);
  // As drawn, the replay's peak allocated is the step at the longest drawn
  // length: at most the trial's measured peak at 64 (plus the allocator's
  // 512-byte rounding), and close to it (weights and AdamW state dominate).
  const auto& as_drawn = lp.at("policies").at(0);
  EXPECT_EQ(as_drawn.at("reserved_bytes_after_each_step").size(), 40u);
  const double measured = testing::measured_peak(j);
  const double allocated = as_drawn.at("peak_allocated_bytes").get<double>();
  EXPECT_LE(allocated, measured * 1.01);
  EXPECT_GE(allocated, measured * 0.9);
  EXPECT_GE(as_drawn.at("peak_reserved_bytes").get<double>(), allocated);
}

// A plan verified at another length (autotune --seq 32) probes at it, and
// says so; the same run as --seq 32 on the job.
TEST(SequenceProbe, APlanRunsAtTheLengthItWasVerifiedAt) {
  OOMTUNE_REQUIRE_FILE(testing::example_model("gpt_seq"));
  const std::string job = seq_job("gpt_seq_plan", testing::example_model("gpt_seq"), 64);
  const std::string plan = testing::write_temp_file(
      "gpt_seq_plan.plan.toml",
      "[job]\nspec = \"" + job +
          "\"\nglobal_batch = 2\nseq = 32\n\n[config]\nmicro_batch = 2\naccumulation_steps = 1\n");
  const RunResult from_plan = testing::run_oomtune("probe --plan " + plan + " --no-fit --json");
  ASSERT_EQ(from_plan.exit_code, 0) << from_plan.err;
  EXPECT_NE(from_plan.err.find("was verified at seq = 32, not " + job + "'s 64: probing the plan's"), std::string::npos)
      << from_plan.err;
  const auto at_32 = probe_json(job + " --seq 32 --config micro_batch=2 --no-fit");
  const auto at_64 = probe_json(job + " --config micro_batch=2 --no-fit");
  // Backward's peak grows with T (the step's peak is the optimizer's here).
  const auto backward = [](const nlohmann::json& j) {
    return j.at("report").at("phases").at("backward").at("peak_bytes").get<int64_t>();
  };
  const auto planned = nlohmann::json::parse(from_plan.out);
  EXPECT_EQ(backward(planned), backward(at_32));
  EXPECT_LT(backward(planned), backward(at_64));
}

TEST(SequenceProbe, AutotuneKeepsTheLengthAndReportsTheLongestThatFits) {
  OOMTUNE_REQUIRE_FILE(testing::test_model("token_mlp"));
  std::string job = seq_job("token_mlp_range", testing::test_model("token_mlp"), 64);
  const RunResult r = testing::run_oomtune("autotune " + job + " --json --batch 8 --budget 24MiB");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The fixed length: kept, no fit.
  const auto fixed = nlohmann::json::parse(r.out).at("sequence");
  EXPECT_EQ(fixed.at("length"), 64);
  EXPECT_TRUE(fixed.at("min_length").is_null());
  EXPECT_FALSE(fixed.contains("longest_length"));
  // A range: kept at its max, the longest sequence fitted.
  std::string text = testing::slurp(job);
  text.replace(text.find("seq = 64"), 8, "seq = [16, 64]");
  job = testing::write_temp_file("token_mlp_range2.toml", text);
  const RunResult ranged = testing::run_oomtune("autotune " + job + " --json --batch 8 --budget 24MiB");
  ASSERT_EQ(ranged.exit_code, 0) << ranged.err;
  const auto s = nlohmann::json::parse(ranged.out).at("sequence");
  EXPECT_EQ(s.at("length"), 64);
  EXPECT_EQ(s.at("min_length"), 16);
  EXPECT_TRUE(s.at("length_kept").get<bool>());
  EXPECT_GT(s.at("longest_length").get<int64_t>(), 64);
  EXPECT_EQ(s.at("fit").at("probes").size(), 3u);  // 16, 40, 64
  EXPECT_TRUE(s.at("fit").at("quadratic_phases").empty());
}

// With a length distribution, autotune's trials run their warm-up and
// measured step at its max and their later steps at the lengths drawn with
// the job's seed: every probe the same lengths at the same step index, and
// every verification (verify_steps steps) too, so their times compare
// (trial/trial_runner.cpp, Note [Variable-length steps]). The JSON says so.
TEST(SequenceProbe, AutotuneVerifiesAtTheDrawnLengths) {
  OOMTUNE_REQUIRE_FILE(testing::test_model("token_mlp"));
  std::string text = testing::slurp(seq_job("token_mlp_drawn", testing::test_model("token_mlp"), 64));
  text.replace(text.find("seq = 64"), 8,
               "seq = { min = 16, max = 64, distribution = \"uniform\" }\nverify_steps = 6\nseed = 5");
  const std::string job = testing::write_temp_file("token_mlp_drawn2.toml", text);
  const RunResult r = testing::run_oomtune("autotune " + job + " --json --batch 8 --budget 24MiB");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& s = j.at("sequence");
  EXPECT_EQ(s.at("length"), 64);
  EXPECT_EQ(s.at("distribution"), nlohmann::json({{"distribution", "uniform"}, {"min", 16}, {"max", 64}, {"seed", 5}}));
  // steps 1 and 2 at the max, then the n first lengths drawn with seed 5
  const auto lengths_of = [](std::size_t steps) {
    std::vector<int64_t> lengths = {64, 64};
    for (int64_t t : draw_lengths(LengthDistribution::uniform(16, 64), static_cast<int64_t>(steps) - 2, 5))
      lengths.push_back(t);
    return lengths;
  };
  const auto verified = s.at("verification_step_lengths").get<std::vector<int64_t>>();
  EXPECT_EQ(verified, lengths_of(6));
  EXPECT_EQ(j.at("chosen").at("verification").at("step_lengths").get<std::vector<int64_t>>(), verified);
  for (const auto& node : j.at("trail")) {
    if (!node.contains("verification") || node.at("verification").at("outcome") != "ok") continue;
    EXPECT_EQ(node.at("verification").at("step_lengths").get<std::vector<int64_t>>(), verified);
  }
  ASSERT_FALSE(j.at("probes").empty());
  for (const auto& probe : j.at("probes")) {
    if (probe.at("outcome") != "ok") continue;
    const auto run = probe.at("step_lengths").get<std::vector<int64_t>>();
    EXPECT_EQ(run, lengths_of(run.size())) << probe.at("config");
    EXPECT_EQ(probe.at("steps_run").get<std::size_t>(), run.size());
  }
  // The chosen configuration's fit over the range still runs at 16, 40, 64 alone.
  EXPECT_EQ(s.at("fit").at("probes").size(), 3u);
}

}  // namespace
}  // namespace oomtune
