// Hugging Face Accelerate config writer (accelerate_config.yaml).
//
// Rules:
// - The YAML is what `accelerate config` writes for one machine, one
//   process: compute_environment, distributed_type, mixed_precision,
//   use_cpu, num_machines, num_processes, ...
// - Offload: distributed_type DEEPSPEED with deepspeed_config
//   {gradient_accumulation_steps, offload_optimizer_device: cpu,
//   offload_param_device: none, zero3_init_flag: false, zero_stage: 2}.
// - bf16_params: the same DeepSpeed block without offload (zero_stage 0,
//   offload_optimizer_device none) and mixed_precision bf16, which under
//   DeepSpeed is DeepSpeed's bf16 mode (bf16 weights, fp32 master weights).
// - Without DeepSpeed the config file has no gradient-accumulation key
//   (Accelerate rejects unknown keys), so accumulation is a comment naming
//   Accelerator(gradient_accumulation_steps=N) and
//   ACCELERATE_GRADIENT_ACCUMULATION_STEPS; likewise the micro-batch, the
//   optimizer and checkpointing, which live in the training script.
// - YAML by hand (no YAML library here): block mappings only, every string
//   single-quoted ('no' and 'NO' would otherwise read as booleans), notes as
//   '#' comments.
// Source: https://huggingface.co/docs/accelerate/package_reference/cli and
// https://huggingface.co/docs/accelerate/usage_guides/deepspeed

#include <sstream>

#include <fmt/format.h>

#include "recipes/recipe_text.h"
#include "recipes/recipes.h"

