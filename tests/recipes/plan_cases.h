#pragma once
// The representative plans behind the golden files in golden/<case>/.
// Each mirrors a configuration autotune chooses (docs/recipes.md):
//   fp32_adamw        plain fp32 AdamW, micro-batch 8 x 4 accumulation steps
//   ckpt_bf16_accum   checkpoint every block, micro-batch 4 x 8, bf16
//   adamw8bit_fp16    8-bit AdamW, selective checkpointing (first 2 blocks), fp16
//   offload_bf16      optimizer offload, bf16, checkpointing of named submodules
//   sgd_offload_cpu   SGD with momentum + offload, measured on the CPU
//   bf16_params_cpu   bf16 weights + fp32 master weights (the fallback when
//                     bf16 autocast fails), micro-batch 8 x 2, on the CPU
//   adamw8bit_bf16_params_ckpt  the three together (a pair with checkpointing,
//                     Note [Pairs] in search/walk.cpp, in the
//                     fallback form), micro-batch 4 x 4 on CUDA
//   adafactor_ckpt    Adafactor (the job allows it) with every block
//                     checkpointed, bf16 autocast, micro-batch 16 x 2
//   bf16_cpu          bf16 autocast measured on the CPU, micro-batch 16 x 2:
//                     files for a CPU run (TrainingArguments refuses bf16
//                     without use_cpu on a machine with no bf16 GPU)
//   lora_adapters     only the LoRA adapters train (trainable globs,
//                     examples/llama_lora.toml): every writer notes the set
//   fused_adamw       plain fp32 AdamW measured with optimizer.implementation
//                     = "fused" (HF adamw_torch_fused, DeepSpeed's FusedAdam,
//                     fused=True in the optimizer calls)
//   sgd_single_tensor SGD with weight decay, no momentum, measured with
//                     implementation = "single_tensor" (foreach=False; a note
//                     where a framework has no key)

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "recipes/plan.h"

