// Trials on real TorchScript models, checked against analytic byte counts.

#include "trial/trial_runner.h"

#include <gtest/gtest.h>
#include <algorithm>
#include <utility>
#include <vector>

#include "probes/linear_fit.h"
#include "session/model_session.h"
#include "strategies/training_step.h"
#include "support/require_file.h"
#include "test_jobs.h"

namespace oomtune {
namespace {

using testing::bigmatmul_job;
using testing::encoder_decoder_job;
using testing::exists;
using testing::gpt_job;
using testing::mlp_job;

// mlp.pt: Linear(256, 512) + Linear(512, 512) + Linear(512, 10), with biases.
constexpr int64_t kMlpParameters = 256 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10;

using testing::quick_trial;

TEST(Trial, StaticMemoryEqualsTheAnalyticByteCounts) {
  const JobSpec job = mlp_job(16);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_EQ(r.parameter_count, kMlpParameters);
  // c10's CPU allocator adds no rounding and the tracker counts requested
  // bytes, so the tolerance is zero: fp32 parameters 4 P, gradients 4 P,
  // AdamW state (exp_avg, exp_avg_sq) 8 P. libtorch 1.13's AdamW also keeps
  // a scalar `step` per parameter as a C++ int64, not a tensor.
  EXPECT_EQ(r.static_memory.parameter_bytes, 4 * kMlpParameters);
  EXPECT_EQ(r.static_memory.gradient_bytes, 4 * kMlpParameters);
  EXPECT_EQ(r.static_memory.optimizer_state_bytes, 8 * kMlpParameters);
  EXPECT_EQ(r.static_memory.optimizer_host_bytes, 0);
}

// A trainable parameter the forward never uses (unused_parameter.pt: the
// MLP and a mask_token [1, 256]) gets no gradient and no AdamW state, as in
// eager PyTorch: the step's static memory is the MLP's, and the report
// names the parameter the analytic counts hold beside it.
TEST(Trial, AParameterTheForwardDoesNotUseIsNamedWithoutAGradient) {
  JobSpec job = mlp_job(16);
  job.model_path = testing::test_model("unused_parameter");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_EQ(r.parameter_count, kMlpParameters + 256);
  EXPECT_EQ(r.static_memory.parameter_bytes, 4 * (kMlpParameters + 256));
  EXPECT_EQ(r.static_memory.gradient_bytes, 4 * kMlpParameters);
  EXPECT_EQ(r.static_memory.optimizer_state_bytes, 8 * kMlpParameters);
  EXPECT_EQ(r.static_memory.without_gradient, std::vector<std::string>{"mask_token"});
  EXPECT_EQ(r.static_memory.without_gradient_count, 256);
  const ProbeReport back = probe_report_from_json(to_json(r));
  EXPECT_EQ(back.static_memory.without_gradient, r.static_memory.without_gradient);
  EXPECT_EQ(back.static_memory.without_gradient_count, 256);
  // Every parameter of the MLP has one.
  const JobSpec mlp = mlp_job(16);
  EXPECT_TRUE(run_trial(mlp, baseline_config(mlp), quick_trial()).static_memory.without_gradient.empty());
}

// Note [cuBLAS calls], Note [Library workspaces]: the MLP's forward and
// backward multiply matrices, so a CUDA run on the default target (sm90)
// holds two 32 MiB cuBLAS workspaces from the first step on, beside the
// tensors the peaks count; its forward's linear layers (2-D input, a bias:
// aten::addmm) take cuBLASLt's 1 MiB on the training thread too, and its
// backward (aten::mm only) none. The reserved prediction allocates them:
// at the step's peak the caching allocator holds the tensors and every
// workspace. A model without a matrix product holds none, and its whole
// prediction stays under one workspace.
TEST(Trial, TheReservedPredictionHoldsTheCublasWorkspacesOfTheStepsMatmuls) {
  constexpr int64_t kWorkspace = 32 * 1024 * 1024;
  constexpr int64_t kLtWorkspace = 1024 * 1024;
  TrialOptions options = quick_trial();
  options.record_events = true;
  const JobSpec mlp = mlp_job(16);
  const JobSpec no_matmul = testing::made_in_forward_job(16);
  OOMTUNE_REQUIRE_FILE(mlp.model_path);
  OOMTUNE_REQUIRE_FILE(no_matmul.model_path);
  const ProbeReport r = run_trial(mlp, baseline_config(mlp), options);
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  ASSERT_TRUE(r.workspaces && r.reserved);
  EXPECT_EQ(r.workspaces->cublas_workspaces, 2);
  EXPECT_EQ(r.workspaces->cublaslt_workspaces, 1);
  EXPECT_EQ(r.workspaces->total_bytes(), 2 * kWorkspace + kLtWorkspace);
  EXPECT_FALSE(r.workspaces->in_peaks);
  EXPECT_LT(r.peak_bytes, kWorkspace);  // the tensors alone: no workspace in the peaks
  EXPECT_GE(r.reserved->peak_reserved_bytes, r.peak_bytes + 2 * kWorkspace + kLtWorkspace);
  const ProbeReport none = run_trial(no_matmul, baseline_config(no_matmul), options);
  ASSERT_EQ(none.outcome, TrialOutcome::kOk) << none.message;
  ASSERT_TRUE(none.workspaces && none.reserved);
  EXPECT_EQ(none.workspaces->cublas_workspaces, 0);
  EXPECT_EQ(none.workspaces->cublaslt_workspaces, 0);
  EXPECT_LT(none.reserved->peak_reserved_bytes, kWorkspace);
}

// Note [The budget on a CUDA target]: a CUDA run's budget caps reserved
// bytes, the MLP's two cuBLAS workspaces included. With the usable budget
// 1 MiB above the tensors' peak, the tensors fit and a CUDA run does not:
// the capped replay runs out of memory, and the predicted figures are
// those of the trial without a budget (a cap that bounded them would hide
// how far over it the step goes). With room for the workspaces and more,
// the run fits without a flush.
TEST(Trial, TheReservedPredictionSaysWhetherACudaRunFitsTheBudget) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  TrialOptions options = quick_trial();
  options.record_events = true;
  JobSpec job = mlp_job(16);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  job.headroom = 0;
  const ProbeReport free = run_trial(job, baseline_config(job), options);
  ASSERT_EQ(free.outcome, TrialOutcome::kOk) << free.message;
  ASSERT_TRUE(free.reserved.has_value());
  EXPECT_EQ(free.reserved->budget_bytes, 0);
  EXPECT_TRUE(free.reserved->fits_budget);

