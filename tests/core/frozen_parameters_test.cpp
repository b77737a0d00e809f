// Frozen parameters (job/parameter_selection.h) on the example GPT, which
// Debian's Python exports: no gradient and no optimizer state for what is
// frozen, checked against byte counts from the model's own layer shapes
// (examples/export_models.py: vocab 1000, d_model 128, 4 blocks, 64
// positions, MLP 4 x d_model) and against the gradients of an unfrozen run.

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "session/cuda_autocast.h"
#include "session/model_session.h"
#include "strategies/job_config.h"
#include "strategies/training_step.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

using testing::gpt_job;

constexpr int64_t kDim = 128, kVocab = 1000, kPositions = 64;
// One block's parameters, tensor by tensor: ln1, attn.qkv, attn.proj, ln2,
// mlp.0, mlp.2 (weights and biases).
const std::vector<int64_t> kBlockTensors = {kDim, kDim, 3 * kDim* kDim, 3 * kDim, kDim* kDim,     kDim,
                                            kDim, kDim, 4 * kDim* kDim, 4 * kDim, 4 * kDim* kDim, kDim};
// ln_f (weight, bias) and the head (no bias).
const std::vector<int64_t> kTopTensors = {kDim, kDim, kVocab* kDim};

int64_t sum(const std::vector<int64_t>& numels) {
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  return total;
}

// Frozen: the embeddings and the first two of the four blocks.
const int64_t kFrozen = kVocab * kDim + kPositions * kDim + 2 * sum(kBlockTensors);
// Trainable: blocks 2 and 3, ln_f and the head.
const int64_t kTrainable = 2 * sum(kBlockTensors) + sum(kTopTensors);

JobSpec frozen_gpt_job(int64_t global_batch) {
  JobSpec job = gpt_job(global_batch);
  job.trainable.rule = ParameterSelection::Rule::kFrozen;
  job.trainable.globs = {"tok_emb.*", "pos_emb.*", "blocks.0.*", "blocks.1.*"};
  return job;
}

using testing::quick_trial;

TEST(FrozenParameters, TheStaticSplitCountsTrainableParametersOnly) {
  const JobSpec job = frozen_gpt_job(4);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport full = run_trial(gpt_job(4), baseline_config(job), quick_trial());
  const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  ASSERT_EQ(full.outcome, TrialOutcome::kOk) << full.message;
  EXPECT_EQ(full.parameter_count, kTrainable + kFrozen);
  EXPECT_EQ(r.parameter_count, kTrainable);
  EXPECT_EQ(r.frozen_parameter_count, kFrozen);
  // Exact (requested bytes, no rounding): fp32 weights 4 each, gradients
  // 4 T, AdamW's exp_avg and exp_avg_sq 8 T; the frozen weights 4 F and
  // nothing more.
  EXPECT_EQ(r.static_memory.parameter_bytes, 4 * kTrainable);
  EXPECT_EQ(r.static_memory.frozen_parameter_bytes, 4 * kFrozen);
  EXPECT_EQ(r.static_memory.gradient_bytes, 4 * kTrainable);
  EXPECT_EQ(r.static_memory.optimizer_state_bytes, 8 * kTrainable);
  EXPECT_EQ(full.static_memory.frozen_parameter_bytes, 0);
  // Freezing moves no buffer: the masks and positions are the same.
  EXPECT_EQ(r.static_memory.buffer_bytes, full.static_memory.buffer_bytes);
  // Every phase of the measured step holds the frozen parameters' 8 F
  // bytes of AdamW state less (the gradients, 4 F more, are gone before
  // forward), wherever the step peaks.
  EXPECT_LE(r.peak_bytes, full.peak_bytes - 8 * kFrozen);
}

