// End to end: the built `oomtune diagnose` binary on real and broken files.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_oomtune.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

using oomtune::testing::run_oomtune;  // unique output files per call: the tests run in parallel

TEST(DiagnoseCli, RealFixtureAsJson) {
  const std::string path = testing::real_fixture("oom_fragmentation.pickle");
  SKIP_IF_MISSING(path);
  const std::string svg = ::testing::TempDir() + "diag_" + std::to_string(::getpid()) + ".svg";
  std::remove(svg.c_str());
  const auto r = run_oomtune("diagnose " + path + " --json --svg " + svg);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verdicts"][0]["id"], "fragmentation");
  EXPECT_EQ(j["ooms"][1]["allocated_bytes"].get<int64_t>(), int64_t{203} * 9961472);
  const std::string drawn = testing::read_all(svg);
  EXPECT_NE(drawn.find("</svg>"), std::string::npos);
  EXPECT_EQ(drawn.find("<script"), std::string::npos);
}

TEST(DiagnoseCli, TextReportNamesTheVerdict) {
  const std::string path = testing::real_fixture("oom_gpt_activations.pickle");
  SKIP_IF_MISSING(path);
  const auto r = run_oomtune("diagnose " + path + " --top 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Activations in the forward pass [activations_in_forward]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gpu_truth.py:35 in forward"), std::string::npos);
}

TEST(DiagnoseCli, BadFilesExitTwoWithOneLine) {
  const char* files[] = {"bad_truncated.pickle", "bad_memo.pickle", "bad_length.pickle", "bad_nesting.pickle",
                         "bad_type.pickle", "malicious_global.pickle", "malicious_reduce.pickle"};
  for (const char* f : files) {
    SCOPED_TRACE(f);
    const std::string path = testing::synthetic_fixture(f);
    SKIP_IF_MISSING(path);
    const auto r = run_oomtune("diagnose " + path);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.rfind("oomtune: " + path + ": ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_FALSE(testing::exists("/tmp/oomtune_fixture_pwned"));  // the GLOBAL os.system never ran
  const auto missing = run_oomtune("diagnose /nonexistent/snap.pickle");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.out, "");
  EXPECT_EQ(missing.err, "oomtune: /nonexistent/snap.pickle: cannot open: No such file or directory\n");
}

}  // namespace
}  // namespace oomtune::diagnose
