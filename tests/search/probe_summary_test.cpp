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

// A step whose forward and backward both called cuBLAS, and whose forward
// (with `lt`) ran a matmul with a bias through cuBLASLt.
CublasCalls two_handles(bool lt) {
  CublasCalls calls;
  calls.training_thread = CublasCall{0, Phase::kForward};
  calls.autograd_thread = CublasCall{1, Phase::kBackward};
  if (lt) calls.lt_training_thread = CublasCall{0, Phase::kForward};
  return calls;
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
  s.report.peak_bytes = 100 * 1024 * 1024;  // + 2 x 8,519,680 B + 1 MiB of workspaces = 117.25 MiB
  s.report.workspaces = workspaces_for(*cuda_target_from_name("sm80"), two_handles(true), false, false);
  const std::string text = render_probe_text(s);
  EXPECT_EQ(line_starting(text, "attention"),
            "attention            1 call, kernel efficient for the CUDA target sm80, kept 68.00 KiB (math path would "
            "keep 1.12 MiB)");
  EXPECT_EQ(line_starting(text, "workspaces"),
            "workspaces           cuBLAS 2 x 8.12 MiB = 16.25 MiB on sm80 (one per handle: forward's thread and "
            "autograd's); cuBLASLt 1 x 1.00 MiB (matmuls with a bias), held by the caching allocator from the first "
            "matmul on: not in the peaks above, in the predicted reserved; with them a CUDA run's step peak is "
            "117.25 MiB");
  const nlohmann::json j = probe_summary_json(s);
  EXPECT_EQ(j.at("report").at("attention").at("calls").at("efficient"), 1);
  EXPECT_EQ(j.at("report").at("attention").at("kept_bytes"), 69632);
  EXPECT_EQ(j.at("report").at("attention").at("math_kept_bytes"), 1179648);
  EXPECT_EQ(j.at("report").at("workspaces").at("total_bytes"), 2 * 8519680 + 1048576);
  const ProbeReport back = probe_report_from_json(j.at("report"));
  ASSERT_TRUE(back.attention && back.workspaces);
  EXPECT_EQ(back.attention->calls, attention.calls);
  EXPECT_EQ(back.workspaces->cublas_workspaces, 2);
  EXPECT_EQ(back.workspaces->cublaslt_workspaces, 1);
  EXPECT_EQ(back.workspaces->total_bytes(), 2 * 8519680 + 1048576);
}

// A trial on a GPU: what its allocator reserved beside the prediction
// (predicted 66 MiB / measured 60 MiB - 1 = +10.0 %), and the largest block
// it could still hand out beside the step's largest request.
TEST(ProbeSummaryLines, MeasuredReservedAndLargestBlockLines) {
  ProbeSummary s = summary();
  constexpr int64_t kMiB = int64_t{1} << 20;
  s.report.reserved = ReservedPrediction{};
  s.report.reserved->peak_reserved_bytes = 66 * kMiB;
  s.report.reserved->segment_allocations = 4;
  s.report.measured_reserved = MeasuredReserved{60 * kMiB, 50 * kMiB, 3, 1, 0};
  s.report.allocatable = AllocatableRecord{36 * kMiB, 40 * kMiB, 80 * 1024 * kMiB, 15, 243 * kMiB};
  s.report.largest.bytes = 12 * kMiB;
  const std::string text = render_probe_text(s);
  EXPECT_EQ(line_starting(text, "measured reserved"),
            "measured reserved    60.00 MiB by the caching allocator; predicted +10.0 % (3 cudaMalloc calls, 1 "
            "retry, 0 OOMs)");
  EXPECT_EQ(line_starting(text, "largest block"),
            "largest block        36.00 MiB allocatable after the step (bisection, 15 tries); device free 40.00 MiB "
            "of 80.00 GiB; the step's largest request 12.00 MiB");
  // The bisection reached its bound, the usable budget: the allocator
  // might have given more, so the line says "at least".
  s.report.allocatable = AllocatableRecord{242 * kMiB, 40 * 1024 * kMiB, 80 * 1024 * kMiB, 1, 243 * kMiB};
  EXPECT_EQ(line_starting(render_probe_text(s), "largest block"),
            "largest block        at least 242.00 MiB allocatable after the step (bisection up to the usable budget, "
            "1 try); device free 40.00 GiB of 80.00 GiB; the step's largest request 12.00 MiB");
  // A step that ran caught its out-of-memory errors (Note [cuDNN calls]).
  s.report.measured_reserved->num_ooms = 2;
  EXPECT_EQ(line_starting(render_probe_text(s), "measured reserved"),
            "measured reserved    60.00 MiB by the caching allocator; predicted +10.0 % (3 cudaMalloc calls, 1 "
            "retry, 2 OOMs, caught inside the step: cuDNN, for one, runs another, slower engine when a convolution's "
            "workspace finds no room)");
  EXPECT_EQ(render_probe_text(summary()).find("\nmeasured reserved"), std::string::npos);
  EXPECT_EQ(render_probe_text(summary()).find("\nlargest block"), std::string::npos);
}

