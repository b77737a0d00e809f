// Activation checkpointing on a GPU (CUDA builds only: built in CI by the
// PyPI configuration, run where a GPU is lent; without one each test skips
// with the reason). On CUDA the autograd engine runs backward on its device
// thread, so the checkpoint operator's backward recomputes a block there and
// runs the engine reentrantly on it; the recomputation draws dropout masks
// from the CUDA generator the forward drew from (Note [Recompute RNG],
// strategies/recompute_op.cpp), under CUDA autocast where the forward ran
// under it; and the gradient that comes into a block goes once the block's
// first node has run (Note [Incoming gradients are the graph's]). The CPU
// tests of the same (checkpointing_test.cpp) cannot see any of this.

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "checkpoint_test_support.h"
#include "probes/cuda_stats_source.h"
#include "strategies/activation_checkpointing.h"

namespace oomtune {
namespace {

using testing::example_model;
using testing::expect_same_gradients;
using testing::gpt_input;
using testing::OptimizeScope;
using testing::StepOptions;
using testing::test_model;
using testing::train_steps;

const c10::Device kCuda(c10::kCUDA, 0);

/// cuDNN on its deterministic algorithms, without benchmarking, for the
/// scope: a plain run and a checkpointed one then pick the same algorithm
/// for each convolution, so their gradients can agree to 1e-5.
class DeterministicCudnn {
 public:
  DeterministicCudnn()
      : deterministic_(at::globalContext().deterministicCuDNN()), benchmark_(at::globalContext().benchmarkCuDNN()) {
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  ~DeterministicCudnn() {
    at::globalContext().setDeterministicCuDNN(deterministic_);
    at::globalContext().setBenchmarkCuDNN(benchmark_);
  }
  DeterministicCudnn(const DeterministicCudnn&) = delete;
  DeterministicCudnn& operator=(const DeterministicCudnn&) = delete;

 private:
  bool deterministic_;
  bool benchmark_;
};

// The example GPT has dropout (CPU test GptGradients.DropoutIsReallyOnSoSeedsMatter):
// equal gradients mean the recomputation drew the forward's masks from the
// CUDA generator, one step and two with an SGD update between them.
TEST(CudaCheckpointing, GptGradientsEqualThePlainRunsWithDropoutOn) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, example_model("gpt.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  const CheckpointReport report = apply_checkpointing(ckpt, parse_checkpoint_plan("all"), plain_path);
  EXPECT_EQ(report.checkpointed.size(), 4u);
  StepOptions options;
  options.device = kCuda;
  options.sgd_lr = 0.1;
  const auto input = [] { return gpt_input(2); };
  expect_same_gradients(train_steps(plain, input, 2, options), train_steps(ckpt, input, 2, options));
}

// Under CUDA bf16 autocast, as precision=bf16 trains on a GPU: the
// recomputation runs under the forward's autocast, not the backward's (off).
TEST(CudaCheckpointing, GptGradientsEqualThePlainRunsUnderBf16Autocast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, example_model("gpt.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  apply_checkpointing(ckpt, parse_checkpoint_plan("all"), plain_path);
  StepOptions options;
  options.device = kCuda;
  options.sgd_lr = 0.1;
  options.bf16_autocast = true;
  const auto input = [] { return gpt_input(2); };
  expect_same_gradients(train_steps(plain, input, 2, options), train_steps(ckpt, input, 2, options));
  EXPECT_FALSE(compat::cuda_autocast_enabled());
}

// cuDNN's convolutions and batch norm, recomputed on the device thread.
TEST(CudaCheckpointing, ResNetGradientsEqualThePlainRuns) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  OptimizeScope optimize(false);
  DeterministicCudnn deterministic;
  LOAD_OR_SKIP(plain, example_model("resnet18.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  const CheckpointReport report = apply_checkpointing(ckpt, parse_checkpoint_plan("all"), plain_path);
  EXPECT_EQ(report.checkpointed.size(), 8u);
  StepOptions options;
  options.device = kCuda;
  const auto input = [] { return std::vector<c10::IValue>{at::randn({2, 3, 224, 224})}; };
  expect_same_gradients(train_steps(plain, input, 1, options), train_steps(ckpt, input, 1, options));
}

// The CPU test CheckpointMemory.TheIncomingGradientGoesOnceTheBlocksFirstNodeHasRun
// on the GPU: make_checkpoint_models.py's widening.pt, two blocks of
// Linear(16, 64), exp and Linear(64, 16) under exp(out).sum(), B = 4096.
// Backward's peak above its start is 3W - N + down's weight and bias
// gradients + the loss's gradient (N = 1 MiB: one [B, 16] activation; W =
// 4 N), there as here; held to the block's end, the incoming gradient would
// add N. The allocator counts requests rounded up to 512 B (the two small
// gradients: 64 and 4 bytes), and a reduction may stage a few KiB: the
// bound above leaves 64 KiB for those, far less than N. The second of two
// steps is measured: the first makes the cuBLAS and cuBLASLt workspaces of
// the autograd thread's handles, which stay.
TEST(CudaCheckpointing, TheIncomingGradientGoesOnceTheBlocksFirstNodeHasRun) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kBatch = 4096;
  constexpr int64_t kActivation = kBatch * 16 * 4;        // N
  constexpr int64_t kWide = kBatch * 64 * 4;              // W
  constexpr int64_t kDownGradients = (64 * 16 + 16) * 4;  // down's weight and bias
  constexpr int64_t kSlack = 64 * 1024;
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(ckpt, test_model("widening.pt"));
  apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
  ckpt.to(kCuda);
  ckpt.train(true);
  CudaStatsSource stats(kCuda.index());
  int64_t peak = 0;
  for (int step = 0; step < 2; ++step) {
    testing::zero_grads(ckpt);
    const std::vector<c10::IValue> inputs{at::randn({kBatch, 16}).to(kCuda)};
    at::Tensor loss = at::exp(ckpt.forward(inputs).toTensor()).sum();
    const int64_t start = stats.read().allocated_bytes;
    stats.reset_peaks();
    loss.backward();
    peak = stats.read().allocated_peak_bytes - start;
  }
  const int64_t released = 3 * kWide - kActivation + kDownGradients + 4;
  EXPECT_GE(peak, released) << "N = " << kActivation;
  EXPECT_LT(peak, released + kSlack) << "N = " << kActivation << "; held to the block's end it is "
                                     << released + kActivation;
}

}  // namespace
}  // namespace oomtune
