// End to end: the built `oomtune diagnose` binary on real and broken files.

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_oomtune.h"
#include "support/scratch_path.h"
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

// A snapshot named in Latin-1 ("mémoire"): the JSON and the SVG write the
// name with U+FFFD; JSON output was "internal error: invalid UTF-8" before.
TEST(DiagnoseCli, AFileNameThatIsNotUtf8IsReplacedInJsonAndSvg) {
  const std::string fixture = testing::synthetic_fixture("layout_v2_11.pickle");
  SKIP_IF_MISSING(fixture);
  const std::string stem = ::testing::TempDir() + "m\xE9moire_" + std::to_string(::getpid());
  const std::string path = stem + ".pickle", svg = stem + ".svg";
  std::ofstream(path, std::ios::binary) << testing::read_all(fixture);
  const auto r = run_oomtune("diagnose '" + path + "' --json --svg '" + svg + "'");
  const std::string drawn = testing::read_all(svg);
  std::remove(path.c_str());
  std::remove(svg.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const std::string shown = std::string("m\xEF\xBF\xBDmoire_") + std::to_string(::getpid()) + ".pickle";
  EXPECT_NE(j["file"].get<std::string>().find(shown), std::string::npos) << j["file"];
  EXPECT_NE(drawn.find(shown), std::string::npos);
  EXPECT_EQ(drawn.find("m\xE9moire"), std::string::npos) << "no ill-formed UTF-8 in the SVG";
}

TEST(DiagnoseCli, TextReportNamesTheVerdict) {
  const std::string path = testing::real_fixture("oom_gpt_activations.pickle");
  SKIP_IF_MISSING(path);
  const auto r = run_oomtune("diagnose " + path + " --top 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Activations in the forward pass [activations_in_forward]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gpu_truth.py:35 in forward"), std::string::npos);
}

// Sites are grouped by layer unless --group-by call is given; another value is one line, exit 2.
TEST(DiagnoseCli, GroupByLayerOrCall) {
  const std::string path = testing::synthetic_fixture("hf_bert_forward_oom.pickle");
  SKIP_IF_MISSING(path);
  const auto by_layer = run_oomtune("diagnose " + path);
  ASSERT_EQ(by_layer.exit_code, 0) << by_layer.err;
  EXPECT_NE(by_layer.out.find("alive at the last out-of-memory, by layer:\n"), std::string::npos) << by_layer.out;
  EXPECT_NE(by_layer.out.find("  32.00 MiB  activations      modeling_bert.py:466 in forward (1 block; called from "
                              "finetune.py:61 in main)\n"),
            std::string::npos)
      << by_layer.out;
  const auto by_call = run_oomtune("diagnose " + path + " --group-by call");
  ASSERT_EQ(by_call.exit_code, 0) << by_call.err;
  EXPECT_NE(by_call.out.find(" 152.00 MiB  activations      finetune.py:61 in main (10 blocks; layer "
                             "modeling_bert.py:360 in forward and 5 more)\n"),
            std::string::npos)
      << by_call.out;
  const auto bad = run_oomtune("diagnose " + path + " --group-by file");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.out, "");
  EXPECT_EQ(bad.err, "oomtune diagnose: --group-by: file not in {layer,call}; see 'oomtune diagnose --help'\n");
}

