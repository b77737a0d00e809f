// scaled_dot_product_attention for a CUDA target (issue #46 item 3): a model
// with SDPA probed on meta or on the CPU allocates what the CUDA kernel
// allocates, not the B·H·T·T scores of the math path that meta (and the CPU
// with dropout) would take. Expectations are written from B, H, T, E here
// (Note [SDPA kernel bytes] in probes/attention_model.cpp). The model is
// tests/core/make_sdpa_model.py's (PyTorch 2 exports it); libtorch 1.13
// cannot load it.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>
#include "compat/torch_compat.h"

#include "probes/attention_model.h"
#include "strategies/attention_op.h"
#include "strategies/training_config.h"
#include "support/build_values.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

constexpr int64_t kBatch = 2, kHeads = 2, kLength = 256, kHeadDim = 16, kChannels = 32;

JobSpec attention_job(const std::string& model, Device device, const std::string& target, int64_t length = kLength) {
  JobSpec job;
  job.model_path = std::string(testing::kTestModels) + "/" + model;
  job.inputs = {InputSpec{"x", {kBatchDim, length, kChannels}, "float32", std::nullopt, std::nullopt}};
  job.loss.kind = LossSpec::Kind::kMean;
  job.global_batch = kBatch;
  job.device = device;
  job.cuda_target = target;
  return job;
}

ProbeReport probe(const JobSpec& job, const std::string& precision = "fp32") {
  TrainingConfig config;
  config.micro_batch = kBatch;
  config.accumulation_steps = 1;
  config.precision = parse_precision(precision);
  TrialOptions options;
  options.min_timed_steps = 1;
  options.max_timed_steps = 1;
  options.enforce_budget = false;
  options.record_events = true;
  return run_trial(job, config, options);
}

constexpr int64_t kScores = kBatch * kHeads * kLength * kLength;  // COUNT: one head's T x T, all heads

// The test: on meta for an sm80 target, fp32 → the efficient kernel:
// output [B, T, H, E] fp32 + logsumexp [B, H, round32(T)] fp32, not T x T.
TEST(Attention, MetaProbeKeepsTheFusedKernelsBytesNotTheScores) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  const JobSpec job = attention_job("attention_sdpa.pt", Device::kMeta, "sm80");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = probe(job);
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  ASSERT_TRUE(r.attention);
  EXPECT_EQ(r.attention->calls[static_cast<std::size_t>(AttentionKernel::kEfficient)], 1);
  EXPECT_EQ(r.attention->total_calls(), 1);
  EXPECT_EQ(r.attention->kept_bytes, kBatch * kLength * kHeads * kHeadDim * 4 + kBatch * kHeads * kLength * 4);
  EXPECT_EQ(r.attention->math_kept_bytes, 2 * kBatch * kHeads * kLength * kHeadDim * 4 + kScores * 4);
  // Retained: the loss (4 B), the qkv projection's output [B, T, 3C] that
  // query, key and value view, and what the kernel keeps; the output
  // projection's input is a view of the kernel's output ([B, T, H, E]
  // memory), so no copy.
  EXPECT_EQ(r.retained_activation_bytes, 4 + kBatch * kLength * 3 * kChannels * 4 + r.attention->kept_bytes);
  // No T x T block anywhere in the step.
  EXPECT_LT(r.largest.bytes, kScores * 4) << r.largest.op;
  ASSERT_TRUE(r.workspaces);
  EXPECT_EQ(r.workspaces->cublas_bytes, 8519680);
}

// bf16 parameters on sm80: the flash kernel, output bf16 + logsumexp fp32 +
// 24 bytes of RNG state.
TEST(Attention, MetaProbeOfBf16ParametersUsesFlashOnSm80) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  const JobSpec job = attention_job("attention_sdpa.pt", Device::kMeta, "sm80");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = probe(job, "bf16_params");
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  ASSERT_TRUE(r.attention);
  EXPECT_EQ(r.attention->calls[static_cast<std::size_t>(AttentionKernel::kFlash)], 1);
  EXPECT_EQ(r.attention->kept_bytes, kBatch * kLength * kHeads * kHeadDim * 2 + kBatch * kHeads * kLength * 4 + 24);
  EXPECT_EQ(r.retained_activation_bytes, 4 + kBatch * kLength * 3 * kChannels * 2 + r.attention->kept_bytes);
  EXPECT_LT(r.largest.bytes, kScores * 2) << r.largest.op;
}

