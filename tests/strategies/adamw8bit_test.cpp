// AdamW8bit against libtorch's own torch::optim::AdamW: bit-equal below the
// 8-bit size, close on a real training run above it, and state bytes by the
// formula of Dettmers et al. 2022 (1 byte per element + 4 per block, per moment).

#include "strategies/adamw8bit.h"

#include <cfloat>
#include <iostream>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "common/error.h"

namespace oomtune {
namespace {

std::vector<at::Tensor> clone_leaves(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().set_requires_grad(true));
  return out;
}

void set_grad(at::Tensor& p, const at::Tensor& g) { p.mutable_grad() = g.clone(); }

// The only state entry of an optimizer holding one parameter.
const AdamW8bitParamState& only_state(const AdamW8bit& opt) {
  EXPECT_EQ(opt.state().size(), 1u);
  return static_cast<const AdamW8bitParamState&>(*opt.state().begin()->second);
}

TEST(AdamW8bitOptions, DefaultsMatchTorchAdamW) {
  const AdamW8bitOptions ours;
  const torch::optim::AdamWOptions theirs;
  EXPECT_EQ(ours.lr(), 1e-3);
  EXPECT_EQ(ours.lr(), theirs.lr());
  EXPECT_EQ(ours.betas(), std::make_tuple(0.9, 0.999));
  EXPECT_EQ(ours.betas(), theirs.betas());
  EXPECT_EQ(ours.eps(), 1e-8);
  EXPECT_EQ(ours.eps(), theirs.eps());
  EXPECT_EQ(ours.weight_decay(), 1e-2);
  EXPECT_EQ(ours.weight_decay(), theirs.weight_decay());
  EXPECT_EQ(kMin8bitSize, 4096);
  EXPECT_EQ(kBlockSize, 2048);
}

TEST(AdamW8bitOptions, InvalidOptionsAreConfigErrors) {
  const std::vector<at::Tensor> params{at::zeros({3}, at::requires_grad())};
  EXPECT_THROW(AdamW8bit(params, AdamW8bitOptions(-1e-3)), ConfigError);
  EXPECT_THROW(AdamW8bit(params, AdamW8bitOptions().betas({1.0, 0.999})), ConfigError);
  EXPECT_THROW(AdamW8bit(params, AdamW8bitOptions().betas({-0.1, 0.999})), ConfigError);
  EXPECT_THROW(AdamW8bit(params, AdamW8bitOptions().betas({0.9, 1.0})), ConfigError);
  EXPECT_THROW(AdamW8bit(params, AdamW8bitOptions().betas({0.9, 1.5})), ConfigError);
  EXPECT_THROW(AdamW8bit(params, AdamW8bitOptions().eps(-1)), ConfigError);
  EXPECT_THROW(AdamW8bit(params, AdamW8bitOptions().weight_decay(-0.1)), ConfigError);
  EXPECT_NO_THROW(AdamW8bit(params, AdamW8bitOptions(0).betas({0.0, 0.0})));
  // A later set_lr to a bad value is caught at step().
  AdamW8bit opt(params);
  opt.param_groups()[0].options().set_lr(-1);
  EXPECT_THROW(opt.step(), ConfigError);
}

TEST(AdamW8bit, RejectsEightBitSizedNonFloatParameter) {
  at::Tensor p = at::zeros({5000}, at::TensorOptions().dtype(at::kDouble).requires_grad(true));
  set_grad(p, at::ones({5000}, at::kDouble));
  AdamW8bit opt({p});
  EXPECT_THROW(opt.step(), ConfigError);
}

// Note [AdamW8bit on a GPU]: the update AdamW8bit runs on a GPU, by ATen
// operations in chunks, run here on the CPU against the fused loop over
// four steps: two chunks and a short last block (kAdamW8bitChunk + 2048 *
// 3 + 100 elements), weight decay on. Parameters within float rounding
// of the loop's, absmax equal to a relative 1e-6, codes equal but for the
// rare value that float rounding moves across a midpoint (1 in 10,000).
TEST(AdamW8bit, TheUpdateByTensorOpsIsTheLoops) {
  at::manual_seed(5);
  const int64_t n = kAdamW8bitChunk + 2048 * 3 + 100;
  const at::Tensor init = at::randn({n});
  at::Tensor looped = init.clone().set_requires_grad(true);
  const AdamW8bitOptions options = AdamW8bitOptions(1e-2).betas({0.8, 0.99}).weight_decay(0.1);
  AdamW8bit opt({looped}, options);
  at::Tensor by_ops = init.clone();
  AdamW8bitParamState state;
  const int64_t blocks = num_blocks(n);
  state.exp_avg_q().codes = at::full({n}, QuantizationMap::dynamic(true).zero_code(), at::kByte);
  state.exp_avg_q().absmax = at::zeros({blocks});
  state.exp_avg_sq_q().codes = at::full({n}, QuantizationMap::dynamic(false).zero_code(), at::kByte);
  state.exp_avg_sq_q().absmax = at::zeros({blocks});
  for (int step = 0; step < 4; ++step) {
    const at::Tensor g = at::randn({n});
    set_grad(looped, g);
    opt.step();
    state.step(state.step() + 1);
    adamw8bit_update_by_tensor_ops(by_ops, g, state, options);
  }
  const AdamW8bitParamState& loop = only_state(opt);
  // PyTorch 2.11's vectorized kernels fuse multiply-adds where the loop
  // rounds twice: 2.3e-5 apart at most there (0 codes apart), 0 on 1.13.
  EXPECT_TRUE(at::allclose(by_ops, looped.detach(), 1e-5, 1e-4))
      << "largest difference " << (by_ops - looped.detach()).abs().max().item<float>();
  EXPECT_TRUE(at::allclose(state.exp_avg_q().absmax, loop.exp_avg_q().absmax, 1e-6, 0));
  EXPECT_TRUE(at::allclose(state.exp_avg_sq_q().absmax, loop.exp_avg_sq_q().absmax, 1e-6, 0));
  for (const auto& [ours, theirs] : {std::make_pair(state.exp_avg_q().codes, loop.exp_avg_q().codes),
                                     std::make_pair(state.exp_avg_sq_q().codes, loop.exp_avg_sq_q().codes)}) {
    const int64_t differ = ours.ne(theirs).sum().item<int64_t>();
    EXPECT_LE(differ, n / 10000) << differ << " of " << n << " codes differ";
    EXPECT_LE((ours.to(at::kInt) - theirs.to(at::kInt)).abs().max().item<int>(), 1);
  }
  AdamW8bitParamState not_8bit;
  EXPECT_THROW(adamw8bit_update_by_tensor_ops(by_ops, at::randn({n}), not_8bit, options), ConfigError);
}

// Below kMin8bitSize the moments stay fp32 and the update is libtorch's,
// bit for bit, with and without weight decay.
TEST(AdamW8bit, SmallTensorsMatchTorchAdamWBitForBit) {
  for (double weight_decay : {0.1, 0.0}) {
    at::manual_seed(3);
    const std::vector<at::Tensor> init{at::randn({40, 50}), at::randn({50}), at::randn({4095})};
    std::vector<at::Tensor> ours = clone_leaves(init);
    std::vector<at::Tensor> theirs = clone_leaves(init);
    AdamW8bit opt8(ours, AdamW8bitOptions(1e-2).betas({0.8, 0.99}).weight_decay(weight_decay));
    torch::optim::AdamW opt32(theirs, torch::optim::AdamWOptions(1e-2).betas({0.8, 0.99}).weight_decay(weight_decay));
    for (int step = 0; step < 25; ++step) {
      for (size_t i = 0; i < init.size(); ++i) {
        const at::Tensor g = at::randn(init[i].sizes()) * (step + 1);
        set_grad(ours[i], g);
        set_grad(theirs[i], g);
      }
      opt8.step();
      opt32.step();
      for (size_t i = 0; i < init.size(); ++i) {
        ASSERT_TRUE(at::equal(ours[i], theirs[i]))
            << "param " << i << " step " << step << " weight_decay " << weight_decay;
      }
    }
    EXPECT_EQ(opt8.state_bytes(), 8 * (40 * 50 + 50 + 4095));
  }
}

// At the first step the update uses the fresh fp32 moments, so it equals
// libtorch's (to float rounding); the stored moments are (1 - beta) g and
// (1 - beta2) g^2 within the blockwise quantization bound.
TEST(AdamW8bit, FirstStepMatchesAdamWAndStoresQuantizedMoments) {
  at::manual_seed(4);
  const at::Tensor init = at::randn({3, 4000});
  const at::Tensor g = at::randn({3, 4000}) * 0.1;
  std::vector<at::Tensor> ours = clone_leaves({init});
  std::vector<at::Tensor> theirs = clone_leaves({init});
  AdamW8bit opt8(ours, AdamW8bitOptions(1e-2));
  torch::optim::AdamW opt32(theirs, torch::optim::AdamWOptions(1e-2));
  set_grad(ours[0], g);
  set_grad(theirs[0], g);
  opt8.step();
  opt32.step();
  EXPECT_TRUE(at::allclose(ours[0], theirs[0], /*rtol=*/1e-6, /*atol=*/1e-7));

  const AdamW8bitParamState& state = only_state(opt8);
  ASSERT_TRUE(state.is_8bit());
  EXPECT_EQ(state.step(), 1);
  const struct {
    const QuantizedTensor& q;
    at::Tensor expected;
    bool is_signed;
  } moments[] = {{state.exp_avg_q(), g * 0.1, true}, {state.exp_avg_sq_q(), g * g * 0.001, false}};
  for (const auto& m : moments) {
    const QuantizationMap& map = QuantizationMap::dynamic(m.is_signed);
    const at::Tensor back = dequantize_blockwise(m.q, map).reshape({-1});
    const at::Tensor expected = m.expected.reshape({-1});
    for (int64_t b = 0; b < m.q.absmax.numel(); ++b) {
      const at::Tensor block = expected.slice(0, b * kBlockSize, (b + 1) * kBlockSize);
      const double absmax = block.abs().max().item<double>();
      const double err = (back.slice(0, b * kBlockSize, (b + 1) * kBlockSize) - block).abs().max().item<double>();
      // Slack: float rounding in the moment update and in normalization.
      EXPECT_LE(err, (map.max_error() + 8 * FLT_EPSILON) * absmax) << "block " << b;
    }
  }
}

// The step runs its blocks with at::parallel_for (strategies are compiled
// with OpenMP, oomtune_openmp): each block is its own work, so the
// parameters and both quantized moments are the same to the bit on one
// thread and on two, after steps that move every block.
TEST(AdamW8bit, StepsAreTheSameToTheBitOnOneThreadAndOnTwo) {
  at::manual_seed(5);
  const at::Tensor init = at::randn({3, 40000});  // 59 blocks: several per-thread tasks of kBlocksPerTask
  std::vector<at::Tensor> grads;
  for (int i = 0; i < 3; ++i) grads.push_back(at::randn({3, 40000}) * 0.1);
  const int threads = at::get_num_threads();
  const auto run = [&](int n) {
    at::set_num_threads(n);
    std::vector<at::Tensor> params = clone_leaves({init});
    AdamW8bit opt(params, AdamW8bitOptions(1e-2));
    for (const at::Tensor& g : grads) {
      set_grad(params[0], g);
      opt.step();
    }
    const AdamW8bitParamState& state = only_state(opt);
    return std::vector<at::Tensor>{params[0].detach().clone(), state.exp_avg_q().codes.clone(),
                                   state.exp_avg_q().absmax.clone(), state.exp_avg_sq_q().codes.clone(),
                                   state.exp_avg_sq_q().absmax.clone()};
  };
  const std::vector<at::Tensor> one = run(1);
  const std::vector<at::Tensor> two = run(2);
  at::set_num_threads(threads);
  ASSERT_EQ(one.size(), two.size());
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(at::equal(one[i], two[i])) << "tensor " << i;
}

TEST(AdamW8bit, StateBytesFollowTheFormula) {
  // {numel >= 4096: 8-bit} and {numel < 4096: fp32}; 8-bit bytes per moment =
  // numel codes + 4 * ceil(numel / 2048) absmax bytes.
  const std::vector<std::vector<int64_t>> shapes{{64, 4096}, {4096}, {3, 1000, 7}, {4095}, {10}};
  const std::vector<int64_t> expected_bytes{
      2 * (64 * 4096 + 4 * 128),  // 262144 elements, 128 blocks
      2 * (4096 + 4 * 2),         // exactly the threshold: 8-bit
      2 * (21000 + 4 * 11),       // ceil(21000 / 2048) = 11
      8 * 4095,                   // fp32: 2 moments x 4 bytes
      8 * 10,
  };
  at::manual_seed(5);
  int64_t total = 0;
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    params.push_back(at::randn(shapes[i]).set_requires_grad(true));
    total += expected_bytes[i];
    AdamW8bit single({params.back()});
    EXPECT_EQ(single.state_bytes(), 0);  // states are made at the first step
    set_grad(params.back(), at::randn(shapes[i]));
    single.step();
    EXPECT_EQ(single.state_bytes(), expected_bytes[i]) << "shape " << i;
    EXPECT_EQ(only_state(single).is_8bit(), i < 3);
  }
  AdamW8bit all(params);
  EXPECT_EQ(AdamW8bit::expected_state_bytes(params), total);
  all.step();
  EXPECT_EQ(all.state_bytes(), total);
  // ~2 bytes per parameter against fp32 AdamW's 8 for the large tensor.
  EXPECT_LT(static_cast<double>(expected_bytes[0]) / (8 * 64 * 4096), 0.26);
}

