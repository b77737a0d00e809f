// Dropout as a CUDA run makes it (issue #46 item 6): aten::dropout on CUDA
// runs the fused native_dropout, which keeps a 1-byte mask for backward;
// the CPU's and meta's composite dropout keeps noise of the input's dtype.
// The trial puts oomtune::dropout in its place (strategies/dropout_op.h), so
// a CPU or meta probe keeps CUDA's bytes. Expectations are written from the
// models' shapes (tests/core/make_test_models.py, DropoutMLP: x [B, 256] ->
// Linear 512 -> dropout -> Linear 10).

#include <map>
#include <string>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/serialization/import.h>

#include "compat/torch_compat.h"
#include "probes/dropout_record.h"
#include "strategies/activation_checkpointing.h"
#include "strategies/dropout_op.h"
#include "strategies/kernel_rewrite.h"
#include "strategies/training_config.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune::dropout_test {
namespace {

constexpr int64_t kBatch = 8;
constexpr int64_t kHidden = 512;                // fc1's outputs, the dropped tensor's width
constexpr int64_t kDropped = kBatch * kHidden;  // COUNT: elements of the dropped tensor

JobSpec dropout_job(const std::string& model, Device device = Device::kCpu) {
  JobSpec job = testing::mlp_job(kBatch);
  job.model_path = testing::test_model(model);
  job.device = device;
  return job;
}

ProbeReport probe(const JobSpec& job) {
  TrainingConfig config;
  config.micro_batch = kBatch;
  config.accumulation_steps = 1;
  TrialOptions options = testing::quick_trial();
  options.enforce_budget = false;
  return run_trial(job, config, options);
}

ProbeReport probe_ok(const std::string& model, Device device = Device::kCpu) {
  const JobSpec job = dropout_job(model, device);
  const ProbeReport r = probe(job);
  EXPECT_EQ(r.outcome, TrialOutcome::kOk) << model << ": " << r.message;
  return r;
}

// With p = 0.5 the second Linear saves the dropout's output instead of the
// first one's (the same bytes), and the mask is kept besides: one byte an
// element, not the four of the CPU's fp32 noise.
TEST(Dropout, CpuProbeKeepsCudasOneByteMask) {
  OOMTUNE_REQUIRE_FILE(testing::test_model("dropout_mlp"));
  const ProbeReport dropped = probe_ok("dropout_mlp");
  const ProbeReport plain = probe_ok("dropout_mlp_p0");
  EXPECT_EQ(dropped.retained_activation_bytes - plain.retained_activation_bytes, kDropped);
  ASSERT_TRUE(dropped.dropout);
  EXPECT_EQ(dropped.dropout->calls, 1);
  EXPECT_EQ(dropped.dropout->kept_bytes, kDropped);
  EXPECT_EQ(dropped.dropout->composite_kept_bytes, kDropped * 4);
  // p = 0 is the identity on every device: nothing to count.
  EXPECT_FALSE(plain.dropout);
}

// A model traced in training mode calls aten::dropout in its own graph, not
// through torch.nn.functional.dropout: the same bytes.
TEST(Dropout, TracedModelKeepsWhatTheScriptedOneKeeps) {
  OOMTUNE_REQUIRE_FILE(testing::test_model("dropout_mlp_trace"));
  const ProbeReport traced = probe_ok("dropout_mlp_trace");
  const ProbeReport scripted = probe_ok("dropout_mlp");
  EXPECT_EQ(traced.retained_activation_bytes, scripted.retained_activation_bytes);
  ASSERT_TRUE(traced.dropout);
  EXPECT_EQ(traced.dropout->kept_bytes, kDropped);
}

// In-place dropout takes the composite path on CUDA too (Dropout.cpp:
// dropout_ never calls the fused kernel): its noise is kept, in fp32.
TEST(Dropout, InPlaceDropoutKeepsItsNoiseAsOnCuda) {
  OOMTUNE_REQUIRE_FILE(testing::test_model("dropout_mlp_inplace"));
  const ProbeReport in_place = probe_ok("dropout_mlp_inplace");
  const ProbeReport plain = probe_ok("dropout_mlp_p0");
  EXPECT_EQ(in_place.retained_activation_bytes - plain.retained_activation_bytes, kDropped * 4);
  EXPECT_FALSE(in_place.dropout);
}

// On meta the same storages: native_dropout's meta kernel (probes/
// meta_kernels.h) makes the mask and the output the CPU kernel makes.
TEST(Dropout, MetaProbeCountsWhatTheCpuCounts) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  OOMTUNE_REQUIRE_FILE(testing::test_model("dropout_mlp"));
  const ProbeReport cpu = probe_ok("dropout_mlp");
  const ProbeReport meta = probe_ok("dropout_mlp", Device::kMeta);
  for (std::size_t p = 0; p < kNumPhases; ++p) {
    EXPECT_EQ(meta.phases[p].peak_bytes, cpu.phases[p].peak_bytes) << phase_name(static_cast<Phase>(p));
    EXPECT_EQ(meta.phases[p].end_bytes, cpu.phases[p].end_bytes) << phase_name(static_cast<Phase>(p));
  }
  EXPECT_EQ(meta.retained_activation_bytes, cpu.retained_activation_bytes);
  ASSERT_TRUE(meta.dropout && cpu.dropout);
  EXPECT_EQ(meta.dropout->kept_bytes, cpu.dropout->kept_bytes);
}

