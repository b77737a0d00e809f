// Hugging Face Accelerate config writer (accelerate_config.yaml).
// Loaded and run by Accelerate 1.15.0 itself: tests/frameworks/accelerate_test.py.
//
// Rules:
// - The YAML is what `accelerate config` writes for one machine, one
//   process: compute_environment, distributed_type, mixed_precision,
//   use_cpu, num_machines, num_processes, ...
// - DeepSpeed (offload, bf16_params): distributed_type DEEPSPEED with
//   deepspeed_config {deepspeed_config_file: 'ds_config.json',
//   zero3_init_flag: false} and no mixed_precision line: ds_config.json
//   decides. The inline deepspeed_config keys cannot say what was measured:
//   Accelerate leaves gradient_clipping 0.0 out of the DeepSpeed config it
//   builds (`if self.gradient_clipping:`, utils/dataclasses.py:1321-1322,
//   1.15.0) and DeepSpeed 0.19.3 and later then clip at 1.0; there is no key
//   for the ZeRO buckets (Note [ZeRO buckets] in deepspeed_sections.cpp),
//   torch_autocast or zero_force_ds_cpu_optimizer; mixed_precision 'bf16'
//   becomes DeepSpeed's bf16 section (set_mixed_precision, :1415-1427),
//   which casts the weights, where the plan measured autocast; and under
//   offload Accelerate swaps a torch optimizer for DeepSpeedCPUAdam keeping
//   only lr and weight_decay (accelerator.py:2376-2383). Next to
//   a config file Accelerate refuses mixed_precision and the other
//   deepspeed_config keys, and a real optimizer where the file has an
//   optimizer section (accelerate.utils.DummyOptim in the script).
// - Without DeepSpeed the config file has no gradient-accumulation key
//   (Accelerate rejects unknown keys), so accumulation is a comment naming
//   Accelerator(gradient_accumulation_steps=N) and
//   ACCELERATE_GRADIENT_ACCUMULATION_STEPS; likewise the micro-batch, the
//   optimizer, checkpointing and gradient clipping
//   (accelerator.clip_grad_norm_), which live in the training script.
// - YAML by hand (no YAML library here): block mappings only, every string
//   single-quoted ('no' and 'NO' would otherwise read as booleans), notes as
//   '#' comments.
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
// 'no'/'fp16'/'bf16', DeepSpeedPlugin, _deepspeed_config_checks,
// deepspeed_config_file),
// accelerator.py (_prepare_deepspeed: gradient_clipping "auto" -> 1.0,
// optimizer-in-file needs DummyOptim, the DeepSpeedCPUAdam swap) and
// utils/deepspeed.py (map_pytorch_optim_to_deepspeed keeps lr and
// weight_decay).

#include <sstream>

#include <fmt/format.h>

#include "recipes/deepspeed_sections.h"
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
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16Params:  // only under DEEPSPEED, whose config file decides (see Rules)
      return "?";
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
  const bool deepspeed = recipe_text::uses_deepspeed(c);
  std::vector<std::string> notes;
  notes.push_back(recipe_text::batch_note(plan, "the config has no batch size; your DataLoader"));
  if (deepspeed)
    notes.push_back(
        "deepspeed_config_file: 'ds_config.json' (written beside this file; the path is relative to the launched "
        "script's working folder) is the DeepSpeed config, with the accumulation steps, the gradient clipping, the "
        "ZeRO stage and offload and the precision as measured: Accelerate's inline deepspeed_config keys cannot "
        "say them (it drops gradient_clipping 0.0, so DeepSpeed 0.19.3 and later clip at 1.0; it has no key for "
        "the ZeRO buckets or torch_autocast, and mixed_precision 'bf16' or 'fp16' would cast the weights), and next "
        "to the file it refuses them and mixed_precision");
  else
    notes.push_back(fmt::format(
        "gradient accumulation has no key outside deepspeed_config: create Accelerator(gradient_accumulation_steps="
        "{0}) and run each micro-batch inside `with accelerator.accumulate(model):`, or export "
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS={0}",
        c.accumulation_steps));
  if (!deepspeed && plan.optimizer.max_grad_norm > 0)
    notes.push_back(fmt::format(
        "gradient clipping has no key outside deepspeed_config: call accelerator.clip_grad_norm_(model.parameters(), "
        "{}) after the backward of each step's last micro-batch (when accelerator.sync_gradients) and before "
        "optimizer.step()",
        recipe_text::number(plan.optimizer.max_grad_norm)));
  if (deepspeed && deepspeed_sections::has_optimizer_section(plan))
    notes.push_back(
        "the optimizer comes from ds_config.json's optimizer section, with the plan's hyper-parameters: build "
        "optimizer = accelerate.utils.DummyOptim(model.parameters()) in the script and pass it to "
        "accelerator.prepare (Accelerate refuses a real optimizer next to the section)");
  else
    notes.push_back(fmt::format("the config has no optimizer: the script builds {}",
                                recipe_text::optimizer_call(plan, "model.parameters()")));
  if (c.checkpoint.enabled())
    notes.push_back(
        fmt::format("the config has no activation-checkpointing key: call model.gradient_checkpointing_enable() on a "
                    "transformers model, or wrap {} ({}) in torch.utils.checkpoint.checkpoint",
                    recipe_text::describe_checkpoint(c.checkpoint), to_string(c.checkpoint)));
  if (c.optimizer == OptimizerKind::kAdamW8bit && !c.offload_optimizer)
    notes.push_back("bitsandbytes.optim.AdamW8bit needs the bitsandbytes package");
  if (c.optimizer == OptimizerKind::kAdafactor) notes.push_back(recipe_text::adafactor_note());
  if (c.optimizer == OptimizerKind::kAdamW8bit && c.offload_optimizer)
    notes.push_back(recipe_text::adamw8bit_offload_note());
  if (const std::string note = recipe_text::offload_host_note(plan); !note.empty()) notes.push_back(note);
  if (c.precision == Precision::kBf16Params)
    notes.push_back(recipe_text::bf16_params_note(
        "ds_config.json's \"bf16\" section gives it under distributed_type 'DEEPSPEED'; mixed_precision 'bf16' "
        "without DeepSpeed is autocast"));
  if (deepspeed && plan.device == Device::kCpu) notes.push_back(recipe_text::deepspeed_needs_gpu_note(c));
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
    out += fmt::format("  deepspeed_config_file: {}\n", yaml_quote("ds_config.json"));
    out += "  zero3_init_flag: false\n";
  }
  out += fmt::format("distributed_type: {}\n", yaml_quote(deepspeed ? "DEEPSPEED" : "NO"));
  out += fmt::format("downcast_bf16: {}\n", yaml_quote("no"));
  out += "machine_rank: 0\n";
  out += fmt::format("main_training_function: {}\n", yaml_quote("main"));
  // Under DEEPSPEED ds_config.json decides (Accelerate refuses the key next to it).
  if (!deepspeed) out += fmt::format("mixed_precision: {}\n", yaml_quote(accelerate_precision(c.precision)));
  out += "num_machines: 1\n";
  out += "num_processes: 1\n";
  out += fmt::format("rdzv_backend: {}\n", yaml_quote("static"));
  out += "same_network: true\n";
  // DeepSpeed needs a GPU whatever the plan was measured on (see the note).
  out += fmt::format("use_cpu: {}\n", plan.device == Device::kCpu && !deepspeed ? "true" : "false");
  return out;
}

}  // namespace oomtune