TEST(FrozenParameters, OffloadAnd8BitAdamWHoldStateForTheTrainableOnes) {
  const JobSpec job = frozen_gpt_job(4);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrainingConfig offload = baseline_config(job);
  offload.offload_optimizer = true;
  const ProbeReport off = run_trial(job, offload, quick_trial());
  ASSERT_EQ(off.outcome, TrialOutcome::kOk) << off.message;
  // Host: fp32 masters, their gradient buffers and AdamW state, 16 T.
  EXPECT_EQ(off.static_memory.optimizer_host_bytes, 16 * kTrainable);
  EXPECT_EQ(off.static_memory.optimizer_state_bytes, 0);

  TrainingConfig eight_bit = baseline_config(job);
  eight_bit.optimizer = OptimizerKind::kAdamW8bit;
  const ProbeReport q = run_trial(job, eight_bit, quick_trial());
  ASSERT_EQ(q.outcome, TrialOutcome::kOk) << q.message;
  // Per trainable tensor of n elements: 2 (n + 4 ceil(n / 2048)) bytes when
  // n >= 4096 (int8 m and v, one fp32 absmax per 2048-element block each),
  // else fp32 moments, 8 n (bitsandbytes' min_8bit_size; strategies/adamw8bit.h).
  int64_t expected = 0;
  std::vector<int64_t> trainable = kTopTensors;
  for (int copy = 0; copy < 2; ++copy) trainable.insert(trainable.end(), kBlockTensors.begin(), kBlockTensors.end());
  for (int64_t n : trainable) expected += n >= 4096 ? 2 * (n + 4 * ((n + 2047) / 2048)) : 8 * n;
  EXPECT_EQ(q.static_memory.optimizer_state_bytes, expected);
}

std::map<std::string, at::Tensor> gradients_by_name(const JobSpec& job, const Batch& batch) {
  ModelSession session(job);
  TrainingStep step(session, baseline_config(job));
  std::map<std::string, at::Tensor> grads;
  at::manual_seed(1234);  // dropout masks
  step.run(batch, [&](Phase phase) {
    if (phase != Phase::kOptimizer) return;
    for (const auto& p : session.module().named_parameters(/*recurse=*/true))
      grads[p.name] = p.value.grad().defined() ? p.value.grad().clone() : at::Tensor();
  });
  return grads;
}

TEST(FrozenParameters, TrainableGradientsEqualAnUnfrozenRunsAndFrozenOnesHaveNone) {
  const JobSpec job = frozen_gpt_job(2);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const Batch batch = make_batch(job, job.global_batch, job.seed);
  const auto frozen = gradients_by_name(job, batch);
  const auto full = gradients_by_name(gpt_job(2), batch);
  ASSERT_EQ(frozen.size(), full.size());
  int64_t trained = 0;
  for (const auto& [name, grad] : frozen) {
    const bool is_frozen = name.rfind("tok_emb.", 0) == 0 || name.rfind("pos_emb.", 0) == 0 ||
                           name.rfind("blocks.0.", 0) == 0 || name.rfind("blocks.1.", 0) == 0;
    if (is_frozen) {
      EXPECT_FALSE(grad.defined()) << name;
      continue;
    }
    ASSERT_TRUE(grad.defined()) << name;
    EXPECT_TRUE(at::allclose(grad, full.at(name), 1e-5, 1e-7)) << name;
    trained += grad.numel();
  }
  EXPECT_EQ(trained, kTrainable);
}

