// Real users' files: Hugging Face GPT-2 traced by PyTorch 2.11
// (../shared/fixtures/torchscript/README.md).

#include <map>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>

#include "common/error.h"
#include "compat/torch_compat.h"
#include "quick_trial.h"
#include "session/autocast_scope.h"
#include "strategies/activation_checkpointing.h"
#include "strategies/training_step.h"
#include "support/archive_constants.h"
#include "support/require_file.h"
#include "support/same_gradients.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

std::string fixture(const std::string& name) {
  return std::string(OOMTUNE_SHARED_DIR) + "/fixtures/torchscript/" + name;
}

// GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=1000,
// n_positions=128): wte 1000 x 64, wpe 128 x 64; per block ln_1 and ln_2
// (2 x 128), c_attn 64 x 192 + 192, attn c_proj 64 x 64 + 64, c_fc 64 x 256
// + 256, mlp c_proj 256 x 64 + 64; ln_f 128. lm_head is tied to wte.
constexpr int64_t kBlock = 2 * 128 + (64 * 192 + 192) + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64);
constexpr int64_t kGpt2Parameters = 1000 * 64 + 128 * 64 + 2 * kBlock + 128;

JobSpec hf_job(const std::string& file) {
  JobSpec job = testing::gpt_job(4);
  job.model_path = fixture(file);
  job.output = std::string("logits");
  return job;
}

TEST(HuggingFaceFixture, EagerGpt2ProbesWithAnalyticStaticBytes) {
  const JobSpec job = hf_job("hf_gpt2_eager_trace.pt");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  const ProbeReport r = run_trial(job, baseline_config(job), testing::one_timed_step());
  ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
  EXPECT_EQ(r.parameter_count, kGpt2Parameters);
  EXPECT_EQ(r.static_memory.parameter_bytes, 4 * kGpt2Parameters);
  EXPECT_EQ(r.static_memory.gradient_bytes, 4 * kGpt2Parameters);
  EXPECT_EQ(r.static_memory.optimizer_state_bytes, 8 * kGpt2Parameters);
  EXPECT_GT(r.retained_activation_bytes, 0);
}

// The users' files on meta (issue #46 item 2): traced on the CPU by
// PyTorch 2.11, they make their position ids with device=cpu, which the
// session points at meta. Every phase's peak is then the CPU trial's less
// the graphs' tensor constants, which are host memory on meta; the eager
// and the SDPA trace alike (the SDPA one with the CUDA kernel's bytes on
// both: strategies/attention_rewrite.h).
TEST(HuggingFaceFixture, Gpt2OnMetaIsTheCpuTrialLessItsTensorConstants) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << "meta trials need libtorch 2 (the PyPI build)";
  for (const char* file : {"hf_gpt2_eager_trace.pt", "hf_gpt2_sdpa_trace.pt"}) {
    SCOPED_TRACE(file);
    JobSpec job = hf_job(file);
    OOMTUNE_REQUIRE_FILE(job.model_path);
    const ProbeReport cpu = run_trial(job, baseline_config(job), testing::one_timed_step());
    job.device = Device::kMeta;
    const ProbeReport meta = run_trial(job, baseline_config(job), testing::one_timed_step());
    ASSERT_EQ(cpu.outcome, TrialOutcome::kOk) << cpu.message;
    ASSERT_EQ(meta.outcome, TrialOutcome::kOk) << meta.message;
    // GPT-2 keeps no buffers; its tensor constants are on the CPU on meta.
    const int64_t constants = testing::archive_constant_bytes(job.model_path);
    EXPECT_GT(constants, 0);
    EXPECT_EQ(meta.static_memory.buffer_bytes, 0);
    EXPECT_EQ(cpu.static_memory.buffer_bytes, constants);
    for (Phase phase : {Phase::kForward, Phase::kLoss, Phase::kBackward, Phase::kOptimizer}) {
      SCOPED_TRACE(std::string(phase_name(phase)));
      const auto i = static_cast<std::size_t>(phase);
      EXPECT_EQ(meta.phases[i].peak_bytes + constants, cpu.phases[i].peak_bytes);
    }
    EXPECT_EQ(meta.retained_activation_bytes, cpu.retained_activation_bytes);
  }
}

TEST(HuggingFaceFixture, EagerGpt2NeedsAnOutputKey) {
  JobSpec job = hf_job("hf_gpt2_eager_trace.pt");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  job.output = std::monostate{};
  try {
    run_trial(job, baseline_config(job), testing::one_timed_step());
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "the model returns a dict; set output = \"KEY\" in the job spec (keys: logits: Float 3-d)"),
              std::string::npos)
        << e.what();
  }
}

