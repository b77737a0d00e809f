// Strategies applied to a real training step, against an unmodified run.

#include "strategies/training_step.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>  // before clip_grad.h, which libtorch 1.13 does not make self-contained

#include <torch/nn/utils/clip_grad.h>

#include "common/error.h"
#include "compat/torch_compat.h"
#include "quick_trial.h"
#include "session/model_session.h"
#include "strategies/eager_adamw.h"
#include "strategies/master_weights.h"
#include "strategies/mixed_precision.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

using testing::exists;
using testing::gpt_job;
using testing::mlp_job;

/// Gradients at the moment the optimizer step begins (after every
/// micro-batch's backward).
std::vector<at::Tensor> gradients_of_one_step(const JobSpec& job, const TrainingConfig& config, const Batch& batch) {
  ModelSession session(job);
  TrainingStep step(session, config);
  std::vector<at::Tensor> grads;
  at::manual_seed(1234);  // dropout masks
  step.run(batch, [&](Phase phase) {
    if (phase != Phase::kOptimizer) return;
    for (const at::Tensor& p : session.parameters()) grads.push_back(p.grad().clone());
  });
  return grads;
}

void expect_all_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, double tolerance) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(at::allclose(a[i], b[i], tolerance, tolerance))
        << "tensor " << i << ": max diff " << (a[i] - b[i]).abs().max().item<double>();
}

TEST(TrainingStep, AccumulatedGradientsEqualTheFullBatch) {
  const JobSpec job = mlp_job(12);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const Batch batch = make_batch(job, 12, 7);
  const auto full = gradients_of_one_step(job, baseline_config(job), batch);
  for (int64_t micro : {1, 3, 4, 6}) {
    TrainingConfig config = baseline_config(job);
    config.micro_batch = micro;
    SCOPED_TRACE(micro);
    expect_all_close(gradients_of_one_step(job, config, batch), full, 1e-5);
  }
}

TEST(TrainingStep, AccumulationOnTheGptWithTokenMeanLoss) {
  const JobSpec job = gpt_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const Batch batch = make_batch(job, 8, 3);
  // Dropout draws different masks when the batch is split, so compare with
  // dropout off (eval mode); the loss is a mean over tokens, and every
  // sample has the same number of tokens, so the weighting is exact.
  auto grads = [&](int64_t micro) {
    ModelSession session(job);
    session.module().eval();
    TrainingConfig config = baseline_config(job);
    config.micro_batch = micro;
    TrainingStep step(session, config);
    std::vector<at::Tensor> out;
    step.run(batch, [&](Phase phase) {
      if (phase == Phase::kOptimizer)
        for (const at::Tensor& p : session.parameters()) out.push_back(p.grad().clone());
    });
    return out;
  };
  expect_all_close(grads(2), grads(8), 1e-5);
}

TEST(TrainingStep, RemainderNeedsThePolicyAndThenWeighsEachMicroBatch) {
  JobSpec job = mlp_job(10);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrainingConfig config = baseline_config(job);
  config.micro_batch = 4;
  EXPECT_THROW(normalize_config(config, job), ConfigError);
  job.allow_remainder = true;
  EXPECT_EQ(normalize_config(config, job).accumulation_steps, 3);  // 4 + 4 + 2
  const Batch batch = make_batch(job, 10, 11);
  expect_all_close(gradients_of_one_step(job, config, batch), gradients_of_one_step(job, baseline_config(job), batch),
                   1e-5);
}