// The same job on the CPU: the same record and the same retained activations
// as on meta (the CPU's own flash kernel's temporaries are kernel scratch).
TEST(Attention, CpuProbeCountsWhatMetaCounts) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  const JobSpec job = attention_job("attention_sdpa.pt", Device::kMeta, "sm80");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport meta = probe(job);
  const ProbeReport cpu = probe(attention_job("attention_sdpa.pt", Device::kCpu, "sm80"));
  ASSERT_EQ(cpu.outcome, TrialOutcome::kOk) << cpu.message;
  ASSERT_TRUE(cpu.attention);
  EXPECT_EQ(cpu.attention->kept_bytes, meta.attention->kept_bytes);
  EXPECT_EQ(cpu.retained_activation_bytes, meta.retained_activation_bytes);
  EXPECT_EQ(cpu.phases[static_cast<std::size_t>(Phase::kForward)].peak_bytes -
                cpu.phases[static_cast<std::size_t>(Phase::kForward)].start_bytes,
            meta.phases[static_cast<std::size_t>(Phase::kForward)].peak_bytes -
                meta.phases[static_cast<std::size_t>(Phase::kForward)].start_bytes);
  EXPECT_LT(cpu.largest.bytes, kScores * 4) << cpu.largest.op;
}

// With a boolean mask on sm90 in bf16 (cuDNN): CPU and meta agree too.
TEST(Attention, CpuProbeOfTheMaskedModelCountsWhatMetaCounts) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  const JobSpec job = attention_job("attention_sdpa_mask.pt", Device::kMeta, "sm90");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport meta = probe(job, "bf16_params");
  const ProbeReport cpu = probe(attention_job("attention_sdpa_mask.pt", Device::kCpu, "sm90"), "bf16_params");
  ASSERT_EQ(cpu.outcome, TrialOutcome::kOk) << cpu.message;
  ASSERT_TRUE(cpu.attention && meta.attention);
  EXPECT_EQ(cpu.attention->calls, meta.attention->calls);
  EXPECT_EQ(cpu.retained_activation_bytes, meta.retained_activation_bytes);
}

// oomtune::scaled_dot_product_attention, registered, as the dispatcher calls it.
c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const std::optional<at::Tensor>&, double, bool, std::optional<double>, bool)>
attention_operator() {
  ensure_attention_op_registered();
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(kAttentionOpName, "")
      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                        double, bool, std::optional<double>, bool)>();
}

// On the CPU the operator computes what ATen's SDPA computes, values and
// gradients, for each kernel it stands in for, dropout included.
TEST(Attention, CpuValuesAndGradientsMatchAten) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  const auto op = attention_operator();
  for (const char* name : {"sm80", "sm90"}) {
    set_attention_target(*cuda_target_from_name(name));
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      for (const bool masked : {false, true}) {
        at::manual_seed(0);
        const auto options = at::TensorOptions().dtype(dtype);
        const at::Tensor q = at::randn({2, 2, 64, 16}, options).requires_grad_();
        const at::Tensor k = at::randn({2, 2, 64, 16}, options).requires_grad_();
        const at::Tensor v = at::randn({2, 2, 64, 16}, options).requires_grad_();
        const std::optional<at::Tensor> mask =
            masked ? std::optional<at::Tensor>(at::ones({64, 64}, at::kBool).tril()) : std::nullopt;
        // With dropout, each draws its masks from the same generator state;
        // the operator's backward draws its forward's again.
        const double dropout = masked ? 0.25 : 0.0;
        at::manual_seed(1);
        const at::Tensor ours = op.call(q, k, v, mask, dropout, !masked, std::nullopt, false);
        at::manual_seed(1);
        const at::Tensor theirs = at::scaled_dot_product_attention(q, k, v, mask, dropout, !masked);
        const at::Tensor g = at::randn_like(theirs);
        const auto ours_grads = torch::autograd::grad({ours}, {q, k, v}, {g});
        const auto their_grads = torch::autograd::grad({theirs}, {q, k, v}, {g});
        const double tolerance = dtype == at::kFloat ? 1e-5 : 2e-2;
        EXPECT_TRUE(at::allclose(ours, theirs, tolerance, tolerance)) << name << " " << dtype << " " << masked;
        for (std::size_t i = 0; i < 3; ++i)
          EXPECT_TRUE(at::allclose(ours_grads[i], their_grads[i], tolerance, tolerance))
              << name << " " << dtype << " " << masked << " gradient " << i;
      }
    }
  }
  take_attention_record();
  set_attention_target(CudaTarget{});
}

