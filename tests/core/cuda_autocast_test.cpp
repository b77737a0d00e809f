// CUDA's autocast on CPU and meta tensors (issue #46 items 1 and 6,
// session/cuda_autocast.h): the ops CUDA autocast runs in fp32 (softmax,
// layer_norm, sum, ...) or in the autocast dtype (mv, addmv, ...) are cast
// so on the CPU and on meta too. Expectations come from CUDA's lists
// (ATen/autocast_mode.h, AT_FORALL_*) and from the models' shapes
// (tests/core/make_test_models.py, ActivationMLP: x [B, 256] -> Linear 512
// -> softmax or ReLU -> Linear 10).

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include "compat/torch_compat.h"
#include "probes/meta_kernels.h"
#include "session/cuda_autocast.h"
#include "strategies/training_config.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune::cuda_autocast_test {
namespace {

constexpr int64_t kBatch = 8;
constexpr int64_t kHidden = 512;  // fc1's outputs, the activation's width

// Under the emulation to bf16, each op returns the dtype CUDA's lists say,
// on the CPU and on meta alike.
void expect_cast_as_cuda_would(at::Device device) {
  const at::Tensor x = at::randn({4, 8}, at::kBFloat16).to(device);
  const at::Tensor v = at::randn({8}).to(device);
  const at::Tensor w = at::randn({8, 8}).to(device).requires_grad_();
  set_emulated_cuda_autocast(true, at::kBFloat16);
  EXPECT_TRUE(emulated_cuda_autocast_enabled());
  const at::Tensor softmax = at::softmax(x, -1);
  const at::Tensor log_softmax = at::log_softmax(x, -1);
  const at::Tensor layer_norm = at::layer_norm(x, {8});
  const at::Tensor sum = x.sum();
  const at::Tensor exp = x.exp();
  const at::Tensor norm = x.norm();
  const at::Tensor mv = at::mv(x.to(at::kFloat), v);
  const at::Tensor relu = at::relu(x);
  const at::Tensor promoted = at::addcmul(x, v, v);
  const at::Tensor first = at::mm(x, w), second = at::mm(x, w);
  set_emulated_cuda_autocast(false, at::kBFloat16);
  clear_emulated_cuda_autocast_cache();
  EXPECT_FALSE(emulated_cuda_autocast_enabled());
  EXPECT_EQ(softmax.scalar_type(), at::kFloat);      // fp32_set_opt_dtype
  EXPECT_EQ(log_softmax.scalar_type(), at::kFloat);  // fp32_set_opt_dtype
  EXPECT_EQ(layer_norm.scalar_type(), at::kFloat);   // fp32
  EXPECT_EQ(sum.scalar_type(), at::kFloat);          // fp32_set_opt_dtype
  EXPECT_EQ(exp.scalar_type(), at::kFloat);          // fp32
  EXPECT_EQ(norm.scalar_type(), at::kFloat);         // fp32_append_dtype
  EXPECT_EQ(mv.scalar_type(), at::kBFloat16);        // lower_precision_fp
  EXPECT_EQ(relu.scalar_type(), at::kBFloat16);      // in no list: the input's
  EXPECT_EQ(promoted.scalar_type(), at::kFloat);     // promote: the widest input
  EXPECT_EQ(first.scalar_type(), at::kBFloat16);
  EXPECT_EQ(first.device(), device);
  // The weight was cast once: both products take the same bf16 copy (one
  // cast node in their graphs).
  const auto weight_cast = [](const at::Tensor& product) {
    return product.grad_fn()->next_edges().at(1).function.get();
  };
  ASSERT_NE(weight_cast(first), nullptr);
  EXPECT_EQ(weight_cast(first), weight_cast(second));
  // Outside autocast nothing is cast.
  EXPECT_EQ(at::softmax(x, -1).scalar_type(), at::kBFloat16);
}

TEST(CudaAutocast, CastsAsCudaWouldOnTheCpuAndOnMeta) {
  if (!cuda_autocast_available()) GTEST_SKIP() << "libtorch 1.13's ATen/autocast_mode.h has no CUDA lists";
  expect_cast_as_cuda_would(at::kCPU);
  install_meta_kernels();  // layer_norm's, among others
  expect_cast_as_cuda_would(at::kMeta);
}

ProbeReport probe(const std::string& model, const std::string& precision) {
  JobSpec job = testing::mlp_job(kBatch);
  job.model_path = testing::test_model(model);
  TrainingConfig config;
  config.micro_batch = kBatch;
  config.accumulation_steps = 1;
  config.precision = parse_precision(precision);
  TrialOptions options = testing::quick_trial();
  options.enforce_budget = false;
  return run_trial(job, config, options);
}

// In bf16 the softmax keeps its fp32 output and the second Linear a bf16
// copy of it (6 bytes an element) where ReLU's bf16 output serves both
// (2 bytes); in fp32 both keep the one 4-byte output.
TEST(CudaAutocast, Bf16SoftmaxKeepsCudasFp32Output) {
  if (!cuda_autocast_available()) GTEST_SKIP() << "libtorch 1.13's ATen/autocast_mode.h has no CUDA lists";
  OOMTUNE_REQUIRE_FILE(testing::test_model("softmax_mlp"));
  const ProbeReport softmax = probe("softmax_mlp", "bf16");
  if (softmax.outcome != TrialOutcome::kOk && softmax.message.find("primitive") != std::string::npos)
    GTEST_SKIP() << "bf16 does not run at this kernel level: " << softmax.message;
  ASSERT_EQ(softmax.outcome, TrialOutcome::kOk) << softmax.message;
  const ProbeReport relu = probe("relu_mlp", "bf16");
  ASSERT_EQ(relu.outcome, TrialOutcome::kOk) << relu.message;
  EXPECT_EQ(softmax.retained_activation_bytes - relu.retained_activation_bytes, kBatch * kHidden * (4 + 2 - 2));
  EXPECT_EQ(softmax.autocast_lists, "cuda");
  const ProbeReport softmax32 = probe("softmax_mlp", "fp32");
  const ProbeReport relu32 = probe("relu_mlp", "fp32");
  EXPECT_EQ(softmax32.retained_activation_bytes, relu32.retained_activation_bytes);
}

}  // namespace
}  // namespace oomtune::cuda_autocast_test