TEST(DiagnoseCli, BadFilesExitTwoWithOneLine) {
  const char* files[] = {"bad_truncated.pickle",   "bad_memo.pickle", "bad_length.pickle",
                         "bad_nesting.pickle",     "bad_type.pickle", "malicious_global.pickle",
                         "malicious_reduce.pickle"};
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

void write_file(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// Outputs that would lose results or replace an input (the audit of
// 2026-11-29): refused before any work, or said with exit 1.
TEST(DiagnoseCli, OutputsThatWouldLoseOrReplaceDataAreRefused) {
  const std::string fixture = testing::synthetic_fixture("leak.pickle");
  SKIP_IF_MISSING(fixture);
  const std::string snap = ::testing::TempDir() + "self_" + std::to_string(::getpid()) + ".pickle";
  write_file(snap, testing::read_all(fixture));
  const auto self = run_oomtune("diagnose " + snap + " --svg " + snap);
  EXPECT_EQ(self.exit_code, 2);
  EXPECT_EQ(self.out, "");
  EXPECT_EQ(self.err,
            "oomtune: --svg " + snap + ": is the input " + snap + ", which it would replace; write to another file\n");
  EXPECT_EQ(testing::read_all(snap), testing::read_all(fixture));
  std::remove(snap.c_str());
  const auto nowhere = run_oomtune("diagnose " + fixture + " --svg /nonexistent-dir/x.svg");
  EXPECT_EQ(nowhere.exit_code, 1);
  EXPECT_EQ(nowhere.out, "");
  EXPECT_EQ(nowhere.err.rfind("oomtune: --svg /nonexistent-dir/x.svg: cannot write it: ", 0), 0u) << nowhere.err;
  // Results that cannot reach stdout are a failure.
  const auto full = run_oomtune("diagnose " + fixture + " >/dev/full");
  EXPECT_EQ(full.exit_code, 1);
  EXPECT_EQ(full.err, "oomtune: cannot write the results to standard output: No space left on device\n");
}

// Compressed snapshots (gzip, as people share 1 GB dumps) read as the pickle
// inside: the same report, with the .gz path as the file's name.
TEST(DiagnoseCli, GzipSnapshotsReadAsThePickleInside) {
  const std::string path = testing::real_fixture("oom_fragmentation.pickle");
  SKIP_IF_MISSING(path);
  const std::string gz = oomtune::testing::scratch_path("snapshot.pickle.gz").string();
  ASSERT_EQ(std::system(("gzip -c " + path + " > " + gz).c_str()), 0);
  const auto plain = run_oomtune("diagnose " + path + " --json");
  const auto packed = run_oomtune("diagnose " + gz + " --json");
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  auto a = nlohmann::json::parse(plain.out);
  auto b = nlohmann::json::parse(packed.out);
  EXPECT_EQ(b["file"], gz);
  a.erase("file");
  b.erase("file");
  EXPECT_EQ(a, b);
  // Half of the compressed file: zlib's reason, one line, exit 2.
  const std::string bytes = testing::read_all(gz);
  const std::string cut = oomtune::testing::scratch_path("cut.pickle.gz").string();
  write_file(cut, bytes.substr(0, bytes.size() / 2));
  const auto truncated = run_oomtune("diagnose " + cut);
  EXPECT_EQ(truncated.exit_code, 2);
  EXPECT_EQ(truncated.err, "oomtune: " + cut + ": gzip: unexpected end of file (truncated or corrupt file)\n");
  std::remove(gz.c_str());
  std::remove(cut.c_str());
}

TEST(DiagnoseCli, FilesThatAreNotSnapshotsSayWhatTheyAre) {
  const std::string how =
      ", not a memory snapshot pickle; write one with torch.cuda.memory._record_memory_history() before the run and "
      "torch.cuda.memory._dump_snapshot(\"snapshot.pickle\") after the out-of-memory\n";
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"viewer.html", "\n<!DOCTYPE html>\n<html>", "is an HTML or XML file (the memory viewer's page?)"},
      {"trace.json", "{\"traceEvents\": []}", "is a JSON file (a profiler or Chrome trace?)"},
      {"model.pt", std::string("PK\x03\x04\x14\x00", 6),
       "is a zip archive (a TorchScript model or a torch.save file?)"},
      {"snap.db", std::string("SQLite format 3\0", 16), "is a SQLite database"},
  };
  for (const auto& [name, bytes, kind] : cases) {
    const std::string path = oomtune::testing::scratch_path(name).string();
    write_file(path, bytes);
    const auto r = run_oomtune("diagnose " + path);
    EXPECT_EQ(r.exit_code, 2) << name;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "oomtune: " + path + ": " + kind + how);
    std::remove(path.c_str());
  }
}

// oomtune's own TOML files given to diagnose: named, with the commands that
// read them, as probe and emit name theirs; --compare's second file too.
TEST(DiagnoseCli, AJobSpecOrAPlanIsNamedWithTheCommandThatReadsIt) {
  const std::string job = oomtune::testing::scratch_path("job.toml").string();
  write_file(job, "# a job\nmodel = \"gpt.pt\"\nglobal_batch = 8\n");
  const std::string plan = oomtune::testing::scratch_path("plan.toml").string();
  write_file(plan, "plan_version = 1\n[job]\nspec = \"job.toml\"\n[config]\nmicro_batch = 4\n");
  const auto spec = run_oomtune("diagnose " + job);
  EXPECT_EQ(spec.exit_code, 2);
  EXPECT_EQ(spec.out, "");
  EXPECT_EQ(spec.err, "oomtune: " + job + ": is a job spec, not a memory snapshot pickle; oomtune autotune " + job +
                          " tunes it, and diagnose reads the snapshot of a run that ran out of memory "
                          "(torch.cuda.memory._dump_snapshot)\n");
  const std::string snapshot = testing::real_fixture("oom_fragmentation.pickle");
  const auto compared = run_oomtune("diagnose " + snapshot + " --compare " + plan);
  EXPECT_EQ(compared.exit_code, 2);
  EXPECT_EQ(compared.out, "");
  EXPECT_EQ(compared.err, "oomtune: " + plan +
                              ": is a plan (autotune --emit writes one), not a memory snapshot "
                              "pickle; oomtune probe --plan " +
                              plan + " runs it, oomtune emit " + plan + " writes its framework configs\n");
  std::remove(job.c_str());
  std::remove(plan.c_str());
}

}  // namespace
}  // namespace oomtune::diagnose
