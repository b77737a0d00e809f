// PyTorch Lightning Trainer writer (lightning_trainer.json).
// Loaded and run by Lightning 2.6.6 itself: tests/frameworks/lightning_test.py.
//
// Rules:
// - Trainer kwargs: accelerator, devices (1), precision ("32-true",
//   "bf16-mixed", "16-mixed"), accumulate_grad_batches, the job's gradient
//   clipping as gradient_clip_val with gradient_clip_algorithm "norm"
//   (absent without clipping: Lightning's default clips nothing; under
//   DeepSpeed the config's gradient_clipping, which DeepSpeed applies and
//   Lightning's DeepSpeed precision leaves to it), strategy: "auto",
//   or under DeepSpeed (offload, bf16_params) DeepSpeedStrategy's class and
//   kwargs, {"config": {...}}, for the script to build. No registered
//   strategy name says what was measured: "deepspeed_stage_1" is ZeRO-1
//   (one flat fp32 tensor per parameter group for the optimizer,
//   zero/stage_1_and_2.py:584, DeepSpeed 0.19.8), "deepspeed_stage_2_offload"
//   has 2e8-element buckets (strategies/deepspeed.py:106-107) and neither
//   can say torch_autocast. The config is deepspeed_sections.h's, as in
//   ds_config.json, less what Lightning sets itself (batch, accumulation,
//   which it refuses in the config) and the optimizer section
//   (configure_optimizers() builds the optimizer).
// - Precision under DeepSpeed: bf16_params is "bf16-mixed", which Lightning
//   turns into DeepSpeed's bf16 mode (bf16 weights, fp32 master weights;
//   fabric/strategies/deepspeed.py _format_precision_config). Autocast is
//   the config's torch_autocast with "32-true": "bf16-mixed" / "16-mixed"
//   would add DeepSpeed's bf16 / fp16 section, which casts the weights.
// - The Trainer has no batch size and no optimizer: the file carries
//   "datamodule": {"batch_size"} for the DataLoader and "optimizer" (class
//   and kwargs) for LightningModule.configure_optimizers(), with notes.
// - No Trainer switch for activation checkpointing: a note names the blocks
//   to wrap in torch.utils.checkpoint.
// - Under offload configure_optimizers should return DeepSpeedCPUAdam
//   (Lightning's DeepSpeed guide); SGD under offload gets
//   zero_allow_untested_optimizer true and zero_force_ds_cpu_optimizer
//   false in the config, as in ds_config.json.
// Source: https://lightning.ai/docs/pytorch/stable/common/trainer.html and
// https://lightning.ai/docs/pytorch/stable/advanced/model_parallel/deepspeed.html,
// checked against Lightning-AI/pytorch-lightning (commit 7f0c3436, after
// 2.6.5): src/lightning/pytorch/trainer/trainer.py (accelerator, devices,
// precision, accumulate_grad_batches, strategy),
// src/lightning/fabric/plugins/precision/precision.py and deepspeed.py
// ("32-true", "bf16-mixed", "16-mixed"),
// src/lightning/pytorch/strategies/deepspeed.py (DeepSpeedStrategy(config=
// dict): the dict replaces the default config; register_strategies;
// _format_batch_size_and_grad_accum_config refuses gradient_accumulation_steps
// in a given config and sets gradient_clipping only when absent), checked
// in the Lightning 2.6.6 wheel, and deepspeed/ops/adam/cpu_adam.py
// (DeepSpeedCPUAdam lr, betas, eps, weight_decay, adamw_mode).

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "common/json_text.h"
#include "recipes/deepspeed_sections.h"
#include "recipes/recipe_text.h"
#include "recipes/recipes.h"