namespace oomtune {
namespace {

/// A YAML single-quoted scalar: the only escape is '' for '.
std::string yaml_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string accelerate_precision(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "no";
    case Precision::kBf16:
    case Precision::kBf16Params: return "bf16";  // bf16_params: under DEEPSPEED (see Rules)
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

/// "# " before every line of `text` (a note may hold line breaks).
std::string comment(const std::string& prefix, const std::string& text) {
  std::string out;
  std::istringstream lines(text);
  std::string line;
  bool first = true;
  while (std::getline(lines, line)) {
    out += fmt::format("# {}{}\n", first ? prefix : std::string(prefix.size(), ' '), line);
    first = false;
  }
  return out.empty() ? fmt::format("# {}\n", prefix) : out;
}

}  // namespace

std::vector<std::string> accelerate_notes(const Plan& plan) {
  const TrainingConfig& c = plan.config;
  std::vector<std::string> notes;
  notes.push_back(recipe_text::batch_note(plan, "the config has no batch size; your DataLoader"));
  if (!recipe_text::uses_deepspeed(c))
    notes.push_back(fmt::format(
        "gradient accumulation has no key outside deepspeed_config: create Accelerator(gradient_accumulation_steps="
        "{0}) and run each micro-batch inside `with accelerator.accumulate(model):`, or export "
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS={0}",
        c.accumulation_steps));
  const bool cpu_adam = c.offload_optimizer && c.optimizer == OptimizerKind::kAdamW8bit;
  notes.push_back(fmt::format(
      "the config has no optimizer: the script builds {}{}",
      recipe_text::optimizer_call(plan, "model.parameters()", cpu_adam ? "torch.optim.AdamW" : ""),
      c.offload_optimizer && c.optimizer != OptimizerKind::kSgd
          ? " (under offload Accelerate swaps it for DeepSpeedCPUAdam)"
          : ""));
  if (c.checkpoint.enabled())
    notes.push_back(fmt::format(
        "the config has no activation-checkpointing key: call model.gradient_checkpointing_enable() on a "
        "transformers model, or wrap {} ({}) in torch.utils.checkpoint.checkpoint",
        recipe_text::describe_checkpoint(c.checkpoint), to_string(c.checkpoint)));
  if (c.optimizer == OptimizerKind::kAdamW8bit && !c.offload_optimizer)
    notes.push_back("bitsandbytes.optim.AdamW8bit needs the bitsandbytes package");
  if (cpu_adam) notes.push_back(recipe_text::adamw8bit_offload_note());
  const OptimizerHyperParameters defaults;
  if (c.offload_optimizer && c.optimizer != OptimizerKind::kSgd &&
      (plan.optimizer.beta1 != defaults.beta1 || plan.optimizer.beta2 != defaults.beta2 ||
       plan.optimizer.eps != defaults.eps))
    notes.push_back(fmt::format(
        "Accelerate's swap to DeepSpeedCPUAdam keeps only lr and weight_decay: betas ({}, {}) and eps {} fall "
        "back to DeepSpeedCPUAdam's defaults unless you use deepspeed_config_file: 'ds_config.json' (written "
        "beside this file), whose optimizer section has them",
        recipe_text::number(plan.optimizer.beta1), recipe_text::number(plan.optimizer.beta2),
        recipe_text::number(plan.optimizer.eps)));
  if (c.optimizer == OptimizerKind::kSgd && c.offload_optimizer)
    notes.push_back(
        "SGD with optimizer offload: under offload Accelerate replaces a torch optimizer by DeepSpeedCPUAdam "
        "unless zero_force_ds_cpu_optimizer is false, which the inline deepspeed_config cannot say: replace it by "
        "deepspeed_config_file: 'ds_config.json' (written beside this file)");
  if (c.precision == Precision::kBf16Params)
    notes.push_back(recipe_text::bf16_params_note(
        "mixed_precision 'bf16' with distributed_type 'DEEPSPEED' gives it; without DeepSpeed it is autocast"));
  if (recipe_text::uses_deepspeed(c) && plan.device == "cpu")
    notes.push_back(recipe_text::deepspeed_needs_gpu_note(c));
  return notes;
}

std::string write_accelerate_config(const Plan& plan) {
  validate_plan(plan);
  const TrainingConfig& c = plan.config;
  std::string out;
  out += "# Accelerate config written by oomtune from its plan (docs/recipes.md).\n";
  out += "# Use: accelerate launch --config_file accelerate_config.yaml train.py\n";
  out += fmt::format("# Plan: {}\n", to_string(c));
  for (const auto& note : accelerate_notes(plan)) out += comment("note: ", note);
  out += fmt::format("compute_environment: {}\n", yaml_quote("LOCAL_MACHINE"));
  out += "debug: false\n";
  const bool deepspeed = recipe_text::uses_deepspeed(c);
  if (deepspeed) {
    out += "deepspeed_config:\n";
    out += fmt::format("  gradient_accumulation_steps: {}\n", c.accumulation_steps);
    out += fmt::format("  offload_optimizer_device: {}\n", yaml_quote(c.offload_optimizer ? "cpu" : "none"));
    out += fmt::format("  offload_param_device: {}\n", yaml_quote("none"));
    out += "  zero3_init_flag: false\n";
    out += fmt::format("  zero_stage: {}\n", recipe_text::zero_stage(c));
  }
  out += fmt::format("distributed_type: {}\n", yaml_quote(deepspeed ? "DEEPSPEED" : "NO"));
  out += fmt::format("downcast_bf16: {}\n", yaml_quote("no"));
  out += "machine_rank: 0\n";
  out += fmt::format("main_training_function: {}\n", yaml_quote("main"));
  out += fmt::format("mixed_precision: {}\n", yaml_quote(accelerate_precision(c.precision)));
  out += "num_machines: 1\n";
  out += "num_processes: 1\n";
  out += fmt::format("rdzv_backend: {}\n", yaml_quote("static"));
  out += "same_network: true\n";
  // DeepSpeed needs a GPU whatever the plan was measured on (see the note).
  out += fmt::format("use_cpu: {}\n", plan.device == "cpu" && !deepspeed ? "true" : "false");
  return out;
}

}  // namespace oomtune