// A learned bias as the mask (attention_sdpa_bias.pt: a parameter [H, 256,
// 256] cut to [1, H, T, T], as T5's relative position bias reaches SDPA):
// the bias parameter trains, so every parameter has its gradient and its
// AdamW state (they were short of the bias's before, the mask's gradient
// being None). On sm80 in fp32 the efficient kernel's backward makes the
// gradient at [B, H, T, round16(T)]; T = 250 takes the padding path.
constexpr int64_t kBiasLength = 250;

TEST(Attention, ALearnedBiasGetsItsGradientAtTheBroadcastSize) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  const JobSpec job = attention_job("attention_sdpa_bias.pt", Device::kMeta, "sm80", kBiasLength);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = probe(job);
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  const int64_t bias_bytes = int64_t{kHeads} * 256 * 256 * 4;
  const int64_t parameter_bytes =
      (kChannels * 3 * kChannels + 3 * kChannels + kChannels * kChannels + kChannels) * 4 + bias_bytes;
  EXPECT_EQ(r.static_memory.parameter_bytes, parameter_bytes);
  EXPECT_EQ(r.static_memory.gradient_bytes, parameter_bytes);
  EXPECT_EQ(r.static_memory.optimizer_state_bytes, 2 * parameter_bytes);
  ASSERT_TRUE(r.attention);
  EXPECT_EQ(r.attention->calls[static_cast<std::size_t>(AttentionKernel::kEfficient)], 1);
  EXPECT_EQ(r.attention->mask_gradient_calls, 1);
  EXPECT_EQ(r.attention->cudnn_passed_over_calls, 0);
  const int64_t broadcast_gradient = kBatch * kHeads * kBiasLength * 256 * 4;  // round16(250) = 256
  EXPECT_EQ(r.attention->largest_mask_gradient_bytes, broadcast_gradient);
  // Nothing else in the step is as large (the bias parameter is 512 KiB).
  EXPECT_EQ(r.largest.bytes, broadcast_gradient) << r.largest.op;
}

// The same on the CPU counts what meta counts; on sm90 in bf16, where
// PyTorch would prefer cuDNN, the call is counted as the efficient kernel
// and the record says cuDNN was passed over.
TEST(Attention, ALearnedBiasOnTheCpuCountsWhatMetaCountsAndPassesOverCudnn) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  for (const char* precision : {"fp32", "bf16_params"}) {
    const JobSpec job = attention_job("attention_sdpa_bias.pt", Device::kMeta, "sm90", kBiasLength);
    OOMTUNE_REQUIRE_FILE(job.model_path);
    const ProbeReport meta = probe(job, precision);
    const ProbeReport cpu =
        probe(attention_job("attention_sdpa_bias.pt", Device::kCpu, "sm90", kBiasLength), precision);
    ASSERT_EQ(meta.outcome, TrialOutcome::kOk) << meta.message;
    ASSERT_EQ(cpu.outcome, TrialOutcome::kOk) << cpu.message;
    ASSERT_TRUE(cpu.attention && meta.attention);
    EXPECT_EQ(cpu.attention->calls[static_cast<std::size_t>(AttentionKernel::kEfficient)], 1) << precision;
    EXPECT_EQ(cpu.attention->cudnn_passed_over_calls, std::string(precision) == "fp32" ? 0 : 1) << precision;
    EXPECT_EQ(cpu.attention->calls, meta.attention->calls);
    EXPECT_EQ(cpu.attention->largest_mask_gradient_bytes, meta.attention->largest_mask_gradient_bytes);
    EXPECT_EQ(cpu.static_memory.gradient_bytes, cpu.static_memory.parameter_bytes) << precision;
    EXPECT_EQ(cpu.retained_activation_bytes, meta.retained_activation_bytes) << precision;
    for (const Phase phase : {Phase::kForward, Phase::kBackward}) {
      const PhaseMemory& c = cpu.phases[static_cast<std::size_t>(phase)];
      const PhaseMemory& m = meta.phases[static_cast<std::size_t>(phase)];
      EXPECT_EQ(c.peak_bytes - c.start_bytes, m.peak_bytes - m.start_bytes) << precision << " " << phase_name(phase);
    }
  }
}