TEST(TrainingStep, OffloadKeepsOptimizerStateOffTheDeviceAndUpdatesIdentically) {
  const JobSpec job = mlp_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const TrialOptions options = testing::one_timed_step();
  TrainingConfig offload = baseline_config(job);
  offload.offload_optimizer = true;
  const ProbeReport plain = run_trial(job, baseline_config(job), options);
  const ProbeReport off = run_trial(job, offload, options);
  ASSERT_EQ(off.outcome, TrialOutcome::kOk) << off.message;
  const int64_t p = plain.parameter_count;
  EXPECT_EQ(plain.static_memory.optimizer_state_bytes, 8 * p);
  EXPECT_EQ(off.static_memory.optimizer_state_bytes, 0);
  // Host: fp32 master parameters 4 P, their gradient buffers 4 P, AdamW state 8 P.
  EXPECT_EQ(off.static_memory.optimizer_host_bytes, 16 * p);
  // The host peak holds them beside the batch plain's holds alone: never
  // less than the 16 P the search counts against a host budget before it
  // probes offload (search/host_budget.cpp, Note [Host budget]).
  EXPECT_GT(plain.host_peak_bytes, 0);  // the global batch
  EXPECT_GE(off.host_peak_bytes, plain.host_peak_bytes + 16 * p);

  // Parameters after two steps equal the non-offloaded run's.
  const Batch batch = make_batch(job, 8, 5);
  auto parameters_after = [&](const TrainingConfig& config) {
    ModelSession session(job);
    TrainingStep step(session, config);
    for (int i = 0; i < 2; ++i) step.run(batch, [](Phase) {});
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : session.parameters()) out.push_back(t.detach().clone());
    return out;
  };
  expect_all_close(parameters_after(offload), parameters_after(baseline_config(job)), 1e-6);
}

TEST(TrainingStep, Bf16RunsOnCpuAndRetainsFewerActivationBytes) {
  const JobSpec job = gpt_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const TrialOptions options = testing::one_timed_step();
  TrainingConfig bf16 = baseline_config(job);
  bf16.precision = Precision::kBf16;
  const ProbeReport fp32 = run_trial(job, baseline_config(job), options);
  const ProbeReport low = run_trial(job, bf16, options);
  ASSERT_EQ(low.outcome, TrialOutcome::kOk) << low.message;
  EXPECT_LT(low.retained_activation_bytes, fp32.retained_activation_bytes);
  EXPECT_EQ(low.static_memory.parameter_bytes, fp32.static_memory.parameter_bytes) << "fp32 master weights";
}

/// Weights, loss and (bf16_params) fp32 masters after one optimizer step.
struct AfterOneStep {
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> masters;
  std::vector<at::Tensor> fp32_gradients;  // the model's gradients at the optimizer step, as fp32
  double loss = 0;
};

AfterOneStep one_step(const JobSpec& job, const TrainingConfig& config, const Batch& batch) {
  ModelSession session(job);
  TrainingStep step(session, config);
  AfterOneStep out;
  auto keep_gradients = [&](Phase phase) {
    if (phase != Phase::kOptimizer) return;
    for (const at::Tensor& p : session.parameters()) out.fp32_gradients.push_back(p.grad().to(at::kFloat));
  };
  out.loss = step.run(batch, keep_gradients).loss;
  for (const at::Tensor& p : session.parameters()) out.parameters.push_back(p.detach().clone());
  if (const MasterWeightOptimizer* master = step.master_weights())
    for (const at::Tensor& m : master->masters()) out.masters.push_back(m.detach().clone());
  return out;
}

