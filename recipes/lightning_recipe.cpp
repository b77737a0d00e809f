// PyTorch Lightning Trainer writer (lightning_trainer.json).
// Loaded and run by Lightning 2.6.6 itself: tests/frameworks/lightning_test.py.
//
// Rules:
// - Trainer kwargs: accelerator, devices (1), precision ("32-true",
//   "bf16-mixed", "16-mixed"), accumulate_grad_batches, strategy ("auto", or
//   "deepspeed_stage_2_offload" for optimizer offload).
// - bf16_params: "bf16-mixed" under a DeepSpeed strategy, which Lightning
//   turns into DeepSpeed's bf16 mode (bf16 weights, fp32 master weights);
//   without offload the strategy is "deepspeed_stage_1" (on one GPU ZeRO
//   stage 1 partitions nothing).
// - The Trainer has no batch size and no optimizer: the file carries
//   "datamodule": {"batch_size"} for the DataLoader and "optimizer" (class
//   and kwargs) for LightningModule.configure_optimizers(), with notes.
// - No Trainer switch for activation checkpointing: a note names the blocks
//   to wrap in torch.utils.checkpoint.
// - Under deepspeed_stage_2_offload configure_optimizers should return
//   DeepSpeedCPUAdam (Lightning's DeepSpeed guide); SGD under offload needs
//   DeepSpeedStrategy(config={...}) with zero_force_ds_cpu_optimizer false
//   (a config dict, not ds_config.json: Lightning refuses a DeepSpeed config
//   that sets gradient_accumulation_steps).
// Source: https://lightning.ai/docs/pytorch/stable/common/trainer.html and
// https://lightning.ai/docs/pytorch/stable/advanced/model_parallel/deepspeed.html,
// checked against Lightning-AI/pytorch-lightning (commit 7f0c3436, after
// 2.6.5): src/lightning/pytorch/trainer/trainer.py (accelerator, devices,
// precision, accumulate_grad_batches, strategy),
// src/lightning/fabric/plugins/precision/precision.py and deepspeed.py
// ("32-true", "bf16-mixed", "16-mixed"),
// src/lightning/pytorch/strategies/deepspeed.py (register_strategies:
// "deepspeed_stage_1", "deepspeed_stage_2_offload";
// zero_allow_untested_optimizer true by default;
// _format_batch_size_and_grad_accum_config refuses gradient_accumulation_steps
// in a given config) and deepspeed/ops/adam/cpu_adam.py (DeepSpeedCPUAdam
// lr, betas, eps, weight_decay, adamw_mode).

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "common/json_text.h"
#include "recipes/recipe_text.h"
#include "recipes/recipes.h"

namespace oomtune {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kOffloadStrategy = "deepspeed_stage_2_offload";  // Lightning's registered ZeRO-Offload
constexpr const char* kCpuAdamClass = "deepspeed.ops.adam.DeepSpeedCPUAdam";
constexpr const char* kDeepSpeedStrategy = "deepspeed_stage_1";  // Lightning's registered DeepSpeed, no offload

std::string lightning_precision(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "32-true";
    case Precision::kBf16:
    case Precision::kBf16Params:
      return "bf16-mixed";  // bf16_params: under DeepSpeed (see Rules)
    case Precision::kFp16:
      return "16-mixed";
  }
  return "?";
}

bool sgd_offload(const Plan& plan) {
  return plan.config.optimizer == OptimizerKind::kSgd && plan.config.offload_optimizer;
}

/// The optimizer class configure_optimizers() should return.
std::string lightning_optimizer_class(const Plan& plan) {
  if (plan.config.offload_optimizer && plan.config.optimizer != OptimizerKind::kSgd) return kCpuAdamClass;
  return recipe_text::optimizer_class(plan.config.optimizer);
}

Json optimizer_kwargs(const Plan& plan) {
  const OptimizerHyperParameters& o = plan.optimizer;
  // fused=True / foreach=False, the implementation measured (recipe_text.h).
  const auto [implementation_key, implementation_value] = recipe_text::implementation_keyword(plan);
  if (plan.config.optimizer == OptimizerKind::kSgd) {
    Json kwargs{{"lr", o.lr}, {"momentum", o.momentum}, {"weight_decay", o.weight_decay}};
    if (!implementation_key.empty()) kwargs[implementation_key] = implementation_value == "True";
    return kwargs;
  }
  if (plan.config.optimizer == OptimizerKind::kAdafactor)
    return Json{{"lr", o.lr},
                {"scale_parameter", false},
                {"relative_step", false},
                {"warmup_init", false},
                {"weight_decay", o.weight_decay}};
  Json kwargs{{"lr", o.lr}, {"betas", {o.beta1, o.beta2}}, {"eps", o.eps}, {"weight_decay", o.weight_decay}};
  if (lightning_optimizer_class(plan) == kCpuAdamClass) kwargs["adamw_mode"] = true;
  if (!implementation_key.empty()) kwargs[implementation_key] = implementation_value == "True";
  return kwargs;
}

}  // namespace

