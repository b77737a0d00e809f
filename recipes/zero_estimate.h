#pragma once
// The ZeRO / FSDP per-GPU memory table, shown when no single-GPU
// configuration fits: how many GPUs each sharding strategy would need.
//
// Model (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
// Trillion Parameter Models", SC 2020, Sec. 5 and Fig. 1): a model of Ψ
// parameters holds weights (w bytes/param), gradients (g) and optimizer state
// (K) — Ψ(2 + 2 + K) with K = 12 for mixed-precision Adam. On N GPUs:
//   DDP (stage 0):    Ψ(w + g + K)             per GPU
//   ZeRO-1 (P_os):    Ψ(w + g) + ΨK/N
//   ZeRO-2 (P_os+g):  Ψw + Ψ(g + K)/N
//   ZeRO-3 (P_os+g+p): Ψ(w + g + K)/N
// PyTorch FSDP SHARD_GRAD_OP shards like ZeRO-2 and FULL_SHARD like ZeRO-3.
// Activations at micro-batch 1 are added unsharded on every GPU, and so
// are the libraries' workspaces where the budget is on the caching
// allocator's reserved bytes (cuBLAS and cuBLASLt, probes/attention_model.h:
// each GPU's process holds its own).
// Frozen parameters (job/parameter_selection.h) hold their weights only:
// Ψ counts the trainable parameters, and the Ψ_f frozen ones add Ψ_f·w_f
// to the weights, sharded where the weights are (ZeRO-3 and FULL_SHARD
// partition every parameter, frozen or not: DeepSpeed's
// deepspeed/runtime/zero/partition_parameters.py, Init, partitions each
// module's parameters without looking at requires_grad; ZeRO-1/2 partition
// only the optimizer's parameter groups, i.e. the trainable ones).
//
// Limitations: no communication buckets, no stage-3 gathered-layer buffers,
// no allocator fragmentation: the table is a lower bound, labelled
// "predicted" wherever it is shown.

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "strategies/training_config.h"

