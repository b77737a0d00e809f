#pragma once
// The DeepSpeed config entries that ds_config.json and Lightning's
// DeepSpeedStrategy(config=...) (lightning_trainer.json) share, so that both
// ask DeepSpeed for the engine that was measured: the ZeRO stage with its
// offload and buckets, and the precision. Internal to recipes/.
//
// Rules:
// - Autocast plans (precision bf16 / fp16: fp32 weights) get
//   "torch_autocast": {"enabled": true, "dtype": "bfloat16" / "float16"};
//   never "bf16" / "fp16" {"enabled": true}, which cast the weights
//   (deepspeed/runtime/engine.py _cast_module_mixed_precision, 0.19.8).
// - bf16_params gets "bf16": {"enabled": true}: bf16 weights and gradients,
//   fp32 master weights in the optimizer.
// - Offload: ZeRO stage 2 with offload_optimizer {device cpu, pin_memory
//   true} and buckets sized to the model (Note [ZeRO buckets]); else stage 0.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "recipes/plan.h"

namespace oomtune::deepspeed_sections {

using Json = nlohmann::ordered_json;

/// Whether ds_config.json names an optimizer DeepSpeed builds itself: not
/// 8-bit AdamW on the GPU, nor Adafactor (DeepSpeed's optimizer types are
/// Adam, AdamW, SGD, Lamb, Lion and their 1-bit and muP forms;
/// deepspeed/runtime/config.py, DEEPSPEED_OPTIMIZERS). Where it does, the
/// frameworks that read the file (HF, Accelerate) take it from there and
/// drop the script's.
bool has_optimizer_section(const Plan& plan);

/// COUNT: elements of each ZeRO-2 gradient bucket, written as both
/// zero_optimization.reduce_bucket_size and allgather_bucket_size: at most
/// the plan's trainable parameters over all buckets together (Note [ZeRO
/// buckets]). nullopt without offload (stage 0 has no buckets) or when the
/// plan does not know its parameter count (then DeepSpeed's default stays,
/// with unsized_buckets_note).
std::optional<int64_t> bucket_elements(const Plan& plan);

/// {"stage": 0}, or under offload {"stage": 2, "offload_optimizer":
/// {"device": "cpu", "pin_memory": true}} plus the buckets where
/// bucket_elements is known.
Json zero_optimization(const Plan& plan);

/// The top-level precision entries as (key, value): torch_autocast for bf16
/// and fp16 autocast, bf16 for bf16_params, none for fp32.
std::vector<std::pair<std::string, Json>> precision(const Plan& plan);

/// The top-level entries SGD under offload needs as (key, value):
/// zero_allow_untested_optimizer true (torch.optim.SGD is not among ZeRO's
/// tested optimizers) and zero_force_ds_cpu_optimizer false (else DeepSpeed
/// refuses a non-DeepSpeed optimizer under offload; runtime/engine.py:
/// 2341-2346, 0.19.8); none for any other plan.
std::vector<std::pair<std::string, Json>> sgd_offload_entries(const Plan& plan);

/// The torch dtype name torch_autocast takes ("bfloat16", "float16"); ""
/// for fp32 and bf16_params, which are not autocast.
std::string autocast_dtype(Precision precision);

/// Note for an offload plan without a parameter count: DeepSpeed's default
/// gradient bucket stays, allocated on the device and not measured; empty
/// otherwise.
std::string unsized_buckets_note(const Plan& plan);

/// Note for an autocast plan: torch_autocast needs DeepSpeed 0.17.2 (its
/// fp16 loss scaling without ZeRO, 0.18.0); earlier versions ignore the
/// section. Empty for other precisions.
std::string autocast_version_note(const Plan& plan);

/// DeepSpeed's default reduce_bucket_size and allgather_bucket_size
/// (deepspeed/runtime/zero/config.py:113, 132, 0.19.8): COUNT: elements.
inline constexpr int64_t kDeepSpeedDefaultBucket = 500'000'000;

}  // namespace oomtune::deepspeed_sections
