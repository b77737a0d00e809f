// The probe report's attention and workspaces lines (issue #46 item 3),
// rendered from a hand-made report: text and JSON.

#include <gtest/gtest.h>

#include <string>

#include "report/probe_summary.h"

namespace oomtune {
namespace {

ProbeSummary summary() {
  ProbeSummary s;
  s.model_path = "attention_sdpa.pt";
  s.device = Device::kMeta;
  s.report.config = "micro_batch=2,accum=1,ckpt=none,optimizer=adamw,offload=off,precision=fp32";
  s.report.timing.measured = false;
  return s;
}

std::string line_starting(const std::string& text, const std::string& start) {
  const std::size_t at = text.find("\n" + start);
  if (at == std::string::npos) return "";
  const std::size_t end = text.find('\n', at + 1);
  return text.substr(at + 1, end - at - 1);
}

TEST(ProbeSummaryLines, AttentionAndWorkspacesLinesAndJson) {
  ProbeSummary s = summary();
  AttentionRecord attention;
  attention.calls[static_cast<std::size_t>(AttentionKernel::kEfficient)] = 1;
  attention.kept_bytes = 69632;         // output 64 KiB + logsumexp 4 KiB
  attention.math_kept_bytes = 1179648;  // 2 x 64 KiB + 1 MiB of scores
  attention.target = "sm80";
  s.report.attention = attention;
  s.report.workspaces = workspaces_for(*cuda_target_from_name("sm80"), false);
  const std::string text = render_probe_text(s);
  EXPECT_EQ(line_starting(text, "attention"),
            "attention            1 call, kernel efficient for the CUDA target sm80, kept 68.00 KiB (math path would "
            "keep 1.12 MiB)");
  EXPECT_EQ(line_starting(text, "workspaces"),
            "workspaces           cuBLAS 2 x 8.12 MiB = 16.25 MiB on sm80 (one per handle: forward's thread and "
            "autograd's), held by the caching allocator from the first matmul on; not in the peaks above");
  const nlohmann::json j = probe_summary_json(s);
  EXPECT_EQ(j.at("report").at("attention").at("calls").at("efficient"), 1);
  EXPECT_EQ(j.at("report").at("attention").at("kept_bytes"), 69632);
  EXPECT_EQ(j.at("report").at("attention").at("math_kept_bytes"), 1179648);
  EXPECT_EQ(j.at("report").at("workspaces").at("total_bytes"), 2 * 8519680);
  const ProbeReport back = probe_report_from_json(j.at("report"));
  ASSERT_TRUE(back.attention && back.workspaces);
  EXPECT_EQ(back.attention->calls, attention.calls);
  EXPECT_EQ(back.workspaces->cublas_workspaces, 2);
}

TEST(ProbeSummaryLines, NoAttentionNoLines) {
  const std::string text = render_probe_text(summary());
  EXPECT_EQ(text.find("\nattention"), std::string::npos);
  EXPECT_EQ(text.find("\nworkspaces"), std::string::npos);
  EXPECT_FALSE(probe_summary_json(summary()).at("report").contains("attention"));
}

}  // namespace
}  // namespace oomtune