std::vector<std::string> lightning_notes(const Plan& plan) {
  const TrainingConfig& c = plan.config;
  std::vector<std::string> notes;
  notes.push_back(recipe_text::batch_note(plan, "the Trainer has no batch size; the DataModule's DataLoader"));
  notes.push_back(fmt::format("the Trainer has no optimizer: LightningModule.configure_optimizers() returns {}",
                              recipe_text::optimizer_call(plan, "self.parameters()", lightning_optimizer_class(plan))));
  if (c.checkpoint.enabled())
    notes.push_back(fmt::format(
        "the Trainer has no activation-checkpointing switch: wrap {} ({}) in torch.utils.checkpoint.checkpoint "
        "inside the LightningModule's forward",
        recipe_text::describe_checkpoint(c.checkpoint), to_string(c.checkpoint)));
  if (c.optimizer == OptimizerKind::kAdamW8bit && !c.offload_optimizer)
    notes.push_back("bitsandbytes.optim.AdamW8bit needs the bitsandbytes package");
  if (c.optimizer == OptimizerKind::kAdafactor) notes.push_back(recipe_text::adafactor_note());
  if (c.offload_optimizer)
    notes.push_back(fmt::format("strategy \"{}\" needs the deepspeed package and a GPU", kOffloadStrategy));
  if (c.optimizer == OptimizerKind::kAdamW8bit && c.offload_optimizer)
    notes.push_back(recipe_text::adamw8bit_offload_note());
  if (sgd_offload(plan))
    notes.push_back(
        "SGD with optimizer offload: DeepSpeed refuses a non-DeepSpeed optimizer under offload unless "
        "zero_force_ds_cpu_optimizer is false, which the registered strategy name cannot say: use "
        "strategy=DeepSpeedStrategy(config={\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
        "{\"device\": \"cpu\", \"pin_memory\": True}}, \"zero_allow_untested_optimizer\": True, "
        "\"zero_force_ds_cpu_optimizer\": False}), the same entries as the ds_config.json written beside this file; "
        "not that file itself, which Lightning refuses because it sets gradient_accumulation_steps (Lightning takes "
        "it from accumulate_grad_batches)");
  if (c.precision == Precision::kBf16Params)
    notes.push_back(recipe_text::bf16_params_note(fmt::format(
        "Lightning turns precision \"bf16-mixed\" into it under a DeepSpeed strategy (\"{}\" here; on one GPU "
        "nothing is partitioned); without DeepSpeed \"bf16-mixed\" is autocast",
        c.offload_optimizer ? kOffloadStrategy : kDeepSpeedStrategy)));
  if (recipe_text::uses_deepspeed(c) && plan.device == Device::kCpu)
    notes.push_back(recipe_text::deepspeed_needs_gpu_note(c));
  if (const std::string note = recipe_text::trainable_note(plan); !note.empty()) notes.push_back(note);
  return notes;
}

std::string write_lightning_trainer(const Plan& plan) {
  validate_plan(plan);
  const TrainingConfig& c = plan.config;
  Json trainer;
  // DeepSpeed needs a GPU whatever the plan was measured on (see the note).
  trainer["accelerator"] = plan.device == Device::kCuda || recipe_text::uses_deepspeed(c) ? "gpu" : "cpu";
  trainer["devices"] = 1;
  trainer["precision"] = lightning_precision(c.precision);
  trainer["accumulate_grad_batches"] = c.accumulation_steps;
  trainer["strategy"] = c.offload_optimizer                     ? kOffloadStrategy
                        : c.precision == Precision::kBf16Params ? kDeepSpeedStrategy
                                                                : "auto";
  Json file;
  file["trainer"] = std::move(trainer);
  file["datamodule"] = {{"batch_size", c.micro_batch}};
  file["optimizer"] = {{"class", lightning_optimizer_class(plan)}, {"kwargs", optimizer_kwargs(plan)}};
  file["notes"] = lightning_notes(plan);
  return json_text(file, 2) + "\n";
}

}  // namespace oomtune