// On the CPU the operator is a dropout: each element zeroed or scaled by
// 1 / (1 - p), about p of them zeroed, and the gradient is the same mask
// times the scale. Evaluation and p = 0 return the input.
TEST(Dropout, CpuValuesAndGradientsAreADropouts) {
  ensure_dropout_op_registered();
  const auto op = c10::Dispatcher::singleton()
                      .findSchemaOrThrow(kDropoutOpName, "")
                      .typed<at::Tensor(const at::Tensor&, double, bool)>();
  at::manual_seed(0);
  const at::Tensor x = (at::rand({100000}) + 1).requires_grad_();  // no zeros
  const at::Tensor y = op.call(x, 0.25, true);
  const at::Tensor kept = y.detach() != 0;
  EXPECT_TRUE(at::allclose(y.detach(), x.detach() * kept / 0.75));
  const double dropped = 1.0 - kept.to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(dropped, 0.25, 0.01);
  const at::Tensor g = torch::autograd::grad({y.sum()}, {x})[0];
  EXPECT_TRUE(at::allclose(g, kept.to(at::kFloat) / 0.75));
  EXPECT_TRUE(at::equal(op.call(x, 0.25, false), x.detach()));
  EXPECT_TRUE(at::equal(op.call(x, 0.0, true), x.detach()));
  const DropoutRecord record = take_dropout_record();
  EXPECT_EQ(record.calls, 1);
  EXPECT_EQ(record.kept_bytes, 100000);
}

using Gradients = std::map<std::string, at::Tensor>;

// One backward of the example GPT (dropout 0.1) with its dropouts replaced,
// checkpointed or not, with masks drawn from `mask_seed`.
Gradients gpt_gradients(bool checkpointed, uint64_t mask_seed) {
  torch::jit::Module gpt = torch::jit::load(testing::example_model("gpt"));
  EXPECT_EQ(replace_device_kernels(gpt).dropout, 1);  // in torch.nn.functional.dropout, which all nine call
  if (checkpointed) apply_checkpointing(gpt, parse_checkpoint_plan("all"));
  gpt.train(true);
  at::manual_seed(7);
  const at::Tensor tokens = at::randint(0, 1000, {2, 64});
  at::manual_seed(mask_seed);
  gpt.forward({tokens}).toTensor().pow(2).mean().backward();
  Gradients gradients;
  for (const auto& p : gpt.named_parameters()) gradients[p.name] = p.value.grad().clone();
  return gradients;
}

// Checkpointing's recomputation draws the forward's masks again (Note
// [Recompute RNG] in strategies/recompute_op.cpp): the gradients are the
// plain run's; with other masks they are not.
TEST(Dropout, CheckpointedGptGetsThePlainRunsGradients) {
  OOMTUNE_REQUIRE_FILE(testing::example_model("gpt"));
  take_dropout_record();
  const Gradients plain = gpt_gradients(false, 1);
  EXPECT_EQ(take_dropout_record().calls, 9);  // the embeddings', and each block's attention and MLP
  const Gradients checkpointed = gpt_gradients(true, 1);
  EXPECT_EQ(take_dropout_record().calls, 9 + 4 * 2);  // and each block's two again in backward
  const Gradients other_masks = gpt_gradients(false, 2);
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (const auto& [name, gradient] : plain)
    EXPECT_TRUE(at::allclose(checkpointed.at(name), gradient, 1e-5, 1e-5)) << name;
  const std::string name = "blocks.0.attn.qkv.weight";
  EXPECT_FALSE(at::allclose(other_masks.at(name), plain.at(name), 1e-5, 1e-5));
}

}  // namespace
}  // namespace oomtune::dropout_test