// The frozen linear layers of blocks 0 and 1 in bf16, under bf16 autocast.
// Not their LayerNorms: CPU autocast does not cast for layer_norm, which
// then meets a bf16 weight and fp32 activations and refuses them (the test
// below; docs/job_spec.md).
TEST(FrozenParameters, FrozenBf16HalvesTheFrozenWeightsUnderAutocast) {
  JobSpec job = gpt_job(4);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  job.precision = "bf16";
  job.trainable = {ParameterSelection::Rule::kFrozen,
                   {"blocks.0.attn.*", "blocks.0.mlp.*", "blocks.1.attn.*", "blocks.1.mlp.*"},
                   /*frozen_bf16=*/true};
  // qkv, proj, mlp.0, mlp.2: weights and biases (kBlockTensors[2..5], [8..11]).
  int64_t linear = 0;
  for (std::size_t i : {2, 3, 4, 5, 8, 9, 10, 11}) linear += kBlockTensors[i];
  const int64_t frozen = 2 * linear;
  const int64_t trainable = kTrainable + kFrozen - frozen;
  const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_EQ(r.frozen_parameter_count, frozen);
  EXPECT_EQ(r.static_memory.frozen_parameter_bytes, 2 * frozen);
  EXPECT_EQ(r.static_memory.parameter_bytes, 4 * trainable);
  EXPECT_EQ(r.static_memory.gradient_bytes, 4 * trainable);
  EXPECT_EQ(r.static_memory.optimizer_state_bytes, 8 * trainable);
}

// Frozen LayerNorms in bf16: CPU autocast's own lists cast neither their
// bf16 weight nor the fp32 residual stream for layer_norm (libtorch 1.13:
// "expected scalar type Float but found BFloat16"), and the one-line error
// then says which key caused the mix and what to change. With CUDA's lists
// (session/cuda_autocast.h, libtorch 2) layer_norm runs in fp32,
// its weight cast, and the step runs, as under CUDA autocast.
TEST(FrozenParameters, FrozenBf16LayerNormsFailWithTheFixNamed) {
  JobSpec job = gpt_job(2);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  job.precision = "bf16";
  job.trainable = {ParameterSelection::Rule::kFrozen, {"blocks.0.ln1.*"}, /*frozen_bf16=*/true};
  if (cuda_autocast_available()) {
    const ProbeReport r = run_trial(job, baseline_config(job), quick_trial());
    EXPECT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
    EXPECT_EQ(r.autocast_lists, "cuda");
    return;
  }
  try {
    run_trial(job, baseline_config(job), quick_trial());
    FAIL() << "layer_norm ran on a bf16 weight and fp32 activations";
  } catch (const ModelError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_NE(what.find(job.model_path + ": forward("), std::string::npos) << what;
    EXPECT_NE(what.find("(frozen_dtype = \"bf16\")"), std::string::npos) << what;
    EXPECT_NE(what.find("frozen_dtype = \"fp32\""), std::string::npos) << what;
  }
  // Without frozen_dtype = "bf16" the same error gets no such hint.
  job.trainable.frozen_bf16 = false;
  EXPECT_EQ(frozen_bf16_hint(job, "expected scalar type Float but found BFloat16"), "");
}

TEST(FrozenParameters, AGlobThatMatchesNothingNamesTheNearestParameters) {
  JobSpec job = gpt_job(2);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  job.spec_path = "gpt_frozen.toml";
  job.trainable.rule = ParameterSelection::Rule::kTrainable;
  job.trainable.globs = {"head.*", "block.3.*"};
  try {
    ModelSession session(job);
    FAIL() << "no error";
  } catch (const SpecError& e) {
    EXPECT_EQ(std::string(e.what()),
              "gpt_frozen.toml: trainable glob 'block.3.*' matches no parameter of " + job.model_path +
                  " (nearest: blocks.3.ln1.weight, blocks.3.ln1.bias, blocks.3.attn.qkv.weight)");
  }
  job.trainable.globs = {"positions"};  // a buffer, not a parameter
  EXPECT_THROW(ModelSession{job}, SpecError);
  job.trainable.rule = ParameterSelection::Rule::kFrozen;
  job.trainable.globs = {"*"};
  try {
    ModelSession session(job);
    FAIL() << "no error";
  } catch (const SpecError& e) {
    EXPECT_EQ(std::string(e.what()),
              "gpt_frozen.toml: frozen = [*] leaves no trainable parameter in " + job.model_path);
  }
}

}  // namespace
}  // namespace oomtune