TEST(TrainingStep, Bf16ParamsMastersTakeTheFp32UpdateAndTheModelTheirBf16Rounding) {
  const JobSpec job = mlp_job(16);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const Batch batch = make_batch(job, 16, 21);
  TrainingConfig bf16 = baseline_config(job);
  bf16.precision = Precision::kBf16Params;
  const AfterOneStep fp32 = one_step(job, baseline_config(job), batch);
  const AfterOneStep low = one_step(job, bf16, batch);
  const std::size_t n = fp32.parameters.size();
  ASSERT_EQ(low.masters.size(), n);
  ASSERT_EQ(low.parameters.size(), n);

  // The model holds exactly the bf16 rounding of each master (copy_ and
  // .to both round to nearest even).
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(low.masters[i].scalar_type(), at::kFloat);
    EXPECT_EQ(low.parameters[i].scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(low.parameters[i], low.masters[i].to(at::kBFloat16))) << "parameter " << i;
  }

  // The update is fp32 AdamW on the exact fp32 weights (the masters are
  // copied before the cast) with the bf16 gradients upcast: bit for bit.
  std::vector<at::Tensor> reference;
  {
    ModelSession fresh(job);
    for (const at::Tensor& p : fresh.parameters()) reference.push_back(p.detach().clone().set_requires_grad(true));
  }
  for (std::size_t i = 0; i < n; ++i) reference[i].mutable_grad() = low.fp32_gradients[i].clone();
  make_optimizer(OptimizerKind::kAdamW, job.optimizer, reference)->step();
  for (std::size_t i = 0; i < n; ++i) EXPECT_TRUE(at::equal(low.masters[i], reference[i].detach())) << "master " << i;

  // Against the fp32 run. bf16 keeps 8 significant bits: each rounding is
  // off by at most 2^-9 relative. The loss (fp32, from logits that carry a
  // handful of such roundings, averaged over 16 samples) is within 2^-8
  // relative. So is the last layer's gradient in norm (2^-6 allows for its
  // few roundings; no ReLU between it and the loss): tensors 4, 5 are fc3's.
  EXPECT_NEAR(low.loss, fp32.loss, std::ldexp(std::abs(fp32.loss), -8));
  for (std::size_t i = n - 2; i < n; ++i) {
    const double relative =
        ((low.fp32_gradients[i] - fp32.fp32_gradients[i]).norm() / fp32.fp32_gradients[i].norm()).item<double>();
    EXPECT_LT(relative, std::ldexp(1.0, -6)) << "gradient " << i;
  }
  // The masters cannot be compared with a relative tolerance: AdamW's first
  // update is lr * g / (|g| + eps), +-lr whatever the gradient's size, so an
  // element moves the same in both runs exactly when its gradient has the
  // same sign. Earlier layers' gradients do flip sign here and there: a
  // pre-activation within bf16 rounding of zero flips its ReLU, and that
  // sample's whole contribution to the row changes (measured: 6-7 % of fc1's
  // and fc2's gradient norm, 1-3 % of their elements flip). So: everywhere,
  // the masters are within the 2 lr by which one step can make two runs
  // differ; where both gradients have the same sign and are at least
  // 1000 eps, both updates are within lr * eps / (1000 eps) = lr / 1000 of
  // +-lr, so the masters equal the fp32 run's weights within that plus
  // fp32 rounding of weights ~0.06 (1e-7).
  const double lr = job.optimizer.lr;
  const double small = 1000 * job.optimizer.eps;
  for (std::size_t i = 0; i < n; ++i) {
    SCOPED_TRACE(i);
    const at::Tensor diff = (low.masters[i] - fp32.parameters[i]).abs();
    EXPECT_LE(diff.max().item<double>(), 2 * lr + 1e-7);
    const at::Tensor g = fp32.fp32_gradients[i];
    const at::Tensor h = low.fp32_gradients[i];
    const at::Tensor agree = (g.sign() == h.sign()) & (g.abs() > small) & (h.abs() > small);
    ASSERT_GT(agree.sum().item<int64_t>(), diff.numel() / 2);
    EXPECT_LE(diff.masked_select(agree).max().item<double>(), lr / 1000 + 1e-7);
  }
}