  job.budget_bytes = free.peak_bytes + kMiB;
  const ProbeReport tight = run_trial(job, baseline_config(job), options);
  ASSERT_EQ(tight.outcome, TrialOutcome::kOk) << tight.message;
  ASSERT_TRUE(tight.reserved.has_value());
  EXPECT_EQ(tight.reserved->budget_bytes, *job.budget_bytes);
  EXPECT_EQ(tight.reserved->peak_reserved_bytes, free.reserved->peak_reserved_bytes);
  EXPECT_EQ(tight.reserved->segment_allocations, free.reserved->segment_allocations);
  EXPECT_FALSE(tight.reserved->fits_budget);
  // The MLP's weights, AdamW state and activations take a few MiB, so the
  // first request past them is the training thread's cuBLAS workspace at
  // its first matmul (sm90: 32 MiB), named as such, not "(unknown)".
  EXPECT_EQ(tight.reserved->failed_request_bytes, 32 * kMiB);
  EXPECT_EQ(tight.reserved->failed_op, "cuBLAS (its handle's workspace)");
  EXPECT_EQ(tight.reserved->failed_phase, Phase::kForward);

  job.budget_bytes = free.reserved->peak_reserved_bytes + 64 * kMiB;
  const ProbeReport roomy = run_trial(job, baseline_config(job), options);
  ASSERT_EQ(roomy.outcome, TrialOutcome::kOk) << roomy.message;
  EXPECT_TRUE(roomy.reserved->fits_budget);
  EXPECT_EQ(roomy.reserved->cache_flushes, 0);
  EXPECT_EQ(roomy.reserved->failed_request_bytes, 0);
}

// Note [cuDNN calls]: torchvision's ResNet-18 has 20 Conv2d and 20
// BatchNorm2d modules (17 convolutions on the main path, 3 downsample
// 1 x 1 ones), each called once a step; every convolution has a backward
// (the stem's computes its weight's gradient only). The GPT has none, and
// a CUDA trial would measure them instead.
TEST(Trial, TheCudnnLineCountsTheStepsConvolutionsAndBatchNorms) {
  const JobSpec job = testing::resnet18_job(2);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  ASSERT_TRUE(r.cudnn.has_value());
  EXPECT_EQ(r.cudnn->convolutions, 20);
  EXPECT_EQ(r.cudnn->convolution_backwards, 20);
  EXPECT_EQ(r.cudnn->batch_norms, 20);
  const JobSpec gpt = gpt_job(2);
  EXPECT_FALSE(run_trial(gpt, baseline_config(gpt), quick_trial()).cudnn.has_value());
}

// The optimizer line: the measured step's optimizer-phase peak above its
// start, from the MLP's parameter sizes alone (torch/optim/adam.py, 2.11).
TEST(Trial, TheOptimizerLineCountsEachImplementationsTemporaries) {
  JobSpec job = mlp_job(16);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  // Bytes of w1 [512, 256], b1, w2 [512, 512], b2, w3 [10, 512], b3, in order.
  const std::vector<int64_t> s = {4 * 512 * 256, 4 * 512, 4 * 512 * 512, 4 * 512, 4 * 10 * 512, 4 * 10};
  int64_t single = 2 * s[0];  // _single_tensor_adam: sqrt and quotient of one, the last denom held
  for (std::size_t i = 1; i < s.size(); ++i) single = std::max(single, s[i - 1] + 2 * s[i]);
  const std::pair<OptimizerImplementation, int64_t> expected[] = {
      {OptimizerImplementation::kForeach, 4 * kMlpParameters},  // _foreach_sqrt of every exp_avg_sq
      {OptimizerImplementation::kFused, 0},
      {OptimizerImplementation::kSingleTensor, single},
  };
  for (const auto& [implementation, bytes] : expected) {
    job.optimizer.implementation = implementation;
    const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
    ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
    EXPECT_EQ(r.optimizer.name, "adamw");
    EXPECT_EQ(r.optimizer.implementation, to_string(implementation));
    EXPECT_EQ(r.optimizer.temporary_bytes, bytes) << to_string(implementation);
    // fused keeps one float32 step count per parameter tensor on the device.
    const int64_t steps = implementation == OptimizerImplementation::kFused ? 4 * 6 : 0;
    EXPECT_EQ(r.static_memory.optimizer_state_bytes, 8 * kMlpParameters + steps) << to_string(implementation);
  }
  // Not eager torch.optim: named, not foreach-modelled.
  TrainingConfig config = baseline_config(job);
  config.optimizer = OptimizerKind::kAdamW8bit;
  EXPECT_EQ(run_trial(job, config, quick_trial()).optimizer.implementation, "");
  config = baseline_config(job);
  config.offload_optimizer = true;
  const ProbeReport offload = run_trial(job, config, quick_trial());
  EXPECT_EQ(offload.optimizer.name, "adamw");
  EXPECT_EQ(offload.optimizer.implementation, "");
}

TEST(Trial, AdafactorKeepsARowAndAColumnPerWeightMatrix) {
  const JobSpec job = mlp_job(16);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrainingConfig config = baseline_config(job);
  config.optimizer = OptimizerKind::kAdafactor;
  const ProbeReport r = run_trial(job, config, quick_trial());
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  // Weights [512, 256], [512, 512], [10, 512]: 4 (rows + columns) bytes
  // each; biases 512, 512, 10: 4 bytes per element (strategies/adafactor.h).
  const int64_t state = 4 * ((512 + 256) + (512 + 512) + (10 + 512)) + 4 * (512 + 512 + 10);
  EXPECT_EQ(r.static_memory.optimizer_state_bytes, state);
  EXPECT_EQ(r.static_memory.parameter_bytes, 4 * kMlpParameters);
  EXPECT_EQ(r.static_memory.gradient_bytes, 4 * kMlpParameters);
}

TEST(Trial, Bf16ParamsSplitsStaticMemoryAsZeroCountsMixedPrecision) {
  const JobSpec job = mlp_job(16);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrainingConfig config = baseline_config(job);
  config.precision = Precision::kBf16Params;
  const ProbeReport r = run_trial(job, config, quick_trial());
  const ProbeReport fp32 = run_trial(job, baseline_config(job), quick_trial());
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_EQ(r.precision_form, PrecisionForm::kHalfParameters);
  EXPECT_EQ(fp32.precision_form, PrecisionForm::kFp32);
  EXPECT_EQ(r.parameter_count, kMlpParameters);
  // Exact, as for fp32 (requested bytes, no rounding): bf16 parameters 2 P,
  // bf16 gradients 2 P; optimizer state = fp32 masters 4 P + AdamW's
  // exp_avg and exp_avg_sq 8 P. The masters' fp32 gradients live only
  // during the update (strategies/master_weights.h), so they are not static.
  EXPECT_EQ(r.static_memory.parameter_bytes, 2 * kMlpParameters);
  EXPECT_EQ(r.static_memory.gradient_bytes, 2 * kMlpParameters);
  EXPECT_EQ(r.static_memory.optimizer_state_bytes, 12 * kMlpParameters);
  EXPECT_EQ(r.static_memory.optimizer_host_bytes, 0);
  // The MLP has no buffers; what else load leaves alive is not cast.
  EXPECT_EQ(r.static_memory.buffer_bytes, fp32.static_memory.buffer_bytes);
  // ...but the update holds them: the optimizer phase peaks with bf16
  // weights and gradients, masters, state and fp32 gradients, 20 P.
  EXPECT_GE(r.phases[static_cast<std::size_t>(Phase::kOptimizer)].peak_bytes, 20 * kMlpParameters);
}

TEST(Trial, Bf16ParamsWithOffloadKeepsTheMastersInTheHostPool) {
  const JobSpec job = mlp_job(16);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrainingConfig config = baseline_config(job);
  config.precision = Precision::kBf16Params;
  config.offload_optimizer = true;
  const ProbeReport r = run_trial(job, config, quick_trial());
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  // Device: bf16 parameters and gradients only.
  EXPECT_EQ(r.static_memory.parameter_bytes, 2 * kMlpParameters);
  EXPECT_EQ(r.static_memory.gradient_bytes, 2 * kMlpParameters);
  EXPECT_EQ(r.static_memory.optimizer_state_bytes, 0);
  // Host: fp32 masters 4 P, their persistent fp32 gradient buffers 4 P,
  // AdamW state 8 P (ZeRO-Offload's mixed-precision split).
  EXPECT_EQ(r.static_memory.optimizer_host_bytes, 16 * kMlpParameters);
}

TEST(Trial, Bf16ParamsHalvesTheGptsBuffersButNotItsTokenPositions) {
  const JobSpec job = gpt_job(4);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrainingConfig config = baseline_config(job);
  config.precision = Precision::kBf16Params;
  const ProbeReport fp32 = run_trial(job, baseline_config(job), quick_trial());
  const ProbeReport low = run_trial(job, config, quick_trial());
  ASSERT_EQ(low.outcome, TrialOutcome::kOk) << low.message;
  // Four causal masks [1, 1, 64, 64] go from fp32 to bf16; the int64
  // positions [64] stay.
  constexpr int64_t kMaskElements = 4 * 64 * 64;
  EXPECT_EQ(fp32.static_memory.buffer_bytes - low.static_memory.buffer_bytes, kMaskElements * 2);
  const int64_t p = low.parameter_count;
  EXPECT_EQ(fp32.static_memory.parameter_bytes, 4 * p);
  EXPECT_EQ(low.static_memory.parameter_bytes, 2 * p);
  EXPECT_EQ(low.static_memory.gradient_bytes, 2 * p);
  EXPECT_EQ(low.static_memory.optimizer_state_bytes, 12 * p);
  EXPECT_LT(low.retained_activation_bytes, fp32.retained_activation_bytes);
}

TEST(Trial, SgdWithMomentumKeepsOneBufferPerParameter) {
  const JobSpec job = mlp_job(16, "sgd");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_EQ(r.static_memory.optimizer_state_bytes, 4 * kMlpParameters);
}

TEST(Trial, LargestAllocationIsTheBigMatmulInForward) {
  const int64_t batch = 64;
  const JobSpec job = bigmatmul_job(batch);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  // The output [64, 8192] fp32 (2 MiB) and the weight's gradient [256,
  // 8192] (8 MiB) are the candidates; AdamW's state for the weight is made
  // in the warm-up step, so in the measured step the weight gradient made by
  // MmBackward is the largest.
  EXPECT_EQ(r.largest.bytes, 256 * 8192 * 4);
  EXPECT_EQ(r.largest.phase, Phase::kBackward);
  EXPECT_NE(r.largest.op.find("MmBackward"), std::string::npos) << r.largest.op;
  EXPECT_NE(r.largest.op.find("mm"), std::string::npos) << r.largest.op;
}

TEST(Trial, LargestForwardAllocationIsTheMatmulOutput) {
  // With a batch whose output exceeds the weight gradient, the forward
  // matmul's output is the largest: [512, 8192] fp32 = 16 MiB.
  const int64_t batch = 512;
  const JobSpec job = bigmatmul_job(batch);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrialOptions options = quick_trial();
  const ProbeReport r = run_trial(job, baseline_config(job), options);
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_EQ(r.largest.bytes, batch * 8192 * 4);
  EXPECT_EQ(r.largest.phase, Phase::kForward);
  EXPECT_NE(r.largest.op.find("matmul"), std::string::npos) << r.largest.op;
}

TEST(Trial, RetainedActivationsGrowLinearlyWithBatchOnTheExampleGpt) {
  std::vector<double> batches, retained;
  for (int64_t b : {2, 4, 8}) {
    const JobSpec job = gpt_job(b);
    OOMTUNE_REQUIRE_FILE(job.model_path);
    const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
    ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
    batches.push_back(static_cast<double>(b));
    retained.push_back(static_cast<double>(r.retained_activation_bytes));
  }
  const LinearFit fit = fit_line(batches, retained);
  EXPECT_GT(fit.slope, 0);
  EXPECT_LT(fit.max_relative_residual, 0.02);
  // Backward peak holds at least what forward retained.
  const JobSpec job = gpt_job(8);
  const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
  EXPECT_GE(r.phases[static_cast<std::size_t>(Phase::kBackward)].peak_bytes,
            r.phases[static_cast<std::size_t>(Phase::kForward)].start_bytes + r.retained_activation_bytes);
}

// Backward's activation peak (probes/backward_activation_peak.h) on the
// example GPT (sequence 64, vocabulary 1000), against the tracker's own
// phase counts and the logits' size.
TEST(Trial, BackwardActivationPeakOnTheExampleGpt) {
  const int64_t batch = 8;
  const JobSpec job = gpt_job(batch);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrialOptions options = quick_trial();
  options.record_events = true;
  const ProbeReport r = run_trial(job, baseline_config(job), options);
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  const PhaseMemory& backward = r.phases[static_cast<std::size_t>(Phase::kBackward)];
  const BackwardActivationPeak& a = r.backward_activation_peak;
  // A moment of backward: within its peak, with some of its gradients.
  EXPECT_LE(a.live_bytes, backward.peak_bytes);
  EXPECT_GE(a.gradient_bytes, 0);
  EXPECT_LE(a.gradient_bytes, r.static_memory.gradient_bytes);
  // The highest without gradients: at least the end of backward's (every
  // gradient made) ...
  EXPECT_GE(a.live_bytes - a.gradient_bytes, backward.end_bytes - r.static_memory.gradient_bytes);
  // ... and at least the start plus the gradient of the logits, [8, 64,
  // 1000] fp32, which cross-entropy's backward makes before any parameter
  // gradient.
  EXPECT_GE(a.live_bytes - a.gradient_bytes, backward.start_bytes + batch * 64 * 1000 * 4);
  // As a later micro-batch, less the stored gradients: at least that moment
  // (a gradient made then would be pending, not stored), and no more than
  // the phase's peak (a pending gradient is one this backward keeps).
  EXPECT_GE(a.accumulating_bytes, a.live_bytes - a.gradient_bytes);
  EXPECT_LE(a.accumulating_bytes, backward.peak_bytes);
  // By gradients made (Note [Backward by gradients]): a level before the
  // first and one per parameter tensor, 53 of them (tok_emb, pos_emb; per
  // block of 4 two LayerNorms, qkv, proj and the MLP's two Linears, each
  // with a weight and a bias; ln_f's two; the head's weight), ending with
  // every gradient byte; the highest of them is backward's peak, and as a
  // later micro-batch runs them, its accumulating moment.
  ASSERT_EQ(a.by_gradients.size(), 54u);
  EXPECT_EQ(a.by_gradients.front().gradient_bytes, 0);
  EXPECT_EQ(a.by_gradients.back().gradient_bytes, r.static_memory.gradient_bytes);
  int64_t highest = 0, highest_accumulating = 0;
  for (const GradientLevel& level : a.by_gradients) {
    highest = std::max(highest, level.live_bytes);
    highest_accumulating = std::max(highest_accumulating, level.accumulating_bytes);
    EXPECT_GE(level.accumulating_bytes, level.live_bytes - level.gradient_bytes);
  }
  for (std::size_t k = 1; k < a.by_gradients.size(); ++k)
    EXPECT_GT(a.by_gradients[k].gradient_bytes, a.by_gradients[k - 1].gradient_bytes) << k;
  EXPECT_EQ(highest, backward.peak_bytes);
  EXPECT_EQ(highest_accumulating, a.accumulating_bytes);
  // It crosses the child-trial pipe.
  const ProbeReport carried = probe_report_from_json(to_json(r));
  EXPECT_EQ(carried.backward_activation_peak.live_bytes, a.live_bytes);
  EXPECT_EQ(carried.backward_activation_peak.gradient_bytes, a.gradient_bytes);
  EXPECT_EQ(carried.backward_activation_peak.accumulating_bytes, a.accumulating_bytes);
  EXPECT_EQ(carried.backward_activation_peak.by_gradients, a.by_gradients);
  // Without the event stream it is not measured.
  EXPECT_EQ(run_trial(job, baseline_config(job), quick_trial()).backward_activation_peak.live_bytes, 0);
}

// probes/peak_composition.h: the blocks live at the step's peak add up to
// the peak, and those from before the step are the static split measured
// apart: the model loaded outside any operator (its parameters, 4 P with
// no buffers), and AdamW's state made in the warm-up's optimizer (8 P).
TEST(Trial, ThePeakCompositionAddsUpToThePeakAndHoldsTheStaticSplit) {
  const JobSpec job = mlp_job(16);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrialOptions options = quick_trial();
  options.record_events = true;
  const ProbeReport r = run_trial(job, baseline_config(job), options);
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  const PeakComposition& c = r.peak_composition;
  EXPECT_EQ(c.live_bytes, r.peak_bytes);
  EXPECT_EQ(r.phases[static_cast<std::size_t>(c.phase)].peak_bytes, r.peak_bytes);
  int64_t sum = 0, loaded = 0, state = 0;
  for (const PeakShare& s : c.shares) {
    sum += s.bytes;
    if (s.earlier_step && s.phase == Phase::kLoad) loaded += s.bytes;
    if (s.earlier_step && s.phase == Phase::kOptimizer) state += s.bytes;
  }
  EXPECT_EQ(sum, c.live_bytes);
  EXPECT_EQ(loaded, 4 * kMlpParameters);
  EXPECT_EQ(state, 8 * kMlpParameters);
  // Without the event stream it is not measured.
  EXPECT_EQ(run_trial(job, baseline_config(job), quick_trial()).peak_composition.live_bytes, 0);
}

TEST(Trial, ALaterStepPeaksLikeTheMeasuredStep) {
  const JobSpec job = gpt_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrialOptions options;
  options.total_steps = 5;
  const ProbeReport r = run_trial(job, baseline_config(job), options);
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_EQ(r.steps_run, 5);
  int64_t measured = 0;
  for (const PhaseMemory& p : r.phases) measured = std::max(measured, p.peak_bytes);
  // r.peak_bytes covers steps 2..5; the measured step is step 2.
  EXPECT_LE(std::abs(r.peak_bytes - measured), measured / 100);
  EXPECT_EQ(r.timing.warmup_steps, 1);
  EXPECT_EQ(r.timing.step_seconds.size(), 4u);
  // Each timed step's optimizer phase is a part of it (Note [Step time] in
  // search/memory_model.cpp), and the parent reads it back from JSON.
  ASSERT_EQ(r.timing.optimizer_seconds.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_GT(r.timing.optimizer_seconds[i], 0);
    EXPECT_LT(r.timing.optimizer_seconds[i], r.timing.step_seconds[i]);
  }
  std::vector<double> sorted = r.timing.optimizer_seconds;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_DOUBLE_EQ(r.timing.steady_optimizer_seconds, 0.5 * (sorted[1] + sorted[2]));
  const ProbeReport carried = probe_report_from_json(to_json(r));
  EXPECT_EQ(carried.timing.optimizer_seconds, r.timing.optimizer_seconds);
  EXPECT_EQ(carried.timing.steady_optimizer_seconds, r.timing.steady_optimizer_seconds);
}

// The device out of memory outside the caching allocator is out of memory
// too (the messages as an H200 shared by six processes gave them,
// 2026-11-29); its line is the one that says so, not the interpreter's.
TEST(Trial, TheDevicesOwnOutOfMemoryErrorsAreOutOfMemory) {
  const std::runtime_error runtime(
      "The following operation failed in the TorchScript interpreter.\nRuntimeError: CUDA error: out of memory\n"
      "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.");
  EXPECT_TRUE(is_out_of_memory(runtime));
  EXPECT_EQ(out_of_memory_message(runtime), "CUDA error: out of memory");
  const std::runtime_error cublas("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`");
  EXPECT_TRUE(is_out_of_memory(cublas));
  EXPECT_EQ(out_of_memory_message(cublas), "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`");
  EXPECT_FALSE(is_out_of_memory(std::runtime_error("CUDA error: an illegal memory access was encountered")));
}

TEST(Trial, ABudgetTooSmallIsAnOutOfMemoryOutcome) {
  JobSpec job = gpt_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  job.budget_bytes = 16LL << 20;  // the GPT's parameters alone are ~4 MiB, AdamW adds 8 MiB
  job.headroom = 0;
  const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
  EXPECT_EQ(r.outcome, TrialOutcome::kOutOfMemory);
  EXPECT_NE(r.message.find("oomtune budget: tried to allocate"), std::string::npos) << r.message;
  EXPECT_TRUE(r.phase_at_failure.has_value());
  // The tensors may pass the budget by what the one kernel call that took
  // them past it left behind, found at the next allocation (Note [Budget
  // and kernel scratch] in probes/memory_tracker.cpp): 134,656 B on 1.13.
  EXPECT_LE(r.peak_bytes, (16LL << 20) + (1LL << 20));
}

TEST(Trial, TheOptimizingExecutorIsOptIn) {
  JobSpec job = mlp_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  EXPECT_FALSE(run_trial(job, baseline_config(job), quick_trial()).optimizing_executor);
  job.optimizing_executor = true;
  EXPECT_TRUE(run_trial(job, baseline_config(job), quick_trial()).optimizing_executor);
}

// A checkpointed block class whose forward modifies its input in place.
struct RefusalCase {
  std::string model;        // test model
  std::string block_class;  // the refused class
  std::string phase;        // when it was found
  std::string message;      // part of the report's message
};

class RefusedCheckpoint : public ::testing::TestWithParam<RefusalCase> {};

// The decoder's blocks scale their input in place, so checkpointing them
// would recompute from the scaled values. The trial returns a report with
// outcome "error" instead of throwing: it names the class and the
// checkpointed blocks of other classes, and those alone train. The refusal
// survives the JSON that carries a child trial's report. encoder_decoder.pt
// shows its x.mul_(0.5) in the graph, so the step never runs (phase "load",
// the message names the line); encoder_decoder_branch.pt's sits under an
// `if` the graph cannot decide, so the recompute operator refuses it at the
// first checkpointed forward.
TEST_P(RefusedCheckpoint, NamesItsClassAndTheBlocksLeft) {
  const RefusalCase& c = GetParam();
  const JobSpec job = encoder_decoder_job(8, c.model);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrainingConfig config = baseline_config(job);
  config.checkpoint = parse_checkpoint_plan("all");
  const ProbeReport refused = run_trial(job, config, quick_trial());
  EXPECT_EQ(refused.outcome, TrialOutcome::kError);
  EXPECT_EQ(refused.phase_at_failure, phase_from_name(c.phase));
  EXPECT_NE(refused.message.find(c.message), std::string::npos) << refused.message;
  EXPECT_EQ(refused.refused_checkpoint_class, c.block_class);
  const std::vector<std::string> encoder = {"encoder.0", "encoder.1"};
  EXPECT_EQ(refused.other_checkpointed_blocks, encoder);
  const std::vector<std::string> all = {"encoder.0", "encoder.1", "decoder.0", "decoder.1"};
  EXPECT_EQ(refused.checkpointed_blocks, all);
  const ProbeReport carried = probe_report_from_json(to_json(refused));
  EXPECT_EQ(carried.refused_checkpoint_class, refused.refused_checkpoint_class);
  EXPECT_EQ(carried.other_checkpointed_blocks, encoder);

  config.checkpoint = parse_checkpoint_plan("paths:encoder.0+encoder.1");
  const ProbeReport rest = run_trial(job, config, quick_trial());
  ASSERT_EQ(rest.outcome, TrialOutcome::kOk) << rest.message;
  EXPECT_EQ(rest.checkpointed_blocks, encoder);
  EXPECT_TRUE(rest.refused_checkpoint_class.empty());
  EXPECT_TRUE(probe_report_from_json(to_json(rest)).refused_checkpoint_class.empty());
}

INSTANTIATE_TEST_SUITE_P(
    Trial, RefusedCheckpoint,
    ::testing::Values(
        RefusalCase{"encoder_decoder", "__torch__.Halving", "load",
                    "cannot checkpoint 'decoder.0': forward of __torch__.Halving modifies its argument x in place "
                    "(aten::mul_ at "},
        RefusalCase{"encoder_decoder_branch", "__torch__.BranchHalving", "forward",
                    "forward of __torch__.BranchHalving modified its argument x in place"}),
    [](const ::testing::TestParamInfo<RefusalCase>& info) {
      return info.param.phase == "load" ? std::string("FoundInTheGraph") : std::string("FoundAtRunTime");
    });

}  // namespace
}  // namespace oomtune
