// DeepSpeed ds_config.json writer.
// Loaded and run by DeepSpeed 0.19.8 itself: tests/frameworks/deepspeed_test.py.
//
// Rules:
// - Batch: train_micro_batch_size_per_gpu, gradient_accumulation_steps and
//   train_batch_size (= their product on one GPU) are all written, so
//   DeepSpeed's own consistency check pins the global batch.
// - gradient_clipping: the job's max_grad_norm, as measured (0.0: none).
//   DeepSpeed's default was 0 up to 0.19.2 and is 1.0 from 0.19.3 on, so
//   the key is always written. DeepSpeed clips the global L2 norm of the
//   gradients the optimizer reads (the fp32 ones under bf16 and offload).
// - Offload is ZeRO-Offload: zero_optimization stage 2 with offload_optimizer
//   {device: cpu, pin_memory: true} and reduce/allgather buckets sized to
//   the model (Note [ZeRO buckets] in deepspeed_sections.cpp); without
//   offload, stage 0.
// - Precision (deepspeed_sections.h): bf16 and fp16 autocast keep fp32
//   weights, so they are torch_autocast {enabled, dtype} (fp16 loss-scaled
//   by DeepSpeed's torch.amp.GradScaler), never bf16/fp16.enabled, which
//   cast the weights. bf16_params (bf16 weights, fp32 master weights in the
//   optimizer) is what bf16.enabled does in DeepSpeed.
// - Optimizer: an "optimizer" section (AdamW / SGD) with the job's
//   hyper-parameters and implementation (job/optimizer_implementation.h):
//   AdamW on the device is torch.optim.AdamW ("torch_adam": true, with
//   "foreach": false for single_tensor) unless the plan measured fused,
//   which DeepSpeed's own FusedAdam matches; SGD gets "fused": true or
//   "foreach": false; 8-bit AdamW has no config type, so the section is left
//   out and the note says to pass bitsandbytes' optimizer to
//   deepspeed.initialize(optimizer=...).
// - SGD under offload: DeepSpeed builds torch.optim.SGD from the section,
//   which is not in ZeRO's tested list, so zero_allow_untested_optimizer is
//   true (else deepspeed.initialize asserts); zero_force_ds_cpu_optimizer is
//   false so that a torch.optim.SGD passed by the caller is accepted too.
// - Activation checkpointing: the activation_checkpointing section only
//   configures deepspeed.checkpointing.checkpoint calls that the model code
//   must make (read by deepspeed.checkpointing.configure, never by the
//   engine); the note says so.
// Source: https://www.deepspeed.ai/docs/config-json/, checked against
// deepspeedai/DeepSpeed v0.19.6 (edaa7221) and microsoft/DeepSpeed v0.16.4
// (38327e07), and the DeepSpeed 0.19.8 wheel: deepspeed/runtime/constants.py
// (train_batch_size, train_micro_batch_size_per_gpu,
// gradient_accumulation_steps, gradient_clipping and its default, bf16,
// torch_autocast (from 0.17.2), zero_allow_untested_optimizer,
// zero_force_ds_cpu_optimizer), deepspeed/runtime/config.py (_batch_assertion:
// train_batch_size == micro * accumulation * world_size; optimizer type
// lower-cased when it is a DeepSpeed one), deepspeed/runtime/engine.py
// (_configure_basic_optimizer: "AdamW" -> FusedAdam / DeepSpeedCPUAdam, other
// names -> getattr(torch.optim, type); _do_optimizer_sanity_check),
// deepspeed/runtime/zero/config.py and offload_config.py (stage 0-3,
// offload_optimizer.device none/cpu/nvme, pin_memory, reduce_bucket_size,
// allgather_bucket_size),
// deepspeed/runtime/zero/utils.py (ZERO_SUPPORTED_OPTIMIZERS) and
// deepspeed/runtime/activation_checkpointing/config.py.

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "common/json_text.h"
#include "recipes/deepspeed_sections.h"
#include "recipes/recipe_text.h"
#include "recipes/recipes.h"

