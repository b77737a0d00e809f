// Hugging Face Accelerate config writer (accelerate_config.yaml).
// Loaded and run by Accelerate 1.15.0 itself: tests/frameworks/accelerate_test.py.
//
// Rules:
// - The YAML is what `accelerate config` writes for one machine, one
//   process: compute_environment, distributed_type, mixed_precision,
//   use_cpu, num_machines, num_processes, ...
// - Offload: distributed_type DEEPSPEED with deepspeed_config
//   {gradient_accumulation_steps, gradient_clipping: 0.0,
//   offload_optimizer_device: cpu, offload_param_device: none,
//   zero3_init_flag: false, zero_stage: 2}. gradient_clipping 0.0 keeps
//   clipping off, as measured: without the key Accelerate writes "auto" into
//   the DeepSpeed config and fills it with 1.0. Accelerate leaves a 0.0 out
//   of that config, though, and DeepSpeed 0.19.3 and later default to 1.0;
//   a note says so.
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
// - The notes' way out (the optimizer from ds_config.json) is
//   deepspeed_config_file in place of every other deepspeed_config key, no
//   mixed_precision line, and accelerate.utils.DummyOptim in the script:
//   Accelerate refuses each of those next to a config file.
// Source: https://huggingface.co/docs/accelerate/package_reference/cli and
// https://huggingface.co/docs/accelerate/usage_guides/deepspeed, checked
// against huggingface/accelerate (commit 16cb6eb8, 1.15.0.dev0):
// src/accelerate/commands/config/config_args.py (ClusterConfig fields;
// unknown keys raise ValueError), commands/config/cluster.py (what
// `accelerate config` writes: deepspeed_config zero_stage 0-3,
// offload_*_device none/cpu/nvme, gradient_accumulation_steps,
// gradient_clipping, zero3_init_flag; downcast_bf16 'no'),
// commands/launch.py and utils/launch.py (deepspeed_config keys become
// ACCELERATE_* variables; mixed_precision joins ACCELERATE_CONFIG_DS_FIELDS),
// utils/dataclasses.py (DistributedType 'NO'/'DEEPSPEED', PrecisionType
// 'no'/'fp16'/'bf16', DeepSpeedPlugin, _deepspeed_config_checks),
// accelerator.py (_prepare_deepspeed: gradient_clipping "auto" -> 1.0,
// optimizer-in-file needs DummyOptim, the DeepSpeedCPUAdam swap) and
// utils/deepspeed.py (map_pytorch_optim_to_deepspeed keeps lr and
// weight_decay).

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
    case Precision::kFp32:
      return "no";
    case Precision::kBf16:
    case Precision::kBf16Params:
      return "bf16";  // bf16_params: under DEEPSPEED (see Rules)
    case Precision::kFp16:
      return "fp16";
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

/// How to take the optimizer from ds_config.json instead of the inline
/// deepspeed_config: what Accelerate accepts next to a config file.
constexpr const char* kUseDeepSpeedFile =
    "put deepspeed_config_file: 'ds_config.json' (written beside this file) in place of the other deepspeed_config "
    "keys, delete the mixed_precision line (the file's bf16/fp16 section decides; Accelerate refuses those keys next "
    "to a config file) and build optimizer = accelerate.utils.DummyOptim(model.parameters()) in the script (the "
    "file's optimizer section builds the optimizer; Accelerate refuses a real one next to it)";

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
  notes.push_back(
      fmt::format("the config has no optimizer: the script builds {}{}",
                  recipe_text::optimizer_call(plan, "model.parameters()", cpu_adam ? "torch.optim.AdamW" : ""),
                  c.offload_optimizer && c.optimizer != OptimizerKind::kSgd
                      ? " (under offload Accelerate swaps it for DeepSpeedCPUAdam)"
                      : ""));
  if (c.checkpoint.enabled())
    notes.push_back(
        fmt::format("the config has no activation-checkpointing key: call model.gradient_checkpointing_enable() on a "
                    "transformers model, or wrap {} ({}) in torch.utils.checkpoint.checkpoint",
                    recipe_text::describe_checkpoint(c.checkpoint), to_string(c.checkpoint)));
  if (c.optimizer == OptimizerKind::kAdamW8bit && !c.offload_optimizer)
    notes.push_back("bitsandbytes.optim.AdamW8bit needs the bitsandbytes package");
  if (c.optimizer == OptimizerKind::kAdafactor) notes.push_back(recipe_text::adafactor_note());
  if (cpu_adam) notes.push_back(recipe_text::adamw8bit_offload_note());
  const OptimizerHyperParameters defaults;
  if (c.offload_optimizer && c.optimizer != OptimizerKind::kSgd &&
      (plan.optimizer.beta1 != defaults.beta1 || plan.optimizer.beta2 != defaults.beta2 ||
       plan.optimizer.eps != defaults.eps))
    notes.push_back(fmt::format(
        "Accelerate's swap to DeepSpeedCPUAdam keeps only lr and weight_decay: betas ({}, {}) and eps {} fall "
        "back to DeepSpeedCPUAdam's defaults; to keep them, take the optimizer from ds_config.json, whose optimizer "
        "section has them: {}",
        recipe_text::number(plan.optimizer.beta1), recipe_text::number(plan.optimizer.beta2),
        recipe_text::number(plan.optimizer.eps), kUseDeepSpeedFile));
  if (c.optimizer == OptimizerKind::kSgd && c.offload_optimizer)
    notes.push_back(fmt::format(
        "SGD with optimizer offload: under offload Accelerate replaces a torch optimizer by DeepSpeedCPUAdam (Adam, "
        "not SGD) unless zero_force_ds_cpu_optimizer is false, which the inline deepspeed_config cannot say: {}",
        kUseDeepSpeedFile));
  if (recipe_text::uses_deepspeed(c))
    notes.push_back(
        "gradient_clipping: 0.0 keeps gradients unclipped, as measured, with DeepSpeed up to 0.19.2; Accelerate "
        "leaves a 0.0 out of the DeepSpeed config it builds, and DeepSpeed 0.19.3 and later then clip at their "
        "default of 1.0: there, give Accelerate a DeepSpeed config file (deepspeed_config_file) that sets "
        "\"gradient_clipping\": 0.0, as oomtune's deepspeed format does");
  if (c.precision == Precision::kBf16Params)
    notes.push_back(recipe_text::bf16_params_note(
        "mixed_precision 'bf16' with distributed_type 'DEEPSPEED' gives it; without DeepSpeed it is autocast"));
  if (recipe_text::uses_deepspeed(c) && plan.device == Device::kCpu)
    notes.push_back(recipe_text::deepspeed_needs_gpu_note(c));
  if (const std::string note = recipe_text::trainable_note(plan); !note.empty()) notes.push_back(note);
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
    out += "  gradient_clipping: 0.0\n";  // off, as measured (absent, Accelerate clips at 1.0)
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
  out += fmt::format("use_cpu: {}\n", plan.device == Device::kCpu && !deepspeed ? "true" : "false");
  return out;
}

}  // namespace oomtune