// A traced model's error names the cause and the innermost transformers
// line: GPT2Config(n_positions=128), so position 128 is past wpe's table
// (transformers' modeling_gpt2.py line 576 in the exporting version).
TEST(HuggingFaceFixture, ForwardErrorsNameTheCauseAndTheModelLine) {
  JobSpec job = hf_job("hf_gpt2_eager_trace.pt");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  for (InputSpec& input : job.inputs) input.shape[1] = 200;
  try {
    run_trial(job, baseline_config(job), testing::one_timed_step());
    FAIL();
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("failed: index out of range in self (at modeling_gpt2.py:576 in forward)"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line";
  }
}

TEST(HuggingFaceFixture, SdpaGpt2LoadsOnlyWhereTheOperatorExists) {
  const JobSpec job = hf_job("hf_gpt2_sdpa_trace.pt");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  if (compat::kTorchMajor >= 2) {
    // aten::scaled_dot_product_attention arrived in PyTorch 2.0.
    const ProbeReport r = run_trial(job, baseline_config(job), testing::one_timed_step());
    ASSERT_EQ(r.outcome, TrialOutcome::kOk) << r.message;
    EXPECT_EQ(r.parameter_count, kGpt2Parameters);
    return;
  }
  try {
    run_trial(job, baseline_config(job), testing::one_timed_step());
    FAIL() << "libtorch " << compat::torch_version() << " loaded an SDPA model";
  } catch (const ModelError& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(message.find("uses operator aten::scaled_dot_product_attention, which the libtorch"), std::string::npos)
        << message;
    EXPECT_NE(message.find(std::string("(") + compat::torch_version() + ")"), std::string::npos) << message;
    EXPECT_NE(message.find("OOMTUNE_TORCH=python ./setup.sh"), std::string::npos) << message;
    EXPECT_NE(message.find("attn_implementation=\"eager\""), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line";
  }
}

/// How gpt2_gradients trains.
struct Gpt2Steps {
  int steps = 1;
  bool bf16 = false;  // forward and loss under bf16 autocast
  // Backward on a new thread, whose TorchScript graph executor has
  // libtorch's default (optimization on), as CUDA's backward runs on
  // autograd's device threads; forward stays on this one.
  bool backward_on_another_thread = false;
};

/// Parameter gradients of the last of `how.steps` training steps of the
/// traced GPT-2 (logits, cross-entropy against random targets) on the same
/// seeded random tokens, with the graph executor's optimization off here.
testing::Gradients gpt2_gradients(torch::jit::Module& module, Gpt2Steps how = {}) {
  const bool optimize = torch::jit::getGraphExecutorOptimize();
  torch::jit::setGraphExecutorOptimize(false);
  module.train(true);
  for (int step = 0; step < how.steps; ++step) {
    for (at::Tensor p : module.parameters(/*recurse=*/true)) p.mutable_grad() = at::Tensor();
    at::manual_seed(7);
    const at::Tensor ids = at::randint(1000, {4, 64}, at::kLong);
    const at::Tensor targets = at::randint(1000, {4, 64}, at::kLong);
    at::Tensor loss;
    {
      // As a trial on the CPU runs bf16 (session/train_step.cpp).
      AutocastScope autocast(c10::Device(c10::kCPU), how.bf16 ? std::optional(at::kBFloat16) : std::nullopt);
      const at::Tensor logits = module.forward({ids}).toGenericDict().at("logits").toTensor();
      loss = at::cross_entropy_loss(logits.reshape({-1, 1000}), targets.reshape({-1}));
    }
    if (!how.backward_on_another_thread) {
      loss.backward();
      continue;
    }
    std::string error;
    std::thread backward([&loss, &error] {
      try {
        loss.backward();
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    backward.join();
    EXPECT_EQ(error, "") << "step " << step;
  }
  torch::jit::setGraphExecutorOptimize(optimize);
  testing::Gradients grads;
  for (const auto& parameter : module.named_parameters(/*recurse=*/true))
    grads[parameter.name] = parameter.value.grad();
  return grads;
}

// The traced transformers GPT-2's blocks (transformer.h.0, .1: traced
// submodules called as prim::CallMethod with (Tensor, Tensor): the hidden
// states and the attention mask) checkpoint, and their gradients equal the
// plain run's. (The fixture was traced with its dropouts off: dropout under
// recomputation is covered by the checkpointing tests.)
TEST(HuggingFaceFixture, EagerGpt2CheckpointsItsBlocksWithTheSameGradients) {
  const std::string path = fixture("hf_gpt2_eager_trace.pt");
  OOMTUNE_REQUIRE_FILE(path);
  torch::jit::Module plain = torch::jit::load(path);
  torch::jit::Module ckpt = torch::jit::load(path);
  const CheckpointReport report = apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
  EXPECT_EQ(paths_of(report.checkpointed), (std::vector<std::string>{"transformer.h.0", "transformer.h.1"}));
  testing::expect_same_gradients(gpt2_gradients(plain), gpt2_gradients(ckpt));
}

// CUDA's backward runs on autograd's device threads, whose graph executor
// optimizes (the flag is per thread), while the trial's forward does not.
// A recomputation that took the thread's setting failed from the second
// step in bf16: the optimized plan's symbolic mm backward met the fp32
// weight ("expected m1 and m2 to have the same dtype, but got:
// c10::BFloat16 != float"; on an H200, "mat1 and mat2"). It runs under the
// forward's setting, and the gradients of three steps with backward on
// another thread equal the plain model's with backward on this one. The
// SDPA fixture only where aten::scaled_dot_product_attention exists.
TEST(HuggingFaceFixture, CheckpointedGpt2TrainsInBf16WhenBackwardRunsOnAnotherThread) {
  for (const char* file : {"hf_gpt2_eager_trace.pt", "hf_gpt2_sdpa_trace.pt"}) {
    SCOPED_TRACE(file);
    const std::string path = fixture(file);
    OOMTUNE_REQUIRE_FILE(path);
    if (compat::kTorchMajor < 2 && std::string(file).find("sdpa") != std::string::npos) continue;
    torch::jit::Module plain = torch::jit::load(path);
    torch::jit::Module ckpt = torch::jit::load(path);
    apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
    const auto expected = gpt2_gradients(plain, {/*steps=*/3, /*bf16=*/true, /*backward_on_another_thread=*/false});
    const auto actual = gpt2_gradients(ckpt, {/*steps=*/3, /*bf16=*/true, /*backward_on_another_thread=*/true});
    testing::expect_same_gradients(expected, actual);
  }
}

}  // namespace
}  // namespace oomtune
