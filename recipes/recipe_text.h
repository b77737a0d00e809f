#pragma once
// Phrases and small facts the writers share, so that the same situation is
// explained the same way in every framework's file. Internal to recipes/.

#include <string>
#include <utility>

#include "recipes/plan.h"

namespace oomtune::recipe_text {

/// "every detected block", "blocks 0, 2, 4, ... of the detected blocks",
/// "the first 3 detected blocks", "the submodules blocks.0, blocks.2".
std::string describe_checkpoint(const CheckpointPlan& plan);

/// A Python call that builds the plan's optimizer over `params` (a Python
/// expression such as "model.parameters()"), e.g. "torch.optim.AdamW(
/// model.parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01)".
/// `python_class` replaces the class when given (DeepSpeedCPUAdam under offload).
std::string optimizer_call(const Plan& plan, const std::string& params, const std::string& python_class = "");

/// The torch.optim constructor argument that selects the plan's
/// implementation (job/optimizer_implementation.h) as a Python keyword and
/// value: {"fused", "True"} or {"foreach", "False"}; {"", ""} for foreach,
/// PyTorch's default on CUDA, and wherever the optimizer is not an eager
/// torch.optim AdamW or SGD (8-bit AdamW, Adafactor, offload's CPU
/// optimizer).
std::pair<std::string, std::string> implementation_keyword(const Plan& plan);

/// Note for a framework that builds the optimizer itself from a key with
/// no implementation choice (`what`, e.g. "TrainingArguments(optim=
/// \"adamw_torch\")"): the plan measured `implementation`; build
/// optimizer_call and hand it over as `how`. "" when implementation_keyword
/// is empty.
std::string implementation_note(const Plan& plan, const std::string& what, const std::string& how);

/// The Python class the plan's optimizer is, without offload:
/// "torch.optim.AdamW", "bitsandbytes.optim.AdamW8bit", "torch.optim.SGD".
std::string optimizer_class(OptimizerKind kind);

/// Python repr of a float as the notes print it ("0.001", "1e-08").
std::string number(double value);

/// The ZeRO stage the plan asks DeepSpeed for: 2 with optimizer offload
/// (ZeRO-Offload: optimizer state and update on the host), else 0 (no
/// partitioning; one GPU).
int zero_stage(const TrainingConfig& config);

/// Whether the plan runs through DeepSpeed in every framework: optimizer
/// offload (ZeRO-Offload), or bf16 parameters with fp32 master weights
/// (DeepSpeed's bf16 mode; without DeepSpeed the frameworks' bf16 switch is
/// autocast).
bool uses_deepspeed(const TrainingConfig& config);

/// Note: the plan uses DeepSpeed (see uses_deepspeed) but was measured on
/// the CPU; names offload, or else bf16 parameters, as the reason.
std::string deepspeed_needs_gpu_note(const TrainingConfig& config);

/// Note: precision bf16_params is DeepSpeed's bf16 mode (`how` says how this
/// framework gets there), not the framework's bf16 autocast switch.
std::string bf16_params_note(const std::string& how);

/// Note: the plan trains with Adafactor: which class, with which options,
/// and that its updates are not AdamW's (strategies/adafactor.h).
std::string adafactor_note();

/// Note: 8-bit AdamW together with optimizer offload.
std::string adamw8bit_offload_note();

/// Note: the host memory optimizer offload needs, for a plan that offloads
/// ("" otherwise): the fp32 parameters, gradients and optimizer state
/// DeepSpeed's CPU optimizer keeps there, pinned
/// (offload_host_bytes_per_parameter, strategies/training_config.h: Adam
/// 16 bytes per trainable parameter, SGD 12 with momentum, 8 without), for
/// the plan's [job] parameters, and the verified run's host peak where the
/// plan has it (search/host_budget.cpp, Note [Host budget]).
std::string offload_host_note(const Plan& plan);

/// Note naming the trainable set when the plan freezes parameters: 'only
/// the parameters matching trainable = ["*.lora_A.*"] were trained (...)',
/// and that the user's script freezes the rest (PEFT's LoraConfig, or
/// requires_grad_(False)); "" when every parameter trains.
std::string trainable_note(const Plan& plan);

/// Note: "<where> takes batch_size=4 (the micro-batch): micro-batch 4 x 8
/// accumulation steps = global batch 32, as measured".
std::string batch_note(const Plan& plan, const std::string& where);

}  // namespace oomtune::recipe_text
