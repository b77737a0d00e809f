// `diagnose A --compare B` (issue #48 part 3) on pairs whose differences are
// known by construction (scripts/make_snapshot_fixtures.py docstrings), and
// on the real H100 fragmentation snapshot against its scaled-down synthetic
// twin (20 vs 203 segments of one 9.5 MiB tensor and a 10.5 MiB hole).

#include "diagnose/compare.h"

#include <unistd.h>
#include <algorithm>
#include <limits>
#include <regex>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/byte_size.h"
#include "diagnose/render.h"
#include "support/run_oomtune.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

Comparison compare_files(const std::string& a, const std::string& b, int top = 10) {
  DiagnoseOptions all;
  all.top = std::numeric_limits<int>::max();
  return compare(diagnose(load_snapshot(a), a, all), diagnose(load_snapshot(b), b, all), top);
}

int64_t row(const std::array<int64_t, kNumCompareRows>& rows, Category c) { return rows[static_cast<size_t>(c)]; }
constexpr size_t kReservedFree = kNumCategories;

TEST(Compare, SequenceDoubledNamesTheLayerThatGrewMost) {
  const std::string a = testing::synthetic_fixture("compare_seq_1x.pickle");
  const std::string b = testing::synthetic_fixture("compare_seq_2x.pickle");
  SKIP_IF_MISSING(a);
  const Comparison c = compare_files(a, b);
  EXPECT_EQ(c.before.moment, "at the peak");
  EXPECT_EQ(row(c.before_rows, Category::kActivations), 160 * kMiB);  // 4 layers x 10 x 4 MiB
  EXPECT_EQ(row(c.after_rows, Category::kActivations), 320 * kMiB);
  EXPECT_EQ(row(c.after_rows, Category::kParameters) - row(c.before_rows, Category::kParameters), 0);
  ASSERT_FALSE(c.verdicts.empty());
  EXPECT_EQ(c.verdicts[0].id, CompareVerdictId::kActivationsGrew);
  EXPECT_EQ(c.verdicts[0].change_bytes, 160 * kMiB);
  EXPECT_EQ(c.verdicts[0].sentence,
            "activations in modeling_llama.py:161 in forward grew 96.00 MiB (160.00 MiB -> 320.00 MiB in all, "
            "x2.00): the micro-batch or the sequence length doubled");
  ASSERT_EQ(c.layers.size(), 5u);
  EXPECT_EQ(c.layers[0].layer, "modeling_llama.py:161 in forward");
  EXPECT_EQ(c.layers[0].before_bytes, 96 * kMiB);
  EXPECT_EQ(c.layers[0].after_bytes, 192 * kMiB);
  for (size_t i = 1; i < 5; ++i) EXPECT_EQ(c.layers[i].change_bytes(), 16 * kMiB) << c.layers[i].layer;
}

TEST(Compare, OptimizerStateAppearsAfterTheFirstStep) {
  const std::string a = testing::synthetic_fixture("compare_before_step.pickle");
  const std::string b = testing::synthetic_fixture("compare_after_step.pickle");
  SKIP_IF_MISSING(a);
  const Comparison c = compare_files(a, b);
  EXPECT_EQ(row(c.before_rows, Category::kOptimizerState), 0);
  EXPECT_EQ(row(c.after_rows, Category::kOptimizerState), 64 * kMiB);  // 2 states x 4 parameters x 8 MiB
  EXPECT_EQ(row(c.before_rows, Category::kActivations), row(c.after_rows, Category::kActivations));
  EXPECT_EQ(c.after.allocated_bytes - c.before.allocated_bytes, 64 * kMiB);
  ASSERT_FALSE(c.verdicts.empty());
  EXPECT_EQ(c.verdicts[0].id, CompareVerdictId::kOptimizerStateAppeared);
  // AdamW's frames name it: two fp32 states per parameter, 64 MiB over 32 MiB of parameters.
  EXPECT_EQ(c.verdicts[0].sentence,
            "optimizer state appeared (64.00 MiB): this snapshot is after the first optimizer step (AdamW keeps two "
            "states per parameter; here 2.00 x the parameters' bytes)");
  // The states' new segments: reserved but free 8 -> 16 MiB, largest free block 4 -> 8 MiB.
  ASSERT_GE(c.verdicts.size(), 2u);
  EXPECT_EQ(c.verdicts[1].id, CompareVerdictId::kReservedFreeGrew);
  EXPECT_NE(c.verdicts[1].sentence.find("the largest free block went from 4.00 MiB to 8.00 MiB"), std::string::npos)
      << c.verdicts[1].sentence;
  // The other way round: gone.
  const Comparison back = compare_files(b, a);
  EXPECT_EQ(back.verdicts.at(0).id, CompareVerdictId::kOptimizerStateGone);
  EXPECT_EQ(back.verdicts.at(0).change_bytes, -64 * kMiB);
}