namespace oomtune {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kCpuAdamClass = "deepspeed.ops.adam.DeepSpeedCPUAdam";
constexpr const char* kDeepSpeedStrategyClass = "lightning.pytorch.strategies.DeepSpeedStrategy";

std::string lightning_precision(const TrainingConfig& config) {
  switch (config.precision) {
    case Precision::kFp32:
      return "32-true";
    case Precision::kBf16:  // under DeepSpeed: the config's torch_autocast (see Rules)
      return recipe_text::uses_deepspeed(config) ? "32-true" : "bf16-mixed";
    case Precision::kBf16Params:
      return "bf16-mixed";  // under DeepSpeed (see Rules)
    case Precision::kFp16:
      return recipe_text::uses_deepspeed(config) ? "32-true" : "16-mixed";
  }
  return "?";
}

/// DeepSpeedStrategy(config=...)'s dict: the ZeRO and precision entries of
/// ds_config.json (deepspeed_sections.h), the job's clipping, and what SGD
/// under offload needs.
Json deepspeed_strategy_config(const Plan& plan) {
  Json config;
  config["zero_optimization"] = deepspeed_sections::zero_optimization(plan);
  for (auto& [key, section] : deepspeed_sections::precision(plan)) config[key] = std::move(section);
  // As measured, 0.0 included (Lightning writes it only when absent).
  config["gradient_clipping"] = plan.optimizer.max_grad_norm;
  for (auto& [key, entry] : deepspeed_sections::sgd_offload_entries(plan)) config[key] = std::move(entry);
  return config;
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
  if (recipe_text::uses_deepspeed(c))
    notes.push_back(fmt::format(
        "no registered strategy name gives what was measured ({}): \"strategy\" holds {}'s class and kwargs, "
        "which Trainer refuses as they stand; with kwargs = the \"trainer\" entry, build kwargs[\"strategy\"] = "
        "DeepSpeedStrategy(**kwargs[\"strategy\"][\"kwargs\"]), then Trainer(**kwargs). Its config holds DeepSpeed's "
        "ZeRO and precision entries; Lightning adds the batch and accumulation (it refuses "
        "gradient_accumulation_steps in the config), and configure_optimizers() builds the optimizer. Needs the "
        "deepspeed package and a GPU",
        c.offload_optimizer
            ? (deepspeed_sections::bucket_elements(plan) ? "ZeRO-2 offload with gradient buckets no larger than the "
                                                           "model; \"deepspeed_stage_2_offload\" allocates 2e8 elements"
                                                         : "ZeRO-2 offload")
            : "no ZeRO, stage 0; \"deepspeed_stage_1\" would give the optimizer one flat fp32 tensor per group",
        kDeepSpeedStrategyClass));
  if (c.optimizer == OptimizerKind::kAdamW8bit && c.offload_optimizer)
    notes.push_back(recipe_text::adamw8bit_offload_note());
  if (const std::string note = recipe_text::offload_host_note(plan); !note.empty()) notes.push_back(note);
  if (c.precision == Precision::kBf16Params)
    notes.push_back(recipe_text::bf16_params_note(
        "Lightning turns precision \"bf16-mixed\" into it under the DeepSpeedStrategy written here; without "
        "DeepSpeed \"bf16-mixed\" is autocast"));
  if (recipe_text::uses_deepspeed(c) && !deepspeed_sections::autocast_dtype(c.precision).empty()) {
    notes.push_back(fmt::format(
        "precision \"32-true\" although the plan trains under {0} autocast: the strategy's \"torch_autocast\" "
        "runs DeepSpeed's forward under it over fp32 weights, as measured; \"{1}\" under DeepSpeed adds DeepSpeed's "
        "\"{2}\": {{\"enabled\": true}} to the config, which casts the weights to {0}",
        deepspeed_sections::autocast_dtype(c.precision), c.precision == Precision::kBf16 ? "bf16-mixed" : "16-mixed",
        c.precision == Precision::kBf16 ? "bf16" : "fp16"));
    notes.push_back(deepspeed_sections::autocast_version_note(plan));
  }
  if (const std::string note = deepspeed_sections::unsized_buckets_note(plan); !note.empty()) notes.push_back(note);
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
  trainer["precision"] = lightning_precision(c);
  trainer["accumulate_grad_batches"] = c.accumulation_steps;
  if (plan.optimizer.max_grad_norm > 0 && !recipe_text::uses_deepspeed(c)) {
    trainer["gradient_clip_val"] = plan.optimizer.max_grad_norm;
    trainer["gradient_clip_algorithm"] = "norm";
  }
  if (recipe_text::uses_deepspeed(c))
    trainer["strategy"] = {{"class", kDeepSpeedStrategyClass},
                           {"kwargs", {{"config", deepspeed_strategy_config(plan)}}}};
  else
    trainer["strategy"] = "auto";
  Json file;
  file["trainer"] = std::move(trainer);
  file["datamodule"] = {{"batch_size", c.micro_batch}};
  file["optimizer"] = {{"class", lightning_optimizer_class(plan)}, {"kwargs", optimizer_kwargs(plan)}};
  file["notes"] = lightning_notes(plan);
  return json_text(file, 2) + "\n";
}

}  // namespace oomtune
