// The autotune report rendered from a search against the fake device
// (fake_runner.h), whose curves make every number in it computable by hand.
// The golden file tests/search/golden/<case>.txt was reviewed line by line
// against those curves; regenerate with OOMTUNE_UPDATE_GOLDEN=1 and review
// again before committing.

#include "report/autotune_report.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "common/atomic_file.h"
#include "fake_runner.h"

namespace oomtune {
namespace {

const std::filesystem::path kGoldenDir = std::filesystem::path(OOMTUNE_SOURCE_DIR) / "tests/search/golden";

std::string read_text(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

void expect_golden(const std::string& name, const std::string& actual) {
  const std::filesystem::path path = kGoldenDir / (name + ".txt");
  const char* update = std::getenv("OOMTUNE_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    write_file_atomically(path.string(), actual);
    return;
  }
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing; run with OOMTUNE_UPDATE_GOLDEN=1";
  EXPECT_EQ(actual, read_text(path)) << "differs from " << path;
}

// The budget of DecisionTree.AccumulationFindsTheOraclesLargestMicroBatch:
// plain at 8 x 4 is chosen; the trail holds names and configurations of
// different lengths.
AutotuneReport accumulation_report() {
  FakeRunner fake;
  AutotuneReport report;
  report.job_path = "job.toml";
  report.job = job_with_budget(plain_peak(8) + 4 * kMiB + kMiB);
  report.job.device = "cuda";
  report.search = run_search(fake, report.job);
  return report;
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
    EXPECT_TRUE(verdict.size() >= 5 && (verdict.substr(verdict.size() - 3) == "yes" ||
                                        verdict.substr(verdict.size() - 5) == "pred." ||
                                        verdict.substr(verdict.size() - 2) == "no"))
        << row;
    EXPECT_EQ(row.substr(fits_end, note_at - fits_end), std::string(note_at - fits_end, ' ')) << row;
    EXPECT_NE(row[note_at], ' ') << row;
  }
  EXPECT_GE(rows, 5u);
}

}  // namespace
}  // namespace oomtune