// A learned bias through the operator, against ATen: values and the
// gradients of query, key, value and the bias, with a key length (40) that
// takes the efficient kernel's padding.
TEST(Attention, CpuGradientOfALearnedBiasMatchesAten) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  const auto op = attention_operator();
  for (const char* name : {"sm80", "sm90"}) {
    set_attention_target(*cuda_target_from_name(name));
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      for (const double dropout : {0.0, 0.25}) {
        at::manual_seed(0);
        const auto options = at::TensorOptions().dtype(dtype);
        const at::Tensor q = at::randn({2, 2, 64, 16}, options).requires_grad_();
        const at::Tensor k = at::randn({2, 2, 40, 16}, options).requires_grad_();
        const at::Tensor v = at::randn({2, 2, 40, 16}, options).requires_grad_();
        const at::Tensor bias = at::randn({1, 2, 64, 40}, options).requires_grad_();
        at::manual_seed(1);
        const at::Tensor ours = op.call(q, k, v, bias, dropout, false, std::nullopt, false);
        at::manual_seed(1);
        const at::Tensor theirs = at::scaled_dot_product_attention(q, k, v, bias, dropout, false);
        const at::Tensor g = at::randn_like(theirs);
        const auto ours_grads = torch::autograd::grad({ours}, {q, k, v, bias}, {g});
        const auto their_grads = torch::autograd::grad({theirs}, {q, k, v, bias}, {g});
        const double tolerance = dtype == at::kFloat ? 1e-5 : 2e-2;
        EXPECT_TRUE(at::allclose(ours, theirs, tolerance, tolerance)) << name << " " << dtype << " " << dropout;
        for (std::size_t i = 0; i < 4; ++i) {
          ASSERT_TRUE(ours_grads[i].defined()) << name << " " << dtype << " gradient " << i;
          EXPECT_EQ(ours_grads[i].sizes(), their_grads[i].sizes());
          EXPECT_TRUE(at::allclose(ours_grads[i], their_grads[i], tolerance, tolerance))
              << name << " " << dtype << " " << dropout << " gradient " << i;
        }
      }
    }
  }
  take_attention_record();
  set_attention_target(CudaTarget{});
}

// A model without scaled_dot_product_attention: no attention line, but
// the cuBLAS workspaces of its matmuls on the job's CUDA target (the
// default, sm90: two handles of 32 MiB; issue #46 item 6).
TEST(Attention, ModelWithoutAttentionHasNoAttentionRecordButItsWorkspaces) {
  const JobSpec job = testing::gpt_job(2);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = probe(job);
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_FALSE(r.attention);
  ASSERT_TRUE(r.workspaces);
  EXPECT_EQ(r.workspaces->cublas_bytes, 32 * 1024 * 1024);
  EXPECT_EQ(r.workspaces->cublas_workspaces, 2);
  EXPECT_FALSE(r.workspaces->cudnn_attention);
}

// A boolean mask on the default target (sm90, cuDNN preferred) in bf16: the
// cuDNN kernel keeps output, logsumexp [B, H, T, 1] and the mask converted
// to a bf16 bias [T, T].
TEST(Attention, MaskedCallOnSm90RunsCudnnAndKeepsTheBias) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  const JobSpec job = attention_job("attention_sdpa_mask.pt", Device::kMeta, "sm90");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = probe(job, "bf16_params");
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  ASSERT_TRUE(r.attention);
  EXPECT_EQ(r.attention->calls[static_cast<std::size_t>(AttentionKernel::kCudnn)], 1);
  EXPECT_EQ(r.attention->kept_bytes,
            kBatch * kLength * kHeads * kHeadDim * 2 + kBatch * kHeads * kLength * 4 + kLength * kLength * 2);
  // The boolean mask itself is not kept, only the kernel's bias.
  EXPECT_EQ(r.retained_activation_bytes, 4 + kBatch * kLength * 3 * kChannels * 2 + r.attention->kept_bytes);
  ASSERT_TRUE(r.workspaces);
  EXPECT_TRUE(r.workspaces->cudnn_attention);
  EXPECT_EQ(r.workspaces->cublas_bytes, 32 * 1024 * 1024);
}

}  // namespace
}  // namespace oomtune