// A 2-layer MLP regression (first layer 64 -> 4096: its weight [4096, 64],
// its bias and the second weight [1, 4096] get 8-bit states, the last bias
// fp32) trained 200 steps on the same fresh mini-batches from the same start
// with both optimizers, then evaluated on held-out data. Targets carry noise
// of variance 0.01, so the loss cannot collapse to zero in 200 steps.
struct Mlp {
  std::vector<at::Tensor> params;  // w1 [4096, 64], b1 [4096], w2 [1, 4096], b2 [1]
  at::Tensor forward(const at::Tensor& x) const {
    const at::Tensor h = at::relu(at::linear(x, params[0], params[1]));
    return at::linear(h, params[2], params[3]);
  }
};

struct Regression {
  at::Tensor teacher = at::randn({64, 1}) / 8;
  at::Tensor target(const at::Tensor& x) const {
    return at::sin(at::matmul(x, teacher)) + 0.1 * at::randn({x.size(0), 1});
  }
};

template <typename Opt>
void train(const Mlp& model, Opt& opt, const std::vector<std::pair<at::Tensor, at::Tensor>>& batches) {
  for (const auto& batch : batches) {
    opt.zero_grad();
    at::mse_loss(model.forward(batch.first), batch.second).backward();
    opt.step();
  }
}