// The optimizer state's row: offloaded, the state is on the host; on a
// GPU without offload a step leaves a 4-byte CPU scalar on the host (seen
// on an H200, 2026-11-29), which is no optimizer state and must not turn
// the row into "on host".
TEST(ProbeSummaryLines, OptimizerStateIsOnTheHostOnlyWhenOffloaded) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  ProbeSummary s = summary();
  s.analytic.optimizer_state_bytes = 8 * kMiB;
  s.report.static_memory.optimizer_state_bytes = 8 * kMiB;
  s.report.static_memory.optimizer_host_bytes = 4;
  std::string text = render_probe_text(s);
  EXPECT_EQ(line_starting(text, "optimizer state"), "optimizer state            8.00 MiB     8.00 MiB      exact");
  EXPECT_EQ(line_starting(text, "optimizer (host)"), "");
  s.report.static_memory.optimizer_state_bytes = 0;
  s.report.static_memory.optimizer_host_bytes = 16 * kMiB;
  text = render_probe_text(s);
  EXPECT_EQ(line_starting(text, "optimizer state"), "optimizer state                 0 B     8.00 MiB    on host");
  EXPECT_EQ(line_starting(text, "optimizer (host)"),
            "optimizer (host)          16.00 MiB  (master weights, gradients and state)");
}

// The host line gives its margin to a host budget (search/host_budget.cpp,
// Note [Host budget]), or how far over it the run went.
TEST(ProbeSummaryLines, TheHostLineHoldsTheRunToAHostBudget) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  ProbeSummary s = summary();
  s.report.host_peak_bytes = 17 * kMiB;
  const std::string host =
      "host                       17.00 MiB  (host memory: the global batch before it is copied, "
      "checkpointing's RNG states, an offloaded optimizer";
  EXPECT_EQ(line_starting(render_probe_text(s), "host"), host + ")");
  s.usable_host_budget_bytes = 20 * kMiB;
  EXPECT_EQ(line_starting(render_probe_text(s), "host"), host + "; margin 3.00 MiB to the usable host budget)");
  s.usable_host_budget_bytes = 16 * kMiB;
  EXPECT_EQ(line_starting(render_probe_text(s), "host"),
            host + "; 1.00 MiB over the usable host budget (16.00 MiB): out of host memory)");
  EXPECT_EQ(probe_summary_json(s).at("usable_host_budget_bytes"), 16 * kMiB);
}

TEST(ProbeSummaryLines, NoAttentionNoLines) {
  const std::string text = render_probe_text(summary());
  EXPECT_EQ(text.find("\nattention"), std::string::npos);
  EXPECT_EQ(text.find("\nworkspaces"), std::string::npos);
  EXPECT_FALSE(probe_summary_json(summary()).at("report").contains("attention"));
}

