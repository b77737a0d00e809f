// The autotune report rendered from a search against the fake device
// (fake_runner.h), whose curves make every number in it computable by hand.
// The golden file tests/search/golden/<case>.txt was reviewed line by line
// against those curves; regenerate with OOMTUNE_UPDATE_GOLDEN=1 and review
// again before committing.

#include "report/autotune_report.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "common/byte_size.h"
#include "fake_runner.h"
#include "search/model_fit.h"
#include "support/golden_file.h"

namespace oomtune {
namespace {

const std::filesystem::path kGoldenDir = std::filesystem::path(OOMTUNE_SOURCE_DIR) / "tests/search/golden";

void expect_golden(const std::string& name, const std::string& actual) {
  testing::expect_golden_file(kGoldenDir / (name + ".txt"), actual);
}

// The report of a search for `job` against `fake`.
AutotuneReport report_of(FakeRunner& fake, const JobSpec& job) {
  AutotuneReport report;
  report.job_path = "job.toml";
  report.job = job;
  report.search = run_search(fake, report.job);
  return report;
}

// The budget of DecisionTree.AccumulationFindsTheOraclesLargestMicroBatch:
// plain at 8 x 4 is chosen; the trail holds names and configurations of
// different lengths. A CUDA job, on a fake GPU whose caching allocator
// reserves exactly what its tensors hold: the reserved columns are its bytes.
AutotuneReport accumulation_report() {
  FakeRunner fake;
  fake.gpu_reserved_extra = 0;
  JobSpec job = job_with_budget(plain_peak(8) + 4 * kMiB + kMiB);
  job.device = Device::kCuda;
  return report_of(fake, job);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(AutotuneReport, TextMatchesTheReviewedGoldenFile) {
  expect_golden("accumulation", render_autotune_text(accumulation_report()));
}

// The plain lines are fitted to the plain probes only (4, 8, 16), not to
// every probe the search ran (checkpointing, 8-bit, offload, bf16 too).
TEST(AutotuneReport, NamesTheProbesThePlainLinesWereFittedTo) {
  const AutotuneReport report = accumulation_report();
  EXPECT_GT(report.search.probes.size(), 3u);
  const std::string text = render_autotune_text(report);
  EXPECT_NE(text.find("(both fitted to the plain probes at micro-batch 4, 8, 16)"), std::string::npos) << text;
  const nlohmann::json j = autotune_json(report);
  EXPECT_EQ(j.at("baseline_model").at("micro_batches"), nlohmann::json::array({4, 8, 16}));
  // plain peak(b) = 18 MiB + 8 MiB b, time(b) = 0.01 s + 0.002 s b.
  EXPECT_NEAR(j.at("baseline_model").at("peak_intercept_bytes").get<double>(), 18.0 * kMiB, 1.0);
  EXPECT_NEAR(j.at("baseline_model").at("peak_bytes_per_sample").get<double>(), 8.0 * kMiB, 1.0);
  EXPECT_NEAR(j.at("baseline_model").at("seconds_intercept").get<double>(), 0.01, 1e-9);
  EXPECT_NEAR(j.at("baseline_model").at("seconds_per_sample").get<double>(), 0.002, 1e-9);
}

// Every cell of a column starts at the header's column, however long the
// node names and configurations before it are.
// A job that freezes parameters: the header names both counts and the
// job's globs; the JSON carries the frozen count (0 for the others).
TEST(AutotuneReport, AFrozenJobNamesItsTrainableSet) {
  AutotuneReport report = accumulation_report();
  EXPECT_EQ(autotune_json(report).at("frozen_parameter_count"), 0);
  report.search.frozen_parameter_count = 651904;
  report.job.trainable = {ParameterSelection::Rule::kTrainable, {"*.lora_A.*", "*.lora_B.*"}, false};
  const std::vector<std::string> lines = lines_of(render_autotune_text(report));
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], "autotune  " + report.job.model_path + "  (" + std::to_string(report.search.parameter_count) +
                          " trainable + 651904 frozen parameters: trainable = [\"*.lora_A.*\", \"*.lora_B.*\"])");
  EXPECT_EQ(autotune_json(report).at("frozen_parameter_count"), 651904);
}

TEST(AutotuneReport, TrailColumnsLineUp) {
  const std::vector<std::string> lines = lines_of(render_autotune_text(accumulation_report()));
  std::size_t header = 0;
  while (header < lines.size() && lines[header].rfind("# ", 0) != 0) ++header;
  ASSERT_LT(header, lines.size());
  const std::size_t fits_end = lines[header].find("fits") + 4;
  const std::size_t note_at = lines[header].find("note");
  std::size_t rows = 0;
  for (std::size_t i = header + 1; i < lines.size() && !lines[i].empty(); ++i, ++rows) {
    const std::string& row = lines[i];
    ASSERT_GE(row.size(), note_at) << row;
    // "fits" column: right-aligned verdict ending where the header ends.
    const std::string verdict = row.substr(0, fits_end);
    EXPECT_TRUE(verdict.size() >= 5 &&
                (verdict.substr(verdict.size() - 3) == "yes" || verdict.substr(verdict.size() - 5) == "pred." ||
                 verdict.substr(verdict.size() - 2) == "no"))
        << row;
    EXPECT_EQ(row.substr(fits_end, note_at - fits_end), std::string(note_at - fits_end, ' ')) << row;
    EXPECT_NE(row[note_at], ' ') << row;
  }
  EXPECT_GE(rows, 5u);
}

// Verification runs that all time out (fake device 100x slower: plain
// 32 x 1, the fastest candidate, takes 0.074 x 100 = 7.4 s per global batch,
// over a 5 s limit): the report says what ended them and what the fastest
// needs, 20 steps x 7.4 s = 148 s, and prints no "nothing fits" and no ZeRO
// table (the command leaves nothing_fits empty here).
TEST(AutotuneReport, VerificationsThatTimedOutAreNotNothingFits) {
  FakeRunner fake;
  fake.time_scale = 100;
  fake.verify_timeout_seconds = 5;
  JobSpec job = job_with_budget(plain_peak(32) + kMiB);
  job.trial_timeout_seconds = 5;
  const AutotuneReport report = report_of(fake, job);
  ASSERT_FALSE(report.search.chosen.has_value());
  // All 9 nodes are predicted to fit (the largest, plain 32 x 1, at 274 MiB);
  // 3 verification slots + 3 extra ones for failures run 6, leaving 3.
  ASSERT_EQ(report.search.trail.size(), 9u);
  ASSERT_EQ(report.search.verification_trials, 6);
  const std::string text = render_autotune_text(report);
  EXPECT_NE(text.find("\nnot verified: the verification runs of 6 configurations predicted to fit ended without a "
                      "measurement (6 timeout), so whether they fit is unknown; the notes say what ended each\n"
                      "          3 more predicted to fit were not run: --max-verifications N runs more\n"
                      "          a verification runs 20 steps of the global batch: the fastest of these is predicted "
                      "at 7.40 s per step, 148 s in all plus start-up; trial_timeout is 5 s: raise it\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("nothing fits"), std::string::npos) << text;
  const nlohmann::json j = autotune_json(report);
  EXPECT_EQ(j.at("unverified").size(), 6u);
  EXPECT_EQ(j.at("unverified")[0].at("verification").at("outcome"), "timeout");
  EXPECT_EQ(j.at("trial_timeout_seconds"), 5.0);
  EXPECT_FALSE(j.contains("nothing_fits"));
  // The keys are there when a configuration was chosen too.
  const nlohmann::json chosen = autotune_json(accumulation_report());
  EXPECT_EQ(chosen.at("unverified"), nlohmann::json::array());
  EXPECT_EQ(chosen.at("trial_timeout_seconds"), 600.0);
}

// The rescue of DecisionTree.WhenPlainRunsAtNoMicroBatchTheSimplestStrategyThatRunsBecomesTheBase:
// the model lines name the base the search built on, and so does every node
// built on it; the other single strategies that ran at micro-batch 1 (8-bit
// AdamW 12 + 8 b MiB, offload 10 + 8 b MiB, + 4 MiB of gradients when
// accumulating: both 1 x 32) are nodes named for themselves.
TEST(AutotuneReport, ARescuedSearchNamesItsBase) {
  FakeRunner fake;
  fake.probe_budget = 25 * kMiB;
  const AutotuneReport report = report_of(fake, job_with_budget(25 * kMiB));
  expect_golden("rescue", render_autotune_text(report));
  const nlohmann::json j = autotune_json(report);
  EXPECT_EQ(j.at("baseline_model").at("configuration"), "checkpointing (all blocks)");
  EXPECT_TRUE(j.at("least_memory_failure").is_null());
}

// The one-point base of DecisionTree.AOnePointBaseTakesTheSlopeOfItsRetainedActivations
// (checkpointing rescued at micro-batch 1: 18 + 6 b MiB, its micro-batch
// (0.01 + 0.002) x 1.6 = 0.0192 s, the optimizer step 0.005 s): the model
// lines say that the slope is a lower bound and that the time was measured
// at one size, instead of a fitted "+ 0 s per sample".
TEST(AutotuneReport, AOnePointBaseSaysWhatItsLinesCannotKnow) {
  FakeRunner fake = one_point_base_fake();
  fake.optimizer_seconds = 0.005;
  const AutotuneReport report = report_of(fake, job_with_budget(kOnePointBudget));
  ASSERT_EQ(report.search.baseline_micro_batches, (std::vector<int64_t>{1}));
  const std::vector<std::string> lines = lines_of(render_autotune_text(report));
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines[2],
            "model     checkpointing (all blocks) peak = 18.00 MiB + 6.00 MiB per sample (the slope of its "
            "retained activations, a lower bound)");
  EXPECT_EQ(lines[3],
            "          checkpointing (all blocks) step = 0.0192 s per micro-batch, + 0.00500 s per optimizer "
            "step (measured at micro-batch 1 only: larger micro-batches are predicted as fast, an upper "
            "bound on their speed)");
}

// Backward's activation line (memory_model.cpp, Note [Backward activation
// peak]) under a flat peak line, 46 MiB: 28 + 2 b MiB passes it after
// b = 9 (28 + 18 = 46), so the report names it when the job allows
// micro-batches of 10 and more, and not when it allows 8 at most (44 MiB).
TEST(AutotuneReport, BackwardsActivationLineIsShownWhereItPassesThePeakLine) {
  AutotuneReport report = accumulation_report();
  report.search.baseline_peak = {46.0 * kMiB, 0};
  report.search.baseline_backward_activation = {28.0 * kMiB, 2.0 * kMiB};
  report.job.max_micro_batch = 16;
  std::vector<std::string> lines = lines_of(render_autotune_text(report));
  ASSERT_GE(lines.size(), 5u);
  EXPECT_EQ(lines[2], "model     plain peak = 46.00 MiB + 0 B per sample");
  EXPECT_EQ(lines[3],
            "          plain backward's activation peak = 28.00 MiB + 2.00 MiB per sample, above that line "
            "from micro-batch 10");
  EXPECT_EQ(lines[4].rfind("          plain step = ", 0), 0u) << lines[4];
  report.job.max_micro_batch = 8;
  lines = lines_of(render_autotune_text(report));
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines[3].rfind("          plain step = ", 0), 0u) << lines[3];
  const nlohmann::json model = autotune_json(report).at("baseline_model");
  EXPECT_EQ(model.at("backward_activation_intercept_bytes").get<double>(), 28.0 * kMiB);
  EXPECT_EQ(model.at("backward_activation_bytes_per_sample").get<double>(), 2.0 * kMiB);
}

// The chosen configuration's verification run says what its CPU kernels
// kept for themselves, apart from its measured peak; a run without any
// says nothing (the golden file above).
TEST(AutotuneReport, TheChosenRunsKernelScratchIsALineOfItsOwn) {
  AutotuneReport report = accumulation_report();
  ASSERT_TRUE(report.search.chosen.has_value());
  ProbeReport& run = *report.search.trail[*report.search.chosen].verification;
  run.kernel_scratch = {3 * kMiB / 2, 12, 6 * kMiB, "AddmmBackward0 > aten::mm", run.peak_bytes + kMiB, 0};
  const std::vector<std::string> lines = lines_of(render_autotune_text(report));
  const auto scratch = std::find_if(lines.begin(), lines.end(), [](const std::string& line) {
    return line.rfind("          kernel scratch ", 0) == 0;
  });
  ASSERT_NE(scratch, lines.end()) << render_autotune_text(report);
  EXPECT_EQ(*scratch, fmt::format("          kernel scratch 1.50 MiB at most at once, by AddmmBackward0 > aten::mm (12 "
                                  "allocations); CPU only, not counted toward a CUDA prediction; with it the CPU "
                                  "held {} at most",
                                  format_bytes(run.peak_bytes + kMiB)));
  EXPECT_EQ(autotune_json(report).at("chosen").at("verification").at("kernel_scratch").at("peak_bytes"), 3 * kMiB / 2);
}

// A CPU job's fit counts tensors; its chosen run says what a CUDA run of
// the same allocations would reserve against the budget, from its
// verification's prediction (docs/autotune.md, "The budget on each
// device"). A CUDA job's report, whose budget was on reserved bytes, does not.
TEST(AutotuneReport, ACpuJobsChosenRunSaysWhatACudaRunWouldReserve) {
  AutotuneReport report = accumulation_report();
  report.job.device = Device::kCpu;
  report.search.budget_on_reserved = false;
  ASSERT_TRUE(report.search.chosen.has_value());
  ProbeReport& run = *report.search.trail[*report.search.chosen].verification;
  run.reserved = ReservedPrediction{};
  run.reserved->peak_reserved_bytes = run.peak_bytes + 70 * kMiB;
  run.reserved->budget_bytes = report.search.usable_budget_bytes;
  run.reserved->fits_budget = false;
  run.reserved->failed_request_bytes = 32 * kMiB;
  run.reserved->failed_phase = Phase::kBackward;
  const std::string expected = fmt::format(
      "\n          on CUDA (sm90): {} reserved (predicted) is over the usable {}: capped there the caching "
      "allocator runs out of memory at a 32.00 MiB request during backward\n",
      format_bytes(run.peak_bytes + 70 * kMiB), format_bytes(report.search.usable_budget_bytes));
  EXPECT_NE(render_autotune_text(report).find(expected), std::string::npos) << render_autotune_text(report);
  report.search.budget_on_reserved = true;
  EXPECT_EQ(render_autotune_text(report).find("on CUDA (sm90)"), std::string::npos);
}

// A chosen offload timed on the CPU backend, where the host is the device's
// own memory, says what a GPU adds: the gradients to the host and the
// parameters back, 2 x 4 MiB of fp32 gradients = 8 MiB a step, at least
// 8388608 B / (32e9 x 16 / 8 x 128 / 130 B/s) = 0.000133 s over PCIe 5.0
// x16. A CUDA job measured those copies, and a run without offload makes
// none: neither says it.
TEST(AutotuneReport, AChosenOffloadTimedOnTheCpuSaysWhatAGpuCopies) {
  AutotuneReport report = accumulation_report();
  report.job.device = Device::kCpu;
  ASSERT_TRUE(report.search.chosen.has_value());
  TrailNode& chosen = report.search.trail[*report.search.chosen];
  chosen.verification->static_memory.gradient_bytes = 4 * kMiB;
  const std::string line =
      "          offload on a GPU also copies 8.00 MiB a step over PCIe (the gradients to the host, the parameters "
      "back: at least 0.000133 s at PCIe 5.0 x16's 63 GB/s) and updates on the host's CPU; not in this time, "
      "measured where the host is the device's own memory";
  const auto has_line = [&] {
    const std::vector<std::string> lines = lines_of(render_autotune_text(report));
    return std::find(lines.begin(), lines.end(), line) != lines.end();
  };
  EXPECT_FALSE(has_line()) << "no offload, no copies";
  chosen.config.offload_optimizer = true;
  EXPECT_TRUE(has_line()) << render_autotune_text(report);
  report.job.device = Device::kCuda;
  EXPECT_FALSE(has_line()) << "a GPU's run measured its copies";
}

// Offload keeps its fp32 masters, gradients and state on the host (Note
// [Host budget]): a chosen offload says how much host memory its run held,
// and the margin to a host budget where the job gives one; a job with a
// host budget says it under the device's budget, whatever is chosen.
TEST(AutotuneReport, TheChosenConfigurationsHostMemoryIsShownWhereItMatters) {
  AutotuneReport report = accumulation_report();
  ASSERT_TRUE(report.search.chosen.has_value());
  TrailNode& chosen = report.search.trail[*report.search.chosen];
  chosen.verification->host_peak_bytes = 64 * kMiB;
  const auto lines = [&] { return lines_of(render_autotune_text(report)); };
  const auto has = [&](const std::string& line) {
    const std::vector<std::string> all = lines();
    return std::find(all.begin(), all.end(), line) != all.end();
  };
  for (const std::string& line : lines()) EXPECT_EQ(line.find("host"), std::string::npos) << "no offload: " << line;
  chosen.config.offload_optimizer = true;
  EXPECT_TRUE(
      has("          host memory 64.00 MiB at its peak; no host budget to check it against (host_budget, "
          "--host-budget)"))
      << render_autotune_text(report);
  report.job.host_budget_bytes = 100 * kMiB;
  report.job.headroom = 0.1;  // 90 MiB usable
  EXPECT_TRUE(
      has("host      100.00 MiB (90.00 MiB usable after 10 % headroom) for optimizer offload's fp32 "
          "masters, gradients and state"))
      << render_autotune_text(report);
  EXPECT_TRUE(has("          host memory 64.00 MiB at its peak; margin 26.00 MiB to the usable host budget"));
  report.job.host_budget_is_machines = true;  // a CUDA job's default (default_host_budget)
  EXPECT_TRUE(
      has("host      100.00 MiB (90.00 MiB usable after 10 % headroom; this machine's memory: host_budget "
          "sets another) for optimizer offload's fp32 masters, gradients and state"))
      << render_autotune_text(report);
  const nlohmann::json json = autotune_json(report);
  EXPECT_EQ(json.at("host_budget_bytes"), 100 * kMiB);
  EXPECT_EQ(json.at("usable_host_budget_bytes"), 90 * kMiB);
}

// On a GPU the budget caps the caching allocator's reserved bytes
// (probes/cuda_budget.h), so a CUDA job's verified runs are held, shown and
// given their margin by what they reserved, not by their tensors: the fake
// GPU reserves 512 KiB above what its tensors hold, and plain at 8 x 4
// (tensors 86 MiB) still fits the 87 MiB budget, by 512 KiB.
TEST(AutotuneReport, ACudaJobsVerifiedRunsAreHeldByWhatTheyReserved) {
  FakeRunner fake;
  fake.gpu_reserved_extra = 512 * 1024;
  JobSpec job = job_with_budget(plain_peak(8) + 4 * kMiB + kMiB);
  job.device = Device::kCuda;
  const AutotuneReport report = report_of(fake, job);
  ASSERT_TRUE(report.search.chosen.has_value());
  const TrailNode& chosen = report.search.trail[*report.search.chosen];
  EXPECT_EQ(to_string(chosen.config), "micro_batch=8,accum=4,ckpt=none,optimizer=adamw,offload=off,precision=fp32");
  const int64_t tensors = plain_peak(8) + 4 * kMiB, reserved = tensors + 512 * 1024;
  EXPECT_EQ(budgeted_peak_bytes(*chosen.verification, true), reserved);
  EXPECT_EQ(budgeted_peak_bytes(*chosen.verification, false), tensors);
  const std::string text = render_autotune_text(report);
  const std::vector<std::string> lines = lines_of(text);
  const auto has = [&](const std::string& line) { return std::find(lines.begin(), lines.end(), line) != lines.end(); };
  EXPECT_TRUE(
      has("          measured peak 86.00 MiB of tensors, 86.50 MiB reserved over 20 steps in a fresh "
          "process; margin 512.00 KiB to the usable budget"))
      << text;
  EXPECT_NE(text.find("meas. reserved"), std::string::npos) << text;
  EXPECT_NE(text.find("86.50 MiB  0."), std::string::npos) << text;  // the chosen row's measured column
  EXPECT_NE(text.find("chosen: fastest verified, 307.7 samples/s, 512.00 KiB below the budget"), std::string::npos)
      << text;
  // The same run on the CPU: its tensors are what the budget holds.
  AutotuneReport cpu = report;
  cpu.search.budget_on_reserved = false;
  const std::vector<std::string> cpu_lines = lines_of(render_autotune_text(cpu));
  EXPECT_NE(std::find(cpu_lines.begin(), cpu_lines.end(),
                      "          measured peak 86.00 MiB over 20 steps in a fresh process; margin 1.00 MiB to the "
                      "usable budget"),
            cpu_lines.end());
}

// A job with a length distribution (issue #47 item 2): the sequence line
// says which steps ran at drawn lengths, the chosen run's lines which
// lengths its verification drew, and the JSON carries the distribution and
// the verification's lengths.
TEST(AutotuneReport, AVerificationAtDrawnLengthsSaysSo) {
  AutotuneReport report = accumulation_report();
  ASSERT_TRUE(report.search.chosen.has_value());
  report.job.seq_len = 64;
  report.job.seq_min = 16;
  report.job.seq_lengths = LengthDistribution::uniform(16, 64);
  report.job.seed = 3;
  report.sequence = AutotuneSequence{64, 16, std::nullopt, "not fitted here"};
  ProbeReport& run = *report.search.trail[*report.search.chosen].verification;
  run.step_lengths = {64, 64, 30, 50, 40};
  const std::string text = render_autotune_text(report);
  const std::vector<std::string> lines = lines_of(text);
  const auto has = [&](const std::string& line) { return std::find(lines.begin(), lines.end(), line) != lines.end(); };
  EXPECT_TRUE(
      has("          verified at lengths drawn from uniform over 16 to 64 tokens (seed 3): steps 3 to 5 at 30 "
          "to 50 tokens (mean 40), steps 1 and 2 at the longest, 64; the time is the mean over the drawn "
          "steps"))
      << text;
  EXPECT_TRUE(
      has("sequence  every trial's warm-up and measured step at T = 64 tokens, the longest of uniform over 16 "
          "to 64 tokens; their later steps and the verification runs at lengths drawn from it (seed 3); the "
          "length stays as given"))
      << text;
  const nlohmann::json j = autotune_json(report);
  const nlohmann::json& d = j.at("sequence").at("distribution");
  EXPECT_EQ(d.at("distribution"), "uniform");
  EXPECT_EQ(d.at("min"), 16);
  EXPECT_EQ(d.at("max"), 64);
  EXPECT_EQ(d.at("seed"), 3);
  EXPECT_EQ(j.at("sequence").at("verification_step_lengths"), nlohmann::json({64, 64, 30, 50, 40}));
  EXPECT_EQ(j.at("chosen").at("verification").at("step_lengths"), nlohmann::json({64, 64, 30, 50, 40}));

  // A histogram names its file and how many lengths it holds.
  report.job.seq_lengths = LengthDistribution::histogram({10, 30, 20});
  report.job.seq_lengths_file = "lengths.txt";
  const std::string histogram = render_autotune_text(report);
  EXPECT_NE(histogram.find("verified at lengths drawn from the histogram in lengths.txt (3 lengths, 10 to 30 tokens) "
                           "(seed 3)"),
            std::string::npos)
      << histogram;
  const nlohmann::json h = autotune_json(report).at("sequence").at("distribution");
  EXPECT_EQ(h.at("distribution"), "histogram");
  EXPECT_EQ(h.at("file"), "lengths.txt");
  EXPECT_EQ(h.at("observed_lengths"), 3);

  // Without a distribution, no such line.
  report.job.seq_lengths.reset();
  EXPECT_EQ(render_autotune_text(report).find("verified at lengths drawn"), std::string::npos);
  EXPECT_FALSE(autotune_json(report).at("sequence").contains("distribution"));
}

// Plain and the least-memory combination out of memory at micro-batch 1
// (fake guard 11 MiB): "nothing fits" is measured, there is no model and no
// trail, and the ZeRO table (the command's) is said to be a lower bound.
TEST(AutotuneReport, NothingFitsMeasuredWhenEvenTheLeastMemoryCombinationRanOut) {
  FakeRunner fake;
  fake.probe_budget = 11 * kMiB;
  AutotuneReport report = report_of(fake, job_with_budget(5 * kMiB));
  report.nothing_fits = NothingFits{"<zero table>\n", nlohmann::json::object()};
  const std::vector<std::string> lines = lines_of(render_autotune_text(report));
  ASSERT_GE(lines.size(), 8u);
  EXPECT_EQ(lines[2], "model     none: no configuration ran at micro-batch 1");
  EXPECT_EQ(lines[3], "");
  EXPECT_EQ(lines[4],
            "nothing fits: plain and even the configuration that needs the least memory (checkpointing "
            "(all blocks) + optimizer offload) ran out of memory at micro-batch 1 (measured: oomtune "
            "budget: tried to allocate); the usable budget is 5.00 MiB");
  EXPECT_EQ(lines[5], "<zero table>");
  EXPECT_EQ(lines[6],
            "          activations were never measured (nothing ran), so the table counts none: its "
            "totals are lower bounds");
  EXPECT_EQ(lines.back(), "trials    4 probes + 0 verification runs");
  const nlohmann::json j = autotune_json(report);
  EXPECT_EQ(j.at("least_memory_failure"), report.search.least_memory_failure);
  EXPECT_EQ(j.at("trail"), nlohmann::json::array());
}

// Every verification over the budget (1 GiB more than predicted): the
// answer says where the runs ran out, from their outcomes: all in their
// first step (the fake's), one after two steps, or none out of memory but
// each finished above the budget.
TEST(AutotuneReport, VerificationsOverTheBudgetSayWhereTheyRanOut) {
  FakeRunner fake;
  fake.verification_growth = 1024 * kMiB;
  AutotuneReport report = report_of(fake, job_with_budget(plain_peak(8) + kMiB));
  const auto answer = [&report] {
    for (const std::string& line : lines_of(render_autotune_text(report)))
      if (line.rfind("nothing verified to fit: ", 0) == 0) return line;
    return std::string("(no answer)");
  };
  EXPECT_NE(answer().find("of 20 steps (down to micro-batch 2): no run got past its first step, so the memory model "
                          "is low for this job"),
            std::string::npos)
      << answer();
  std::vector<ProbeReport*> runs;
  for (TrailNode& node : report.search.trail)
    if (node.verification && node.verification->outcome == TrialOutcome::kOutOfMemory)
      runs.push_back(&*node.verification);
  ASSERT_EQ(runs.size(), 9u);
  runs.front()->steps_run = 2;
  EXPECT_NE(answer().find(": later steps hold more than the probes measured, so"), std::string::npos) << answer();
  for (ProbeReport* run : runs) {
    run->outcome = TrialOutcome::kOk;
    run->steps_run = 3;
  }
  EXPECT_NE(answer().find(": their peaks were above the memory model's, so"), std::string::npos) << answer();
}

// Parameters alone over the budget (4 MiB of fp32 weights, 2 MiB usable):
// nothing fits one GPU, the sentence and then the command's ZeRO table;
// plain's line (16 P + 2 MiB = 18 MiB, A = 8 MiB per sample) is shown, so
// the table's activations are measured ones: no lower-bound line.
TEST(AutotuneReport, ParametersAloneSayNothingFitsOneGpuWithTheTable) {
  FakeRunner fake;
  AutotuneReport report = report_of(fake, job_with_budget(2 * kMiB));
  report.nothing_fits = NothingFits{"<zero table>\n", nlohmann::json::object({{"rows", 6}})};
  const std::vector<std::string> lines = lines_of(render_autotune_text(report));
  ASSERT_EQ(lines.size(), 10u) << render_autotune_text(report);
  EXPECT_EQ(lines[0], "autotune  fake.pt  (1048576 parameters)");
  EXPECT_EQ(lines[2], "model     plain peak = 18.00 MiB + 8.00 MiB per sample");
  EXPECT_EQ(lines[3],
            "          plain step = 0.0100 s + 0.00200 s per sample (both fitted to the plain probes at micro-batch 4, "
            "8, 16)");
  EXPECT_EQ(lines[5],
            "nothing fits one GPU: the parameters alone (4.00 MiB) exceed the usable budget (2.00 MiB, after 0 % "
            "headroom): no single-GPU configuration holds them (every strategy keeps the weights on the device)");
  EXPECT_EQ(lines[6], "<zero table>");
  EXPECT_EQ(lines[8].rfind("note: activation checkpointing (all blocks) probed at micro-batch 4", 0), 0u) << lines[8];
  EXPECT_EQ(lines[9], "trials    4 probes + 0 verification runs");
  const nlohmann::json j = autotune_json(report);
  EXPECT_EQ(j.at("parameters_alone"), report.search.parameters_alone);
  EXPECT_EQ(j.at("nothing_fits"), report.nothing_fits->json);
  EXPECT_TRUE(j.at("least_memory_failure").is_null());
  EXPECT_TRUE(j.at("chosen").is_null());
}

// No trial got past loading and no meta run counted the parameters: no
// table (the command computes none without a count), and the report says
// how to get one.
TEST(AutotuneReport, ParametersThatDoNotLoadSayWhyThereIsNoTable) {
  struct WeightsDoNotLoad : FakeRunner {
    ProbeReport probe(const TrainingConfig& c) override {
      ProbeReport r;
      r.config = to_string(c);
      r.outcome = TrialOutcome::kOutOfMemory;
      r.phase_at_failure = Phase::kLoad;
      r.message = "oomtune budget: tried to allocate 4.83 KiB";
      return r;
    }
  } fake;
  const AutotuneReport report = report_of(fake, job_with_budget(1024));
  const std::vector<std::string> lines = lines_of(render_autotune_text(report));
  ASSERT_EQ(lines.size(), 7u) << render_autotune_text(report);
  EXPECT_EQ(lines[2], "model     none: no configuration ran at micro-batch 4");
  EXPECT_EQ(lines[4].rfind("nothing fits one GPU: loading the weights ran out of memory (oomtune budget: tried to "
                           "allocate 4.83 KiB): the parameters alone exceed the usable budget (1.00 KiB",
                           0),
            0u)
      << lines[4];
  EXPECT_EQ(lines[5],
            "          no ZeRO/FSDP table: the parameter count is unknown (no trial got past loading the weights); "
            "autotune with device = \"meta\" (libtorch 2) counts them without their memory");
  EXPECT_FALSE(autotune_json(report).contains("nothing_fits"));
}

}  // namespace
}  // namespace oomtune