TEST(AdamW8bit, MlpLossWithinFivePercentOfTorchAdamW) {
  constexpr int kSteps = 200;
  constexpr int64_t kBatch = 32;
  at::manual_seed(6);
  const Regression task;
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (int s = 0; s < kSteps; ++s) {
    const at::Tensor x = at::randn({kBatch, 64});
    batches.emplace_back(x, task.target(x));
  }
  const at::Tensor x_eval = at::randn({1024, 64});
  const at::Tensor y_eval = task.target(x_eval);
  const std::vector<at::Tensor> init{at::randn({4096, 64}) / 8, at::zeros({4096}), at::randn({1, 4096}) / 64,
                                     at::zeros({1})};
  const Mlp ours{clone_leaves(init)};
  const Mlp theirs{clone_leaves(init)};
  AdamW8bit opt8(ours.params, AdamW8bitOptions(1e-3));
  torch::optim::AdamW opt32(theirs.params, torch::optim::AdamWOptions(1e-3));
  const double initial = at::mse_loss(ours.forward(x_eval), y_eval).item<double>();
  train(ours, opt8, batches);
  train(theirs, opt32, batches);
  const double loss8 = at::mse_loss(ours.forward(x_eval), y_eval).item<double>();
  const double loss32 = at::mse_loss(theirs.forward(x_eval), y_eval).item<double>();
  std::cout << "held-out mse: initial " << initial << ", torch AdamW " << loss32 << ", AdamW8bit " << loss8 << "\n";
  EXPECT_LT(loss32, 0.5 * initial) << "the task should be learnable in 200 steps";
  EXPECT_NEAR(loss8, loss32, 0.05 * loss32);
  int eight_bit = 0;
  for (const auto& entry : opt8.state()) {
    const auto& state = static_cast<const AdamW8bitParamState&>(*entry.second);
    EXPECT_EQ(state.step(), kSteps);
    eight_bit += state.is_8bit() ? 1 : 0;
  }
  EXPECT_EQ(eight_bit, 3);
}

}  // namespace
}  // namespace oomtune