// 6 vs 14 holes (forward_second_iteration): 8 more segments, each a kept
// 9.5 MiB tensor and a 10.5 MiB hole; the largest free block stays 10.5 MiB.
TEST(Compare, MoreHolesIsReservedButFreeGrowing) {
  const std::string a = testing::synthetic_fixture("forward_holes_combined.pickle");
  const std::string b = testing::synthetic_fixture("forward_holes_enough.pickle");
  SKIP_IF_MISSING(a);
  const Comparison c = compare_files(a, b);
  EXPECT_EQ(c.before.moment, "at the last out-of-memory");
  EXPECT_EQ(c.after_rows[kReservedFree] - c.before_rows[kReservedFree], 8 * 11010048);
  EXPECT_EQ(c.after.segments - c.before.segments, 8);
  EXPECT_EQ(c.before.largest_free_block_bytes, 11010048);
  EXPECT_EQ(c.after.largest_free_block_bytes, 11010048);
  EXPECT_EQ(row(c.after_rows, Category::kUnattributed) - row(c.before_rows, Category::kUnattributed), 8 * 9961472);
  ASSERT_EQ(c.verdicts.size(), 2u);
  EXPECT_EQ(c.verdicts[0].id, CompareVerdictId::kReservedFreeGrew);
  EXPECT_NE(c.verdicts[0].sentence.find("with +8 segments; the largest free block stayed 10.50 MiB:"),
            std::string::npos)
      << c.verdicts[0].sentence;
  EXPECT_EQ(c.verdicts[1].id, CompareVerdictId::kUnattributedChanged);
}

TEST(Compare, RealFragmentationAgainstItsScaledDownTwin) {
  const std::string a = testing::synthetic_fixture("layout_v2_11.pickle");
  const std::string b = testing::real_fixture("oom_fragmentation.pickle");
  SKIP_IF_MISSING(a);
  SKIP_IF_MISSING(b);
  const Comparison c = compare_files(a, b);
  EXPECT_EQ(c.before.segments, 20);
  EXPECT_EQ(c.after.segments, 203);
  EXPECT_EQ(c.before.allocated_bytes, 20 * 9961472);
  EXPECT_EQ(c.after.allocated_bytes, int64_t{203} * 9961472);
  EXPECT_EQ(c.before_rows[kReservedFree], 20 * 11010048);
  EXPECT_EQ(c.after_rows[kReservedFree], int64_t{203} * 11010048);
  EXPECT_EQ(c.before.largest_free_block_bytes, 11010048);
  EXPECT_EQ(c.after.largest_free_block_bytes, 11010048);
  EXPECT_EQ(c.verdicts.at(0).id, CompareVerdictId::kReservedFreeGrew);
  EXPECT_NE(c.verdicts[0].sentence.find("with +183 segments"), std::string::npos) << c.verdicts[0].sentence;
}

TEST(Compare, ASnapshotAgainstItselfHasNoChange) {
  for (const char* name : {"oom_gpt_activations.pickle", "oom_fragmentation.pickle"}) {
    const std::string path = testing::real_fixture(name);
    SKIP_IF_MISSING(path);
    const Comparison c = compare_files(path, path);
    ASSERT_EQ(c.verdicts.size(), 1u) << name;
    EXPECT_EQ(c.verdicts[0].id, CompareVerdictId::kNoChange);
    EXPECT_TRUE(c.layers.empty());
    EXPECT_EQ(c.before_rows, c.after_rows);
  }
}