// Note [The budget on a CUDA target]: a probe on meta (or the CPU) with a
// budget gives the tensors' margin to the usable budget and, under it, what
// the caching allocator capped there would do; a GPU probe measured that,
// so its line holds the reserved bytes the cap refuses past.
TEST(ProbeSummaryLines, ABudgetOffTheGpuGetsTheCudaVerdict) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  ProbeSummary s = summary();
  s.budget_bytes = 150 * kMiB;
  s.report.peak_bytes = 130 * kMiB;
  s.report.workspaces = workspaces_for(*cuda_target_from_name("sm90"), two_handles(false), false, false);
  s.report.reserved = ReservedPrediction{};
  s.report.reserved->peak_reserved_bytes = 220 * kMiB;
  s.report.reserved->budget_bytes = 142 * kMiB;
  s.report.reserved->fits_budget = false;
  s.report.reserved->failed_request_bytes = 8 * kMiB;
  s.report.reserved->failed_op = "aten::linear";
  s.report.reserved->failed_phase = Phase::kForward;
  const std::string text = render_probe_text(s);
  // The tensors' margin is no verdict there: the line under it is.
  EXPECT_EQ(line_starting(text, "budget  "),
            "budget               150.00 MiB: tensors peak at 130.00 MiB, 20.00 MiB under it");
  EXPECT_EQ(line_starting(text, "budget on CUDA"),
            "budget on CUDA       sm90: 220.00 MiB reserved (predicted) is over the usable 142.00 MiB: capped there "
            "the caching allocator runs out of memory at a 8.00 MiB request by aten::linear during forward");
  // With headroom the margin is to what is usable, as autotune's and
  // --enforce-budget's are.
  s.usable_budget_bytes = 120 * kMiB;
  s.headroom = 0.2;
  EXPECT_EQ(line_starting(render_probe_text(s), "budget  "),
            "budget               150.00 MiB (120.00 MiB usable after 20 % headroom): tensors peak at 130.00 MiB, "
            "10.00 MiB over it");
  EXPECT_EQ(probe_summary_json(s).at("usable_budget_bytes").get<int64_t>(), 120 * kMiB);

  // On the GPU: the reserved bytes it measured, which the cap holds.
  s.device = Device::kCuda;
  s.usable_budget_bytes = 142 * kMiB;
  s.headroom = 0.05;
  s.report.measured_reserved = MeasuredReserved{};
  s.report.measured_reserved->peak_reserved_bytes = 140 * kMiB;
  EXPECT_EQ(line_starting(render_probe_text(s), "budget on CUDA"), "");
  EXPECT_EQ(line_starting(render_probe_text(s), "budget  "),
            "budget               150.00 MiB (142.00 MiB usable after 5 % headroom): peak 130.00 MiB of tensors, "
            "140.00 MiB reserved (fits with 2.00 MiB)");
  // Without a reserved figure (a CPU probe recording no events) the peak is the tensors'.
  s.device = Device::kCpu;
  s.report.reserved.reset();
  s.report.measured_reserved.reset();
  EXPECT_EQ(line_starting(render_probe_text(s), "budget  "),
            "budget               150.00 MiB (142.00 MiB usable after 5 % headroom): peak 130.00 MiB (fits with "
            "12.00 MiB)");
}

// Parameters without a gradient: named under the gradients line, after the
// first three and the last past six.
TEST(ProbeSummaryLines, ParametersWithoutAGradientAreNamedUnderTheGradients) {
  ProbeSummary s = summary();
  s.report.static_memory.without_gradient = {"embeddings.mask_token"};
  s.report.static_memory.without_gradient_count = 64;
  const std::string text = render_probe_text(s);
  const std::size_t gradients = text.find("\ngradients ");
  ASSERT_NE(gradients, std::string::npos) << text;
  const std::size_t next = text.find('\n', gradients + 1);
  EXPECT_EQ(text.substr(next + 1, text.find('\n', next + 1) - next - 1),
            "                       no gradient: embeddings.mask_token (1 tensor, 64 elements; the loss does not "
            "depend on them, so they get no optimizer state either)");
  s.report.static_memory.without_gradient = {"a", "b", "c", "d", "e", "f", "g"};
  EXPECT_NE(render_probe_text(s).find("no gradient: a, b, c, ..., g (--json lists all) (7 tensors, 64 elements;"),
            std::string::npos)
      << render_probe_text(s);
  // None: no line.
  s.report.static_memory.without_gradient.clear();
  EXPECT_EQ(render_probe_text(s).find("no gradient:"), std::string::npos);
}

}  // namespace
}  // namespace oomtune