namespace oomtune::testing {

/// Every writer's expected output for every case, one folder per case
/// (golden_test.cpp writes them with OOMTUNE_UPDATE_GOLDEN=1).
inline const std::filesystem::path kGoldenDir = std::filesystem::path(OOMTUNE_SOURCE_DIR) / "tests/recipes/golden";

inline Plan base_plan(int64_t micro_batch, int64_t accumulation_steps) {
  TrainingConfig config;
  config.micro_batch = micro_batch;
  config.accumulation_steps = accumulation_steps;
  Plan plan = plan_for(config);
  plan.device = Device::kCuda;
  plan.budget_bytes = int64_t{16} << 30;  // 16 GiB
  plan.headroom = 0.05;
  plan.model_path = "examples/models/gpt.pt";
  plan.job_spec_path = "examples/gpt.toml";
  plan.parameter_count = 1'057'536;  // gpt.pt's parameters (torch.jit.load(...).parameters())
  return plan;
}

inline std::vector<std::pair<std::string, Plan>> golden_plans() {
  std::vector<std::pair<std::string, Plan>> cases;

  Plan fp32 = base_plan(8, 4);
  fp32.measured_peak_bytes = 13'421'772'800;
  fp32.measured_samples_per_second = 412.5;
  fp32.notes = {"fits without any memory-saving strategy"};
  cases.emplace_back("fp32_adamw", fp32);

  Plan ckpt = base_plan(4, 8);
  ckpt.config.checkpoint.mode = CheckpointPlan::Mode::kAll;
  ckpt.config.precision = Precision::kBf16;
  ckpt.optimizer.lr = 3e-4;
  ckpt.optimizer.weight_decay = 0.1;
  ckpt.optimizer.beta2 = 0.95;
  ckpt.optimizer.max_grad_norm = 1.0;  // clipped, as language models train
  ckpt.measured_peak_bytes = 15'032'385'536;
  ckpt.predicted_peak_bytes = 14'763'950'080;
  ckpt.measured_samples_per_second = 96.25;
  ckpt.notes = {"micro-batch 8 ran out of memory at step 5", "checkpointing costs +27% step time"};
  cases.emplace_back("ckpt_bf16_accum", ckpt);

  Plan eight_bit = base_plan(16, 2);
  eight_bit.config.optimizer = OptimizerKind::kAdamW8bit;
  eight_bit.config.precision = Precision::kFp16;
  eight_bit.config.checkpoint.mode = CheckpointPlan::Mode::kFirstN;
  eight_bit.config.checkpoint.first_n = 2;
  eight_bit.optimizer.lr = 1e-4;
  eight_bit.optimizer.weight_decay = 0.0;
  eight_bit.optimizer.max_grad_norm = 0.5;  // after fp16's unscale_
  eight_bit.budget_bytes = int64_t{8} << 30;
  eight_bit.predicted_peak_bytes = 7'516'192'768;
  cases.emplace_back("adamw8bit_fp16", eight_bit);

  Plan offload = base_plan(2, 16);
  offload.config.offload_optimizer = true;
  offload.config.precision = Precision::kBf16;
  offload.config.checkpoint.mode = CheckpointPlan::Mode::kPaths;
  offload.config.checkpoint.paths = {"blocks.0", "blocks.1"};
  offload.optimizer.lr = 2e-5;
  offload.optimizer.max_grad_norm = 1.0;  // DeepSpeed clips the host's fp32 gradients
  offload.budget_bytes = int64_t{24} << 30;
  offload.headroom = 0.1;
  offload.measured_peak_bytes = 22'548'578'304;
  offload.measured_samples_per_second = 18.0;
  offload.measured_host_peak_bytes = 17'977'344;  // the example GPT's 16 x 1057536 + the batch and host temporaries
  offload.notes = {"offload moves 8 bytes/parameter of AdamW state to the host"};
  cases.emplace_back("offload_bf16", offload);

  Plan sgd = base_plan(32, 1);
  sgd.config.optimizer = OptimizerKind::kSgd;
  sgd.config.offload_optimizer = true;
  sgd.device = Device::kCpu;
  sgd.budget_bytes = int64_t{4} << 30;
  sgd.optimizer.lr = 0.1;
  sgd.optimizer.weight_decay = 1e-4;
  sgd.optimizer.momentum = 0.9;
  sgd.model_path = "examples/models/resnet18.pt";
  sgd.job_spec_path = "examples/resnet18.toml";
  sgd.parameter_count = 11'689'512;  // resnet18.pt's
  cases.emplace_back("sgd_offload_cpu", sgd);

  Plan bf16_params = base_plan(8, 2);
  bf16_params.config.precision = Precision::kBf16Params;
  bf16_params.device = Device::kCpu;
  bf16_params.budget_bytes = int64_t{256} << 20;
  bf16_params.measured_peak_bytes = 98'566'144;
  bf16_params.measured_samples_per_second = 14.5;
  bf16_params.notes = {
      "bf16: autocast failed (crashed: SIGSEGV during forward), so bf16 runs as bf16 parameters "
      "with fp32 master weights kept by the optimizer (precision = \"bf16_params\")"};
  cases.emplace_back("bf16_params_cpu", bf16_params);

  Plan pair = base_plan(4, 4);
  pair.config.optimizer = OptimizerKind::kAdamW8bit;
  pair.config.precision = Precision::kBf16Params;
  pair.config.checkpoint.mode = CheckpointPlan::Mode::kAll;
  pair.optimizer.lr = 1e-4;
  pair.budget_bytes = int64_t{24} << 30;
  pair.predicted_peak_bytes = 21'474'836'480;
  pair.measured_peak_bytes = 21'206'401'024;
  pair.measured_samples_per_second = 7.5;
  cases.emplace_back("adamw8bit_bf16_params_ckpt", pair);

  Plan adafactor = base_plan(16, 2);
  adafactor.config.optimizer = OptimizerKind::kAdafactor;
  adafactor.config.precision = Precision::kBf16;
  adafactor.config.checkpoint.mode = CheckpointPlan::Mode::kAll;
  adafactor.optimizer.lr = 1e-3;
  adafactor.optimizer.weight_decay = 0.01;
  adafactor.budget_bytes = int64_t{12} << 30;
  adafactor.predicted_peak_bytes = 10'737'418'240;
  adafactor.measured_peak_bytes = 10'468'982'784;
  adafactor.measured_samples_per_second = 52.0;
  cases.emplace_back("adafactor_ckpt", adafactor);

  Plan bf16_cpu = base_plan(16, 2);
  bf16_cpu.config.precision = Precision::kBf16;
  bf16_cpu.device = Device::kCpu;
  bf16_cpu.budget_bytes = int64_t{512} << 20;
  bf16_cpu.measured_peak_bytes = 301'989'888;
  bf16_cpu.measured_samples_per_second = 40.0;
  cases.emplace_back("bf16_cpu", bf16_cpu);

  Plan lora = base_plan(4, 2);
  lora.optimizer.lr = 2e-4;
  lora.budget_bytes = int64_t{256} << 20;
  lora.device = Device::kCpu;
  lora.model_path = "examples/models/llama_lora_eager.pt";
  lora.job_spec_path = "examples/llama_lora.toml";
  lora.trainable = {ParameterSelection::Rule::kTrainable, {"*.lora_A.*", "*.lora_B.*"}, false};
  lora.parameter_count = 16'384;  // the adapters' of llama_lora_eager.pt (668,288 in all)
  lora.measured_peak_bytes = 41'943'040;
  lora.measured_samples_per_second = 120.0;
  cases.emplace_back("lora_adapters", lora);

  Plan fused = base_plan(8, 4);
  fused.optimizer.implementation = OptimizerImplementation::kFused;
  fused.measured_peak_bytes = 12'884'901'888;
  cases.emplace_back("fused_adamw", fused);

  Plan single = base_plan(16, 2);
  single.config.optimizer = OptimizerKind::kSgd;
  single.optimizer.lr = 0.05;
  single.optimizer.weight_decay = 1e-4;
  single.optimizer.implementation = OptimizerImplementation::kSingleTensor;
  single.model_path = "examples/models/resnet18.pt";
  single.job_spec_path = "examples/resnet18.toml";
  single.parameter_count = 11'689'512;
  cases.emplace_back("sgd_single_tensor", single);

  return cases;
}

}  // namespace oomtune::testing