// The comparison's SVG keeps its words on the page: a call site longer
// than the label column (48 characters; the fixtures' "gpu_truth.py:194 in
// scenario_snap_fragmentation" ran 118 px off the page's left edge when it
// was 25) is cut in the middle with the whole of it in a <title>, and each
// bar's "N reserved" lies right of every bar, not over bar B.
TEST(Compare, SvgLabelsStayInTheirColumns) {
  const std::string a = testing::real_fixture("oom_fragmentation.pickle");
  const std::string b = testing::real_fixture("oom_gpt_activations.pickle");
  SKIP_IF_MISSING(a);
  SKIP_IF_MISSING(b);
  DiagnoseOptions options;
  options.top = std::numeric_limits<int>::max();
  options.group_by = GroupBy::kCall;
  Comparison c = compare(diagnose(load_snapshot(a), a, options), diagnose(load_snapshot(b), b, options), 10);
  ASSERT_FALSE(c.layers.empty());
  // The fixtures' longest call site, 47 characters, fits; a longer one.
  c.layers.front().layer = "models/very_long_package_name/transformer_block.py:1234 in forward_with_cache";
  const std::string svg = render_compare_svg(c);
  const std::regex label(
      R"re(<text x="(\d+)" y="\d+" text-anchor="end"[^>]*>(<title>([^<]*)</title>)?([^<]*)</text>)re");
  int cut = 0, labels = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), label); it != std::sregex_iterator(); ++it) {
    ++labels;
    EXPECT_LE((*it)[4].length(), 48) << (*it)[0];
    if ((*it)[2].matched) {
      ++cut;
      EXPECT_GT((*it)[3].length(), 48) << (*it)[0];
      EXPECT_NE((*it)[4].str().find("..."), std::string::npos) << (*it)[0];
    }
  }
  EXPECT_GT(labels, 4) << svg;
  EXPECT_GT(cut, 0) << "no call site was long enough to test the cut\n" << svg;
  double bars_end = 0;
  const std::regex rect(R"re(<rect x="([\d.]+)" y="\d+" width="([\d.]+)")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), rect); it != std::sregex_iterator(); ++it)
    bars_end = std::max(bars_end, std::stod((*it)[1]) + std::stod((*it)[2]));
  const std::regex reserved(R"re(<text x="([\d.]+)" y="\d+">[^<]* reserved</text>)re");
  int reserved_labels = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), reserved); it != std::sregex_iterator(); ++it) {
    ++reserved_labels;
    EXPECT_GT(std::stod((*it)[1]), bars_end) << (*it)[0];
  }
  EXPECT_EQ(reserved_labels, 2) << svg;
}

TEST(Compare, CliTextJsonAndSvg) {
  const std::string a = testing::synthetic_fixture("compare_before_step.pickle");
  const std::string b = testing::synthetic_fixture("compare_after_step.pickle");
  SKIP_IF_MISSING(a);
  const std::string svg = ::testing::TempDir() + "compare_" + std::to_string(::getpid()) + ".svg";
  const auto json_run = oomtune::testing::run_oomtune("diagnose " + a + " --compare " + b + " --json --svg " + svg);
  ASSERT_EQ(json_run.exit_code, 0) << json_run.err;
  const auto j = nlohmann::json::parse(json_run.out);
  EXPECT_EQ(j["verdicts"][0]["id"], "optimizer_state_appeared");
  EXPECT_EQ(j["categories"][2]["name"], "optimizer_state");
  EXPECT_EQ(j["categories"][2]["change_bytes"], 64 * kMiB);
  EXPECT_EQ(j["after"]["file"], b);
  const std::string drawn = testing::read_all(svg);
  std::remove(svg.c_str());
  EXPECT_EQ(drawn.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(drawn.find("<script"), std::string::npos);
  EXPECT_NE(drawn.find("optimizer_state: 64.00 MiB"), std::string::npos);
  const auto text = oomtune::testing::run_oomtune("diagnose " + a + " --compare " + b);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("  1. optimizer state appeared (64.00 MiB): this snapshot is after the first optimizer "
                          "step (AdamW keeps two states per parameter; here 2.00 x the parameters' bytes) "
                          "[optimizer_state_appeared]\n"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("  optimizer_state                  0 B     64.00 MiB    +64.00 MiB\n"), std::string::npos)
      << text.out;
  // By call site: the optimizer's states are one line of the training step.
  const auto by_call = oomtune::testing::run_oomtune("diagnose " + a + " --compare " + b + " --group-by call");
  ASSERT_EQ(by_call.exit_code, 0) << by_call.err;
  EXPECT_NE(by_call.out.find("By call site (largest changes first)\n    +64.00 MiB  optimizer_state  train.py:44 in "
                             "train_step (0 B -> 64.00 MiB)\n"),
            std::string::npos)
      << by_call.out;
  // A B that cannot be read: one line naming it, exit 2, nothing on stdout.
  const auto missing = oomtune::testing::run_oomtune("diagnose " + a + " --compare /nonexistent/b.pickle");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.out, "");
  EXPECT_EQ(missing.err, "oomtune: /nonexistent/b.pickle: cannot open: No such file or directory\n");
}

}  // namespace
}  // namespace oomtune::diagnose