TEST(TrainingStep, Bf16ParamsCastsFloatBuffersAndLeavesIntegerOnes) {
  const JobSpec job = gpt_job(4);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  ModelSession session(job);
  TrainingConfig bf16 = baseline_config(job);
  bf16.precision = Precision::kBf16Params;
  TrainingStep step(session, bf16);
  int64_t float_buffers = 0, integer_buffers = 0;
  for (const at::Tensor& b : session.module().buffers()) {
    if (at::isIntegralType(b.scalar_type(), /*includeBool=*/true)) {
      EXPECT_EQ(b.scalar_type(), at::kLong);  // the GPT's positions
      ++integer_buffers;
    } else {
      EXPECT_EQ(b.scalar_type(), at::kBFloat16);  // the causal masks
      ++float_buffers;
    }
  }
  EXPECT_GT(float_buffers, 0);
  EXPECT_GT(integer_buffers, 0);
  for (const at::Tensor& p : session.module().parameters()) EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  // A step runs on the GPT (embedding, layer_norm, gelu, softmax, dropout
  // in bf16 on CPU) and its gradients are bf16.
  const Batch batch = make_batch(job, 4, 9);
  bool checked = false;
  const StepResult r = step.run(batch, [&](Phase phase) {
    if (phase != Phase::kOptimizer) return;
    for (const at::Tensor& p : session.parameters()) EXPECT_EQ(p.grad().scalar_type(), at::kBFloat16);
    checked = true;
  });
  EXPECT_TRUE(checked);
  EXPECT_TRUE(std::isfinite(r.loss));
}

TEST(TrainingStep, Bf16ParamsWithOffloadUpdatesLikeDeviceMasters) {
  // Offload moves the masters to the host; the numbers change by rounding only.
  const JobSpec job = mlp_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const Batch batch = make_batch(job, 8, 5);
  auto parameters_after_two_steps = [&](bool offload) {
    ModelSession session(job);
    TrainingConfig config = baseline_config(job);
    config.precision = Precision::kBf16Params;
    config.offload_optimizer = offload;
    TrainingStep step(session, config);
    EXPECT_EQ(step.master_weights()->placement(), offload ? MasterPlacement::kHost : MasterPlacement::kDevice);
    for (int i = 0; i < 2; ++i) step.run(batch, [](Phase) {});
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : session.parameters()) out.push_back(t.detach().clone());
    return out;
  };
  const auto device = parameters_after_two_steps(false);
  const auto host = parameters_after_two_steps(true);
  ASSERT_EQ(device.size(), host.size());
  // The host update is libtorch's AdamW loop (exp_avg.mul_().add_()), the
  // device one torch.optim's foreach (lerp_): the same update up to fp32
  // rounding, which can move a bf16 parameter's rounding by one ulp (2^-7
  // relative at most: 8 significant bits) and no further.
  for (std::size_t i = 0; i < device.size(); ++i) {
    const at::Tensor d = device[i].to(at::kFloat), h = host[i].to(at::kFloat);
    EXPECT_TRUE(at::allclose(d, h, /*rtol=*/std::ldexp(1.0, -7), /*atol=*/0))
        << "parameter " << i << " differs by " << ((d - h).abs() / h.abs()).max().item<double>() << " relative";
  }
}

// Gradient clipping (strategies/gradient_clipping.h) inside a step, against
// the unclipped run's gradients clipped by libtorch's own C++
// clip_grad_norm_ and handed to the same optimizer. SGD without momentum:
// the update is proportional to the gradient, so a clip at the wrong scale
// shows (Adam would hide it).
JobSpec clipped_sgd_job(double max_grad_norm) {
  JobSpec job = mlp_job(8, "sgd");
  job.optimizer.momentum = 0.0;
  job.optimizer.weight_decay = 0.0;
  job.optimizer.lr = 0.5;
  job.optimizer.max_grad_norm = max_grad_norm;
  return job;
}

/// The parameters after `config`'s step of `job`, and those of its
/// reference: the parameters before it minus lr times the gradients at the
/// optimizer phase (times `unscale`), clipped by libtorch.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> clipped_step_and_reference(const JobSpec& job,
                                                                                       const TrainingConfig& config,
                                                                                       double unscale = 1.0) {
  const Batch batch = make_batch(job, job.global_batch, 5);
  ModelSession session(job);
  std::vector<at::Tensor> reference;
  for (const at::Tensor& p : session.parameters()) reference.push_back(p.detach().clone().to(at::kFloat));
  TrainingStep step(session, config);
  step.run(batch, [&](Phase phase) {
    if (phase != Phase::kOptimizer) return;
    for (std::size_t i = 0; i < reference.size(); ++i) {
      reference[i].requires_grad_(true);
      reference[i].mutable_grad() = session.parameters()[i].grad().to(at::kFloat) * unscale;
    }
  });
  const double total = torch::nn::utils::clip_grad_norm_(reference, job.optimizer.max_grad_norm);
  EXPECT_GT(total, 2 * job.optimizer.max_grad_norm) << "the test must clip";
  at::NoGradGuard no_grad;
  for (at::Tensor& r : reference) r = r - job.optimizer.lr * r.grad();
  std::vector<at::Tensor> after;
  for (const at::Tensor& p : session.parameters()) after.push_back(p.detach().to(at::kFloat));
  return {after, reference};
}