namespace oomtune {
namespace {

using Json = nlohmann::ordered_json;

/// Whether the section's AdamW is torch.optim.AdamW ("torch_adam": true)
/// rather than DeepSpeed's FusedAdam: on the device (no offload) with the
/// foreach or single_tensor implementation, as measured. FusedAdam, like
/// torch's fused AdamW, updates in place with no whole-list temporaries, so
/// it stands for implementation = "fused".
bool torch_adam(const Plan& plan) {
  return plan.config.optimizer == OptimizerKind::kAdamW && !plan.config.offload_optimizer &&
         plan.optimizer.implementation != OptimizerImplementation::kFused;
}

Json optimizer_section(const Plan& plan) {
  const OptimizerHyperParameters& o = plan.optimizer;
  // fused=True / foreach=False (recipe_text.h); DeepSpeed passes the params
  // to torch.optim.SGD and, after popping torch_adam, to torch.optim.AdamW.
  const auto [implementation_key, implementation_value] = recipe_text::implementation_keyword(plan);
  if (plan.config.optimizer == OptimizerKind::kSgd) {
    Json params{{"lr", o.lr}, {"momentum", o.momentum}, {"weight_decay", o.weight_decay}};
    if (!implementation_key.empty()) params[implementation_key] = implementation_value == "True";
    return Json{{"type", "SGD"}, {"params", std::move(params)}};
  }
  Json params{{"lr", o.lr}, {"betas", {o.beta1, o.beta2}}, {"eps", o.eps}, {"weight_decay", o.weight_decay}};
  if (torch_adam(plan)) {
    params["torch_adam"] = true;
    if (plan.optimizer.implementation == OptimizerImplementation::kSingleTensor) params["foreach"] = false;
  }
  return Json{{"type", "AdamW"}, {"params", std::move(params)}};
}

}  // namespace

std::vector<std::string> deepspeed_notes(const Plan& plan) {
  const TrainingConfig& c = plan.config;
  std::vector<std::string> notes;
  if (c.checkpoint.enabled())
    notes.push_back(fmt::format(
        "activation checkpointing ({}) is not switched on by this file: the model's forward must call "
        "deepspeed.checkpointing.checkpoint(block, *inputs) for {}; the activation_checkpointing section (DeepSpeed's "
        "defaults) only configures those calls, and only once the script calls "
        "deepspeed.checkpointing.configure(None, deepspeed_config=\"ds_config.json\")",
        to_string(c.checkpoint), recipe_text::describe_checkpoint(c.checkpoint)));
  if (c.optimizer == OptimizerKind::kAdamW8bit && !c.offload_optimizer)
    notes.push_back(fmt::format(
        "8-bit AdamW has no DeepSpeed optimizer type, so this file has no \"optimizer\" section: create "
        "optimizer = {} and pass deepspeed.initialize(model=model, optimizer=optimizer, config=\"ds_config.json\")",
        recipe_text::optimizer_call(plan, "model.parameters()")));
  if (c.optimizer == OptimizerKind::kAdafactor) {
    notes.push_back(fmt::format(
        "Adafactor has no DeepSpeed optimizer type, so this file has no \"optimizer\" section: create "
        "optimizer = {} and pass deepspeed.initialize(model=model, optimizer=optimizer, config=\"ds_config.json\")",
        recipe_text::optimizer_call(plan, "model.parameters()")));
    notes.push_back(recipe_text::adafactor_note());
  }
  if (c.optimizer == OptimizerKind::kAdamW8bit && c.offload_optimizer)
    notes.push_back(recipe_text::adamw8bit_offload_note());
  if (c.optimizer == OptimizerKind::kSgd && c.offload_optimizer)
    notes.push_back(
        "SGD with optimizer offload: DeepSpeed builds torch.optim.SGD from the \"optimizer\" section and steps it on "
        "the host copies; zero_allow_untested_optimizer = true lets ZeRO take it (torch.optim.SGD is not among "
        "ZeRO's tested optimizers), and zero_force_ds_cpu_optimizer = false lets a torch.optim.SGD passed to "
        "deepspeed.initialize(optimizer=...) run under offload instead of DeepSpeed's CPU optimizers");
  if (const std::string note = recipe_text::offload_host_note(plan); !note.empty()) notes.push_back(note);
  if (torch_adam(plan))
    notes.push_back(fmt::format(
        "\"torch_adam\": true makes DeepSpeed build torch.optim.AdamW ({}), the implementation measured; without it "
        "DeepSpeed builds its FusedAdam, which updates in place with no whole-list temporaries: measure that with "
        "optimizer.implementation = \"fused\" in the job",
        plan.optimizer.implementation == OptimizerImplementation::kForeach ? "foreach on CUDA, torch's default"
                                                                           : "foreach=False: one tensor at a time"));
  else if (c.optimizer == OptimizerKind::kAdamW && !c.offload_optimizer)
    notes.push_back(
        "the plan measured torch.optim.AdamW(fused=True): DeepSpeed builds its own FusedAdam from this section, "
        "which likewise updates in place with no whole-list temporaries");
  if (c.precision == Precision::kBf16Params)
    notes.push_back(recipe_text::bf16_params_note("\"bf16\": {\"enabled\": true}, as written here"));
  if (const std::string note = deepspeed_sections::autocast_version_note(plan); !note.empty())
    notes.push_back(fmt::format(
        "{}. Not \"{}\": {{\"enabled\": true}}, which casts the weights to {} ({})", note,
        c.precision == Precision::kBf16 ? "bf16" : "fp16", deepspeed_sections::autocast_dtype(c.precision),
        c.precision == Precision::kBf16 ? "what precision bf16_params measures" : "which oomtune does not measure"));
  if (const std::string note = deepspeed_sections::unsized_buckets_note(plan); !note.empty()) notes.push_back(note);
  if (recipe_text::uses_deepspeed(c) && plan.device == Device::kCpu)
    notes.push_back(recipe_text::deepspeed_needs_gpu_note(c));
  if (const std::string note = recipe_text::trainable_note(plan); !note.empty()) notes.push_back(note);
  return notes;
}

std::string write_deepspeed_config(const Plan& plan) {
  validate_plan(plan);
  const TrainingConfig& c = plan.config;
  Json config;
  config["train_batch_size"] = plan.global_batch;
  config["train_micro_batch_size_per_gpu"] = c.micro_batch;
  config["gradient_accumulation_steps"] = c.accumulation_steps;
  // As measured, 0.0 included (DeepSpeed >= 0.19.3 defaults to 1.0).
  config["gradient_clipping"] = plan.optimizer.max_grad_norm;
  if (deepspeed_sections::has_optimizer_section(plan)) config["optimizer"] = optimizer_section(plan);
  for (auto& [key, section] : deepspeed_sections::precision(plan)) config[key] = std::move(section);
  config["zero_optimization"] = deepspeed_sections::zero_optimization(plan);
  for (auto& [key, entry] : deepspeed_sections::sgd_offload_entries(plan)) config[key] = std::move(entry);
  if (c.checkpoint.enabled())
    config["activation_checkpointing"] = {{"partition_activations", false},
                                          {"cpu_checkpointing", false},
                                          {"contiguous_memory_optimization", false},
                                          {"synchronize_checkpoint_boundary", false}};
  config["oomtune_notes"] = deepspeed_notes(plan);
  return json_text(config, 2) + "\n";
}

}  // namespace oomtune