namespace oomtune {

/// Block size of 8-bit blockwise-quantized optimizer states: one fp32 absmax
/// per block per state (Dettmers et al., "8-bit Optimizers via Block-wise
/// Quantization", ICLR 2022; strategies/blockwise_quantization.h kBlockSize).
constexpr int64_t kZeroQuantizationBlock = 2048;
/// The largest N the table searches for the smallest fitting GPU count.
constexpr int64_t kZeroMaxGpus = 1024;

/// Sharding strategies, in table order.
enum class ShardingStrategy {
  kDdp,              ///< no sharding (DDP, ZeRO stage 0)
  kZero1,            ///< optimizer state sharded (P_os)
  kZero2,            ///< + gradients (P_os+g)
  kZero3,            ///< + parameters (P_os+g+p)
  kFsdpShardGradOp,  ///< PyTorch FSDP SHARD_GRAD_OP (= ZeRO-2)
  kFsdpFullShard,    ///< PyTorch FSDP FULL_SHARD (= ZeRO-3)
  kNumStrategies,
};
constexpr std::size_t kNumShardingStrategies = static_cast<std::size_t>(ShardingStrategy::kNumStrategies);

/// "DDP (ZeRO-0)", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FSDP SHARD_GRAD_OP", "FSDP FULL_SHARD".
std::string to_string(ShardingStrategy strategy);

/// Bytes per parameter of each model state.
struct BytesPerParameter {
  double weights = 4;          // fp32 weights; 2 for bf16/fp16 mixed precision
  double gradients = 4;        // same precision as the weights
  double optimizer_state = 8;  // K: AdamW fp32 m and v; + 4 for the fp32 master copy in mixed precision
  double frozen_weights = 4;   // a frozen parameter's weight, its only state: 2 in mixed precision or frozen bf16
};

/// Bytes per parameter for a TrainingConfig's precision and optimizer, as
/// ZeRO counts them (mixed precision = low-precision weights and gradients
/// plus an fp32 master copy counted as optimizer state):
///   fp32:            w 4, g 4, K = state
///   bf16/fp16 mixed: w 2, g 2, K = 4 (master) + state
/// where state is AdamW 8 (m, v in fp32), 8-bit AdamW 2 * (1 + 4/2048)
/// (m, v in int8 plus one fp32 absmax per 2048-element block each), SGD 4
/// with momentum else 0, Adafactor 0 (its factored second moment is 4 (r + c)
/// bytes per r x c matrix: not a per-parameter constant, and a negligible
/// one for large matrices). bf16 AdamW gives the paper's 2 + 2 + 12.
/// A frozen parameter keeps its weight only: 4 bytes in fp32, 2 in mixed
/// precision.
/// Note: oomtune's own bf16 strategy is autocast with fp32 weights; for that
/// pass Precision::kFp32 (the weights and gradients stay fp32), or use
/// stored_bytes_per_parameter.
BytesPerParameter bytes_per_parameter(Precision precision, OptimizerKind optimizer, bool sgd_momentum = false);

/// Bytes per parameter that oomtune's own training step keeps for `config`
/// (the analytic column of `oomtune probe`): autocast (bf16, fp16) keeps
/// fp32 weights and gradients, so it counts as fp32; bf16_params is mixed
/// precision as above (2 + 2 + 4 master + state). Offload moves the
/// optimizer state to the host but does not change its size. A frozen
/// parameter keeps 4 bytes, 2 under bf16_params or `frozen_bf16`
/// (frozen_dtype = "bf16").
BytesPerParameter stored_bytes_per_parameter(const TrainingConfig& config, bool sgd_momentum = false,
                                             bool frozen_bf16 = false);

/// Inputs of the table.
struct ZeroInputs {
  int64_t parameters = 0;         // COUNT: Ψ, trainable parameters
  int64_t frozen_parameters = 0;  // COUNT: Ψ_f, frozen parameters (weights only, bytes.frozen_weights each)
  BytesPerParameter bytes;
  int64_t activation_bytes = 0;         // BYTES: activations + temporaries at micro-batch 1, measured, per GPU
  std::string activation_source;        // what activation_bytes are, e.g. "with activation checkpointing" ("": plain)
  int64_t gpus = 1;                     // COUNT: N for the per-GPU column (>= 1)
  std::optional<int64_t> budget_bytes;  // BYTES: usable per-GPU budget (after headroom); none: no fit column
  // BYTES per GPU the caching allocator holds beside the tensors (cuBLAS and
  // cuBLASLt workspaces), never sharded; 0 where the budget is on tensors.
  int64_t workspace_bytes = 0;
};

/// Per-GPU bytes of one strategy on N GPUs, by kind. Fractions of a byte are
/// rounded up per kind.
struct ZeroMemory {
  int64_t weights = 0;          // BYTES per GPU
  int64_t gradients = 0;        // BYTES per GPU
  int64_t optimizer_state = 0;  // BYTES per GPU (incl. the fp32 master copy)
  int64_t activations = 0;      // BYTES per GPU (never sharded)
  int64_t workspaces = 0;       // BYTES per GPU (ZeroInputs::workspace_bytes, never sharded)
  /// BYTES per GPU of all five kinds.
  int64_t total() const { return weights + gradients + optimizer_state + activations + workspaces; }
  bool operator==(const ZeroMemory& other) const;
};

/// Per-GPU memory of `strategy` on `gpus` GPUs (>= 1; throws ConfigError otherwise).
ZeroMemory zero_per_gpu(const ZeroInputs& inputs, ShardingStrategy strategy, int64_t gpus);

/// The smallest N in [1, max_gpus] at which zero_per_gpu(...).total() <=
/// budget_bytes, or nullopt when none does (DDP fits at N = 1 or never).
std::optional<int64_t> zero_min_gpus(const ZeroInputs& inputs, ShardingStrategy strategy, int64_t budget_bytes,
                                     int64_t max_gpus = kZeroMaxGpus);

/// One row of the table.
struct ZeroRow {
  ShardingStrategy strategy = ShardingStrategy::kDdp;
  ZeroMemory per_gpu;               // at inputs.gpus
  std::optional<int64_t> min_gpus;  // COUNT: smallest fitting N (<= kZeroMaxGpus); none: no budget or never
  // What no number of GPUs shards (activations, workspaces, the strategy's
  // unsharded states) is over the budget: the row fits on no N at all.
  bool never_fits = false;
};

/// The whole table: one row per strategy, in enum order.
struct ZeroTable {
  ZeroInputs inputs;
  std::array<ZeroRow, kNumShardingStrategies> rows;
};

/// Computes every row.
ZeroTable zero_table(const ZeroInputs& inputs);

/// The smallest min_gpus of any row, or nullopt (no budget, or no row fits
/// on up to kZeroMaxGpus GPUs).
std::optional<int64_t> zero_fewest_gpus(const ZeroTable& table);

/// Fixed-width text, one row per strategy: per-GPU weights, gradients,
/// optimizer state, activations and total at N GPUs (IEC units), and the
/// smallest N that fits the budget ("> 1024" when none, "-" without a
/// budget). With a budget, a line says which rows fit at N GPUs and the
/// fewest GPUs any row fits (with those rows), or that none fits on up to
/// kZeroMaxGpus. Ends with a line citing the model.
std::string render_zero_table(const ZeroTable& table);

/// {"parameters", "bytes_per_parameter": {...}, "activation_bytes",
/// "activation_source" (where not empty), "gpus",
/// and where any parameter is frozen "frozen_parameters" and
/// bytes_per_parameter.frozen_weights,
/// "budget_bytes" (null when none), "kind": "predicted", "source": "...",
/// "max_gpus", "fewest_gpus" (zero_fewest_gpus, null when none),
/// "rows": [{"strategy", "per_gpu": {"weights", "gradients",
/// "optimizer_state", "activations", "total"}, "fits" (total <= budget at
/// "gpus"; null without a budget), "min_gpus" (null when none)}]}.
/// Bytes are integers.
nlohmann::json zero_table_json(const ZeroTable& table);

}  // namespace oomtune