TEST(TrainingStep, ClipsTheGradientsBeforeTheUpdateAsClipGradNorm) {
  const JobSpec job = clipped_sgd_job(0.05);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const auto [after, reference] = clipped_step_and_reference(job, baseline_config(job));
  expect_all_close(after, reference, 1e-6);
  // Offload clips the host masters' fp32 gradients: the same update.
  TrainingConfig offload = baseline_config(job);
  offload.offload_optimizer = true;
  const auto [offloaded, offload_reference] = clipped_step_and_reference(job, offload);
  expect_all_close(offloaded, offload_reference, 1e-6);
}

TEST(TrainingStep, Fp16UnscalesBeforeItClips) {
  if (!compat::has_cpu_grad_scaler_kernels()) GTEST_SKIP() << "this libtorch has GradScaler's kernels for CUDA only";
  const JobSpec job = clipped_sgd_job(0.05);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrainingConfig fp16 = baseline_config(job);
  fp16.precision = Precision::kFp16;
  // The optimizer phase sees the scaled gradients (2^16, exact): clipped
  // after unscale_ they make the reference's update; clipped before it the
  // update would be 2^16 times smaller.
  const auto [after, reference] = clipped_step_and_reference(job, fp16, 1.0 / DynamicLossScaler::kInitScale);
  expect_all_close(after, reference, 1e-6);
}

// fp16's loss scaler against an unscaled backward and GradScaler's rules
// (torch/amp/grad_scaler.py): the unscaled gradients are the unmodified
// run's (a power-of-two scale is exact in fp32), an inf skips the step and
// halves the scale, 2000 good steps in a row double it.
TEST(DynamicLossScaler, UnscalesToTheUnscaledGradientsAndBacksOffOnInf) {
  if (!compat::has_cpu_grad_scaler_kernels()) GTEST_SKIP() << "this libtorch has GradScaler's kernels for CUDA only";
  at::manual_seed(3);
  const at::Tensor w = at::randn({3, 4}).requires_grad_(true);
  const at::Tensor x = at::randn({4});
  at::matmul(w, x).pow(2).sum().backward();
  const at::Tensor expected = w.grad().clone();
  w.mutable_grad() = at::Tensor();

  DynamicLossScaler scaler;
  EXPECT_EQ(scaler.scale_value(), 65536.0);
  const at::Tensor loss = at::matmul(w, x).pow(2).sum();
  const at::Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.item<float>(), loss.item<float>() * 65536.0f);
  scaled.backward();
  EXPECT_FALSE(at::equal(w.grad(), expected));
  int steps = 0;
  const auto count_step = [&steps] { ++steps; };
  // unscale_ before step (gradient clipping): step neither unscales again
  // nor lets unscale_ run twice before update.
  scaler.unscale_({w});
  EXPECT_TRUE(at::equal(w.grad(), expected));
  EXPECT_FALSE(scaler.step({w}, nullptr, count_step));
  EXPECT_TRUE(at::equal(w.grad(), expected));
  EXPECT_EQ(steps, 1);
  EXPECT_THROW(scaler.unscale_({w}), std::logic_error);
  scaler.update();
  EXPECT_EQ(scaler.scale_value(), 65536.0);

  w.mutable_grad() = expected.clone();
  w.mutable_grad()[1][2] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(scaler.step({w}, nullptr, count_step));
  EXPECT_EQ(steps, 1);
  scaler.update();
  EXPECT_EQ(scaler.scale_value(), 32768.0);

  for (int64_t step = 1; step <= DynamicLossScaler::kGrowthInterval; ++step) {
    w.mutable_grad() = expected.clone();
    ASSERT_FALSE(scaler.step({w}, nullptr, count_step));
    scaler.update();
    ASSERT_EQ(scaler.scale_value(), step < DynamicLossScaler::kGrowthInterval ? 32768.0 : 65536.0) << step;
  }
}

