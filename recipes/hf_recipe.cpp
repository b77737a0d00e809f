// Hugging Face TrainingArguments writer (hf_training_args.json).
// Loaded and run by transformers 5.24.0 itself: tests/frameworks/hf_test.py.
//
// Rules:
// - Batch: per_device_train_batch_size = micro-batch,
//   gradient_accumulation_steps = accumulation steps.
// - Optimizer: optim "adamw_torch", "adamw_bnb_8bit" or "sgd" with
//   learning_rate, weight_decay and (AdamW kinds) adam_beta1/2, adam_epsilon.
//   SGD momentum has no TrainingArguments field: a note says how to pass it.
// - Precision: bf16 / fp16 booleans (torch.autocast, fp32 weights).
//   bf16_params (bf16 weights, fp32 master weights) only exists through
//   DeepSpeed: bf16 = true and `deepspeed` names ds_config.json. Autocast
//   under DeepSpeed (offload) is ds_config.json's torch_autocast with bf16
//   and fp16 false: true would make the Trainer's Accelerate add DeepSpeed's
//   bf16/fp16 section to the config (accelerate/utils/dataclasses.py
//   set_mixed_precision, 1.15.0), which casts the weights.
// - Learning rate: lr_scheduler_type "constant", as measured (the default
//   "linear" decays to 0). The Trainer's optimizer leaves biases and norm
//   weights undecayed (trainer.py get_decay_parameter_names, 5.24.0) where
//   the measured step decays all: a note, when weight decay is on and the
//   Trainer builds the optimizer.
// - Checkpointing: gradient_checkpointing is all-or-nothing over a
//   transformers model's layers; a selective plan is written as true (the
//   nearest form: more recompute, less memory) with a note.
// - Offload: the Trainer offloads only through DeepSpeed, so `deepspeed`
//   names ds_config.json (written beside, see needs()), whose optimizer
//   section the Trainer then uses instead of `optim`.
// - Device: use_cpu = true for a plan measured on the CPU (not through
//   DeepSpeed, which trains on a GPU), as the Accelerate and Lightning files
//   say; without it TrainingArguments refuses bf16 on a machine without a
//   bf16 GPU ("Your setup doesn't support bf16/gpu", transformers 5.24).
// - Gradient clipping: max_grad_norm = the job's, 0 for none. The Trainer
//   clips at 1.0 by default, so 0 is written too; ds_config.json says the
//   same gradient_clipping, and the Trainer refuses the two if they differ.
// Source: https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments
// and https://huggingface.co/docs/transformers/deepspeed, checked against
// huggingface/transformers src/transformers/training_args.py (5.x, commit
// 00349ae8: per_device_train_batch_size, gradient_accumulation_steps,
// gradient_checkpointing, optim / OptimizerNames "adamw_torch",
// "adamw_bnb_8bit", "sgd", learning_rate, weight_decay, adam_beta1/2,
// adam_epsilon, max_grad_norm, lr_scheduler_type, bf16, fp16, deepspeed;
// the same names exist in 4.x, where "adamw_hf", not written here, was the
// old default), src/transformers/trainer.py (create_optimizer's weight-decay
// groups, 5.24.0) and
// src/transformers/integrations/deepspeed.py (commit 02348331: fill_match
// checks ds_config.json's train_batch_size, micro-batch, accumulation,
// optimizer params, fp16/bf16 against these arguments; an optimizer section
// makes the Trainer pass DummyOptim).

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "common/json_text.h"
#include "recipes/deepspeed_sections.h"
#include "recipes/recipe_text.h"
#include "recipes/recipes.h"

