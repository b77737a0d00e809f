#pragma once
// TrainingConfig: the record that says how one training step is run. The
// strategies (strategies/*.cpp) each read one part of it; the search
// (search/) produces them; the recipes (recipes/) write them out for
// DeepSpeed, HF, Lightning and Accelerate. No libtorch here.

#include <cstdint>
#include <string>
#include <vector>

namespace oomtune {

/// Which submodule calls run through activation checkpointing (recompute).
struct CheckpointPlan {
  enum class Mode {
    kNone,    ///< no checkpointing
    kAll,     ///< every detected block
    kEveryK,  ///< blocks 0, k, 2k, ... of the detected blocks
    kFirstN,  ///< the first n detected blocks (selective checkpointing)
    kPaths,   ///< the named submodule paths, e.g. "blocks.0"
  };
  Mode mode = Mode::kNone;
  int64_t every_k = 1;             // COUNT: with kEveryK, the stride (>= 1)
  int64_t first_n = 0;             // COUNT: with kFirstN, how many blocks (>= 1)
  std::vector<std::string> paths;  // with kPaths: dotted submodule paths

  bool enabled() const { return mode != Mode::kNone; }
  bool operator==(const CheckpointPlan& other) const;
  bool operator!=(const CheckpointPlan& other) const { return !(*this == other); }
};

/// The optimizer that updates the parameters: the job's (AdamW, SGD), or
/// one the search swaps in for AdamW to hold less state (8-bit AdamW,
/// strategies/adamw8bit.h; Adafactor, strategies/adafactor.h).
enum class OptimizerKind { kAdamW, kAdamW8bit, kSgd, kAdafactor };

/// Numeric precision of forward and backward (strategies/mixed_precision.h
/// has the rules of each). The optimizer always updates fp32 weights.
enum class Precision {
  kFp32,        ///< everything fp32
  kBf16,        ///< autocast to bfloat16; parameters stay fp32
  kFp16,        ///< autocast to float16 with dynamic loss scaling (CUDA only)
  kBf16Params,  ///< bf16 parameters and gradients, fp32 master weights in the optimizer
};

/// One training configuration: how the global batch is split and which
/// memory-saving strategies are on.
///
/// Invariant (checked by validate()): micro_batch * accumulation_steps equals
/// the job's global batch. oomtune never changes the global batch silently: a
/// global batch that the micro-batch does not divide is an error unless the
/// job allows a remainder (then the last micro-batch is smaller, see
/// strategies/accumulation.h).
struct TrainingConfig {
  int64_t micro_batch = 1;         // COUNT: samples per forward/backward
  int64_t accumulation_steps = 1;  // COUNT: micro-batches per optimizer step
  CheckpointPlan checkpoint;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  bool offload_optimizer = false;  // optimizer state and update on the host
  Precision precision = Precision::kFp32;

  bool operator==(const TrainingConfig& other) const;
  bool operator!=(const TrainingConfig& other) const { return !(*this == other); }
};

/// Why Adafactor with optimizer offload is refused, by the plan reader and
/// normalize_config alike (the strategy table never combines them).
inline constexpr const char* kAdafactorOffloadProblem =
    "Adafactor with optimizer offload is not offered: DeepSpeed offloads only its own CPU optimizers "
    "(DeepSpeedCPUAdam, Adam-family), so no framework runs it; use offload with adamw, or Adafactor on the device";

/// BYTES per trainable parameter optimizer offload keeps on the host
/// (ZeRO-Offload; oomtune's step in strategies/master_weights.h, DeepSpeed's
/// CPU optimizer alike): the fp32 master weight and its gradient, 4 + 4,
/// and the offloaded optimizer's fp32 state: 8 for AdamW (exp_avg,
/// exp_avg_sq; 8-bit AdamW and Adafactor are offloaded as AdamW, the only
/// state DeepSpeed's CPU optimizers keep), 4 for SGD with momentum
/// (momentum_buffer), 0 without. DeepSpeed's
/// estimate_zero2_model_states_mem_needs (deepspeed/runtime/zero/
/// stage_1_and_2.py) counts the same 16 for Adam on one GPU, times a 1.5
/// buffer factor.
int64_t offload_host_bytes_per_parameter(OptimizerKind offloaded, bool momentum);

/// "adamw", "adamw8bit", "sgd", "adafactor".
std::string to_string(OptimizerKind kind);
/// "fp32", "bf16", "fp16", "bf16_params".
std::string to_string(Precision precision);
/// "none", "all", "every:2", "first:3", "paths:blocks.0+blocks.1".
std::string to_string(const CheckpointPlan& plan);
/// The --config form, e.g. "micro_batch=4,accum=2,ckpt=all,optimizer=adamw,offload=off,precision=fp32".
std::string to_string(const TrainingConfig& config);

/// Parses a name as written by to_string. Throws ConfigError naming the
/// value and the closest valid name.
OptimizerKind parse_optimizer(const std::string& text);
Precision parse_precision(const std::string& text);
CheckpointPlan parse_checkpoint_plan(const std::string& text);

/// Applies a --config override string ("ckpt=all,micro_batch=4,optimizer=adamw8bit")
/// on top of `base`. Keys: micro_batch, accum (or accumulation_steps), ckpt,
/// optimizer, offload (on/off/true/false), precision. Throws ConfigError on an
/// unknown key (naming the closest) or a bad value.
TrainingConfig parse_config_overrides(const std::string& text, TrainingConfig base);

}  // namespace oomtune