// GradScaler.step with a fused AdamW (_step_supports_amp_scaling): no
// unscale_, the optimizer gets the scale; the update is the unscaled run's
// to the bit, and a step with an inf updates nothing but, being the first,
// makes the AdamW state (torch/amp/grad_scaler.py, torch/optim/adam.py).
TEST(DynamicLossScaler, HandsAFusedOptimizerTheScaleInsteadOfUnscaling) {
  if (!compat::has_cpu_grad_scaler_kernels()) GTEST_SKIP() << "this libtorch has GradScaler's kernels for CUDA only";
  at::manual_seed(3);
  const at::Tensor x = at::randn({4});
  const at::Tensor w0 = at::randn({3, 4});
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.05);
  const auto loss_of = [&](const at::Tensor& w) { return at::matmul(w, x).pow(2).sum(); };

  const at::Tensor plain = w0.clone().requires_grad_(true);
  EagerAdamW reference({plain}, options, OptimizerImplementation::kFused);
  loss_of(plain).backward();
  reference.step();

  const at::Tensor w = w0.clone().requires_grad_(true);
  EagerAdamW fused({w}, options, OptimizerImplementation::kFused);
  DynamicLossScaler scaler;
  scaler.scale(loss_of(w)).backward();
  EXPECT_FALSE(scaler.step({w}, &fused, [&] { fused.step(); }));
  scaler.update();
  EXPECT_TRUE(at::equal(w, plain));
  EXPECT_EQ(scaler.scale_value(), 65536.0);

  const at::Tensor v = w0.clone().requires_grad_(true);
  EagerAdamW skipped({v}, options, OptimizerImplementation::kFused);
  scaler.scale(loss_of(v)).backward();
  v.mutable_grad()[0][1] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(scaler.step({v}, &skipped, [&] { skipped.step(); }));
  scaler.update();
  EXPECT_TRUE(at::equal(v, w0));
  EXPECT_EQ(scaler.scale_value(), 32768.0);
  EXPECT_EQ(skipped.state().size(), 1u);
}

TEST(TrainingStep, BadCombinationsGetClearErrors) {
  const JobSpec job = mlp_job(8);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  TrainingConfig fp16 = baseline_config(job);
  fp16.precision = Precision::kFp16;
  if (compat::has_cpu_grad_scaler_kernels()) {
    ModelSession session(job);
    EXPECT_EQ(TrainingStep(session, fp16).config().precision, Precision::kFp16);
  } else {
    try {
      ModelSession session(job);
      TrainingStep step(session, fp16);
      FAIL();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("precision fp16 on the CPU needs GradScaler's CPU kernels"),
                std::string::npos)
          << e.what();
    }
  }
  TrainingConfig ckpt = baseline_config(job);
  ckpt.checkpoint.mode = CheckpointPlan::Mode::kAll;
  ModelSession session(job);
  try {
    TrainingStep step(session, ckpt);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fc1"), std::string::npos) << e.what();
  }
  TrainingConfig too_big = baseline_config(job);
  too_big.micro_batch = 16;
  EXPECT_THROW(normalize_config(too_big, job), ConfigError);
  TrainingConfig adafactor_offload = baseline_config(job);
  adafactor_offload.optimizer = OptimizerKind::kAdafactor;
  adafactor_offload.offload_optimizer = true;
  try {
    normalize_config(adafactor_offload, job);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), kAdafactorOffloadProblem);
  }
}

}  // namespace
}  // namespace oomtune