namespace oomtune {
namespace {

using Json = nlohmann::ordered_json;

/// TrainingArguments.optim for the plan. Under offload DeepSpeed's own
/// optimizer replaces it (8-bit AdamW cannot be offloaded: see the note).
std::string hf_optim(const Plan& plan) {
  switch (plan.config.optimizer) {
    case OptimizerKind::kAdamW:
      // torch.optim.AdamW(fused=True) (transformers/trainer_optimizer.py, _get_adamw_torch)
      if (!plan.config.offload_optimizer && plan.optimizer.implementation == OptimizerImplementation::kFused)
        return "adamw_torch_fused";
      return "adamw_torch";
    case OptimizerKind::kAdamW8bit:
      return plan.config.offload_optimizer ? "adamw_torch" : "adamw_bnb_8bit";
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdafactor:
      return "adafactor";  // OptimizerNames.ADAFACTOR (transformers/training_args.py)
  }
  return "?";
}

/// Whether the Trainer builds the optimizer from `optim` (create_optimizer,
/// with its weight-decay groups): not when ds_config.json's optimizer
/// section does (transformers/integrations/deepspeed.py
/// deepspeed_optim_sched, 5.24.0).
bool trainer_builds_optimizer(const Plan& plan) {
  return !recipe_text::uses_deepspeed(plan.config) || !deepspeed_sections::has_optimizer_section(plan);
}

/// Whether TrainingArguments' bf16 / fp16 switch is on: autocast without
/// DeepSpeed, and bf16_params (DeepSpeed's bf16 mode, which the Trainer
/// checks against ds_config.json's bf16.enabled). Autocast under DeepSpeed
/// is the file's torch_autocast instead.
bool hf_bf16(const Plan& plan) {
  const Precision p = plan.config.precision;
  return p == Precision::kBf16Params || (p == Precision::kBf16 && !recipe_text::uses_deepspeed(plan.config));
}
bool hf_fp16(const Plan& plan) {
  return plan.config.precision == Precision::kFp16 && !recipe_text::uses_deepspeed(plan.config);
}

}  // namespace

std::vector<std::string> hf_notes(const Plan& plan) {
  const TrainingConfig& c = plan.config;
  std::vector<std::string> notes;
  if (c.checkpoint.mode == CheckpointPlan::Mode::kAll) {
    notes.push_back(
        "gradient_checkpointing works on transformers models (PreTrainedModel); for another nn.Module wrap each "
        "block in torch.utils.checkpoint.checkpoint yourself");
  } else if (c.checkpoint.enabled()) {
    notes.push_back(fmt::format(
        "the plan checkpoints only {} ({}), but gradient_checkpointing = true checkpoints every layer: less "
        "memory and more recompute than measured; for the measured trade-off wrap just those blocks in "
        "torch.utils.checkpoint.checkpoint",
        recipe_text::describe_checkpoint(c.checkpoint), to_string(c.checkpoint)));
  }
  if (c.offload_optimizer)
    notes.push_back(
        "optimizer offload is not a TrainingArguments feature: `deepspeed` points at ds_config.json (written "
        "beside this file; the path is relative to the run's working folder; needs the deepspeed package and a "
        "GPU), whose optimizer section replaces `optim`");
  if (c.optimizer == OptimizerKind::kAdamW8bit && c.offload_optimizer)
    notes.push_back(recipe_text::adamw8bit_offload_note());
  if (const std::string note = recipe_text::offload_host_note(plan); !note.empty()) notes.push_back(note);
  if (c.optimizer == OptimizerKind::kAdamW8bit && !c.offload_optimizer)
    notes.push_back("optim = \"adamw_bnb_8bit\" needs the bitsandbytes package");
  if (c.optimizer == OptimizerKind::kAdafactor) notes.push_back(recipe_text::adafactor_note());
  // Under DeepSpeed the Trainer drops an optimizer passed to it
  // (integrations/deepspeed.py deepspeed_init: trainer.optimizer = None);
  // the file's optimizer section carries momentum and the implementation.
  const bool own_optimizer = !recipe_text::uses_deepspeed(c);
  const bool sgd_momentum = c.optimizer == OptimizerKind::kSgd && own_optimizer && plan.optimizer.momentum != 0.0;
  if (sgd_momentum)
    notes.push_back(fmt::format(
        "TrainingArguments has no SGD momentum: build optimizer = {} and pass Trainer(..., optimizers=(optimizer, "
        "None))",
        recipe_text::optimizer_call(plan, "model.parameters()")));
  // adamw_torch_fused says fused; single_tensor, and SGD's other forms, have no optim name.
  std::string implementation;
  if (own_optimizer && !sgd_momentum && hf_optim(plan) != "adamw_torch_fused")
    implementation =
        recipe_text::implementation_note(plan, fmt::format("TrainingArguments(optim=\"{}\")", hf_optim(plan)),
                                         "pass Trainer(..., optimizers=(optimizer, None))");
  if (!implementation.empty()) notes.push_back(implementation);
  // The Trainer's own optimizer groups the weight decay (trainer.py
  // create_optimizer); DeepSpeed's, from the file, and the notes' decay all.
  if (trainer_builds_optimizer(plan) && !sgd_momentum && implementation.empty() && plan.optimizer.weight_decay != 0.0)
    notes.push_back(fmt::format(
        "the Trainer's optimizer applies weight_decay = {} to every parameter but biases and norm weights "
        "(trainer.py get_decay_parameter_names), the measured step to all of them: the same memory, a slightly "
        "different update{}",
        recipe_text::number(plan.optimizer.weight_decay),
        own_optimizer ? fmt::format("; for the measured one pass Trainer(..., optimizers=(optimizer, None)) with "
                                    "optimizer = {}",
                                    recipe_text::optimizer_call(plan, "model.parameters()"))
                      : ""));
  if (c.precision == Precision::kBf16Params)
    notes.push_back(recipe_text::bf16_params_note(
        "`deepspeed` points at ds_config.json (written beside this file), whose \"bf16\" section keeps the "
        "weights in bf16; bf16 = true without it would be autocast"));
  if (recipe_text::uses_deepspeed(c) && !deepspeed_sections::autocast_dtype(c.precision).empty())
    notes.push_back(fmt::format(
        "{0} = false although the plan trains under {0} autocast: ds_config.json's \"torch_autocast\" section "
        "runs DeepSpeed's forward under it over fp32 weights, as measured; {0} = true would make the Trainer add "
        "DeepSpeed's \"{0}\": {{\"enabled\": true}} to the config (Accelerate's "
        "DeepSpeedPlugin.set_mixed_precision), which casts the weights to {1}",
        c.precision == Precision::kBf16 ? "bf16" : "fp16", deepspeed_sections::autocast_dtype(c.precision)));
  if (recipe_text::uses_deepspeed(c) && plan.device == Device::kCpu)
    notes.push_back(recipe_text::deepspeed_needs_gpu_note(c));
  if (const std::string note = recipe_text::trainable_note(plan); !note.empty()) notes.push_back(note);
  return notes;
}

std::string write_hf_training_args(const Plan& plan) {
  validate_plan(plan);
  const TrainingConfig& c = plan.config;
  const OptimizerHyperParameters& o = plan.optimizer;
  Json args;
  args["per_device_train_batch_size"] = c.micro_batch;
  args["gradient_accumulation_steps"] = c.accumulation_steps;
  args["gradient_checkpointing"] = c.checkpoint.enabled();
  args["optim"] = hf_optim(plan);
  args["learning_rate"] = o.lr;
  args["weight_decay"] = o.weight_decay;
  if (c.optimizer == OptimizerKind::kAdamW || c.optimizer == OptimizerKind::kAdamW8bit) {
    args["adam_beta1"] = o.beta1;
    args["adam_beta2"] = o.beta2;
    args["adam_epsilon"] = o.eps;
  }
  args["max_grad_norm"] = o.max_grad_norm;  // as measured, 0.0 included (the Trainer's default is 1.0)
  // The measured step's learning rate is constant (the default, "linear",
  // decays it to 0 over the run: training_args.py).
  args["lr_scheduler_type"] = "constant";
  args["bf16"] = hf_bf16(plan);
  args["fp16"] = hf_fp16(plan);
  if (recipe_text::uses_deepspeed(c))
    args["deepspeed"] = "ds_config.json";
  else if (plan.device == Device::kCpu)
    args["use_cpu"] = true;
  Json file;
  file["training_args"] = std::move(args);
  file["notes"] = hf_notes(plan);
  return json_text(file, 2) + "\n";
}

}  // namespace oomtune
