#include "recipes/zero_estimate.h"

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"
#include "common/error.h"
#include "common/json_text.h"

namespace oomtune {
namespace {

// Bytes per parameter (ZeRO paper Sec. 5; Dettmers et al. 2022 for 8-bit).
constexpr double kFp32Bytes = 4;         // fp32 weight, gradient, master copy or Adam moment
constexpr double kHalfBytes = 2;         // bf16 / fp16 weight or gradient
constexpr double kAdamStates = 2;        // m and v
constexpr double kInt8StateBytes = 1;    // one quantized moment
constexpr double kSgdMomentumBytes = 4;  // one fp32 momentum buffer

struct Sharding {
  bool optimizer_state;
  bool gradients;
  bool weights;
};

Sharding sharding(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kDdp:
      return {false, false, false};
    case ShardingStrategy::kZero1:
      return {true, false, false};
    case ShardingStrategy::kZero2:
    case ShardingStrategy::kFsdpShardGradOp:
      return {true, true, false};
    case ShardingStrategy::kZero3:
    case ShardingStrategy::kFsdpFullShard:
      return {true, true, true};
    case ShardingStrategy::kNumStrategies:
      break;
  }
  return {false, false, false};
}

int64_t bytes_of(int64_t parameters, double per_parameter, bool sharded, int64_t gpus) {
  const double total = static_cast<double>(parameters) * per_parameter;
  return static_cast<int64_t>(std::ceil(sharded ? total / static_cast<double>(gpus) : total));
}

std::string size_or_dash(int64_t bytes) { return bytes == 0 ? "-" : format_bytes(bytes); }

}  // namespace

std::string to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kDdp:
      return "DDP (ZeRO-0)";
    case ShardingStrategy::kZero1:
      return "ZeRO-1";
    case ShardingStrategy::kZero2:
      return "ZeRO-2";
    case ShardingStrategy::kZero3:
      return "ZeRO-3";
    case ShardingStrategy::kFsdpShardGradOp:
      return "FSDP SHARD_GRAD_OP";
    case ShardingStrategy::kFsdpFullShard:
      return "FSDP FULL_SHARD";
    case ShardingStrategy::kNumStrategies:
      break;
  }
  return "?";
}

BytesPerParameter bytes_per_parameter(Precision precision, OptimizerKind optimizer, bool sgd_momentum) {
  double state = 0;
  switch (optimizer) {
    case OptimizerKind::kAdamW:
      state = kAdamStates * kFp32Bytes;
      break;
    case OptimizerKind::kAdamW8bit:
      state = kAdamStates * (kInt8StateBytes + kFp32Bytes / static_cast<double>(kZeroQuantizationBlock));
      break;
    case OptimizerKind::kSgd:
      state = sgd_momentum ? kSgdMomentumBytes : 0;
      break;
    // Factored: 4 (r + c) bytes per r x c matrix, below 0.01 B per parameter
    // once r and c pass 800; vectors (biases, norms) add 4 B per element
    // but hold a small share of a model's parameters. Counted as 0.
    case OptimizerKind::kAdafactor:
      state = 0;
      break;
  }
  BytesPerParameter bytes;
  if (precision == Precision::kFp32) {
    bytes.weights = kFp32Bytes;
    bytes.gradients = kFp32Bytes;
    bytes.optimizer_state = state;
  } else {
    bytes.weights = kHalfBytes;
    bytes.gradients = kHalfBytes;
    bytes.optimizer_state = kFp32Bytes + state;  // fp32 master copy
    bytes.frozen_weights = kHalfBytes;
  }
  return bytes;
}

BytesPerParameter stored_bytes_per_parameter(const TrainingConfig& config, bool sgd_momentum, bool frozen_bf16) {
  const bool half_weights = config.precision == Precision::kBf16Params;
  BytesPerParameter bytes =
      bytes_per_parameter(half_weights ? Precision::kBf16Params : Precision::kFp32, config.optimizer, sgd_momentum);
  if (frozen_bf16) bytes.frozen_weights = kHalfBytes;
  return bytes;
}

bool ZeroMemory::operator==(const ZeroMemory& other) const {
  return weights == other.weights && gradients == other.gradients && optimizer_state == other.optimizer_state &&
         activations == other.activations && workspaces == other.workspaces;
}

ZeroMemory zero_per_gpu(const ZeroInputs& inputs, ShardingStrategy strategy, int64_t gpus) {
  if (gpus < 1) throw ConfigError(fmt::format("zero table: gpus must be >= 1, got {}", gpus));
  if (inputs.parameters < 0 || inputs.frozen_parameters < 0 || inputs.activation_bytes < 0 ||
      inputs.workspace_bytes < 0)
    throw ConfigError(fmt::format(
        "zero table: parameters, frozen parameters, activation and workspace bytes must be >= 0, got {}, {}, {} and {}",
        inputs.parameters, inputs.frozen_parameters, inputs.activation_bytes, inputs.workspace_bytes));
  const Sharding shard = sharding(strategy);
  ZeroMemory memory;
  memory.weights = bytes_of(inputs.parameters, inputs.bytes.weights, shard.weights, gpus) +
                   bytes_of(inputs.frozen_parameters, inputs.bytes.frozen_weights, shard.weights, gpus);
  memory.gradients = bytes_of(inputs.parameters, inputs.bytes.gradients, shard.gradients, gpus);
  memory.optimizer_state = bytes_of(inputs.parameters, inputs.bytes.optimizer_state, shard.optimizer_state, gpus);
  memory.activations = inputs.activation_bytes;
  memory.workspaces = inputs.workspace_bytes;
  return memory;
}

namespace {

// The per-GPU bytes of `strategy` that more GPUs do not divide: its unsharded
// states whole, activations and workspaces.
int64_t unsharded_bytes(const ZeroInputs& inputs, ShardingStrategy strategy) {
  const Sharding shard = sharding(strategy);
  const ZeroMemory whole = zero_per_gpu(inputs, strategy, 1);
  return (shard.weights ? 0 : whole.weights) + (shard.gradients ? 0 : whole.gradients) +
         (shard.optimizer_state ? 0 : whole.optimizer_state) + whole.activations + whole.workspaces;
}

}  // namespace

std::optional<int64_t> zero_min_gpus(const ZeroInputs& inputs, ShardingStrategy strategy, int64_t budget_bytes,
                                     int64_t max_gpus) {
  // Per-GPU bytes never grow with N, so the first N that fits is the answer.
  for (int64_t n = 1; n <= max_gpus; ++n)
    if (zero_per_gpu(inputs, strategy, n).total() <= budget_bytes) return n;
  return std::nullopt;
}

ZeroTable zero_table(const ZeroInputs& inputs) {
  ZeroTable table;
  table.inputs = inputs;
  for (std::size_t i = 0; i < kNumShardingStrategies; ++i) {
    const auto strategy = static_cast<ShardingStrategy>(i);
    ZeroRow& row = table.rows[i];
    row.strategy = strategy;
    row.per_gpu = zero_per_gpu(inputs, strategy, inputs.gpus);
    if (inputs.budget_bytes) {
      row.min_gpus = zero_min_gpus(inputs, strategy, *inputs.budget_bytes);
      row.never_fits = !row.min_gpus && unsharded_bytes(inputs, strategy) > *inputs.budget_bytes;
    }
  }
  return table;
}

std::optional<int64_t> zero_fewest_gpus(const ZeroTable& table) {
  std::optional<int64_t> fewest;
  for (const ZeroRow& row : table.rows)
    if (row.min_gpus && (!fewest || *row.min_gpus < *fewest)) fewest = row.min_gpus;
  return fewest;
}

std::string render_zero_table(const ZeroTable& table) {
  const ZeroInputs& in = table.inputs;
  const std::string frozen = in.frozen_parameters == 0
                                 ? ""
                                 : fmt::format(" trainable, {} frozen at {} bytes each (weights only)",
                                               in.frozen_parameters, in.bytes.frozen_weights);
  const std::string workspaces =
      in.workspace_bytes == 0
          ? ""
          : fmt::format("; in each total, the libraries' workspaces on every GPU: {} (cuBLAS, cuBLASLt)",
                        format_bytes(in.workspace_bytes));
  std::string out = fmt::format(
      "Predicted per-GPU memory with sharding ({} parameters{}; bytes/param: weights {}, gradients {}, optimizer "
      "state {}; activations at micro-batch 1: {}{}{})\n",
      in.parameters, frozen, in.bytes.weights, in.bytes.gradients, in.bytes.optimizer_state,
      format_bytes(in.activation_bytes), in.activation_source.empty() ? "" : " " + in.activation_source, workspaces);
  const std::string fits_header =
      in.budget_bytes ? fmt::format("GPUs to fit {}", format_bytes(*in.budget_bytes)) : std::string("GPUs to fit");
  out += fmt::format("{:<20} {:>12} {:>12} {:>12} {:>12} {:>12}  {}\n", "strategy", "weights", "gradients", "optimizer",
                     "activations", fmt::format("total @{}", in.gpus), fits_header);
  for (const ZeroRow& row : table.rows) {
    std::string fits = "-";
    if (in.budget_bytes)
      fits = row.min_gpus     ? fmt::format("{}", *row.min_gpus)
             : row.never_fits ? std::string("never")
                              : fmt::format("> {}", kZeroMaxGpus);
    out += fmt::format("{:<20} {:>12} {:>12} {:>12} {:>12} {:>12}  {}\n", to_string(row.strategy),
                       size_or_dash(row.per_gpu.weights), size_or_dash(row.per_gpu.gradients),
                       size_or_dash(row.per_gpu.optimizer_state), size_or_dash(row.per_gpu.activations),
                       format_bytes(row.per_gpu.total()), fits);
  }
  if (in.budget_bytes) {
    std::vector<std::string> fit_at_n, fewest_rows;
    const std::optional<int64_t> fewest = zero_fewest_gpus(table);
    for (const ZeroRow& row : table.rows) {
      if (row.per_gpu.total() <= *in.budget_bytes) fit_at_n.push_back(to_string(row.strategy));
      if (fewest && row.min_gpus == fewest) fewest_rows.push_back(to_string(row.strategy));
    }
    out +=
        fmt::format("Fit {} per GPU at {} GPU{}: {}; ", format_bytes(*in.budget_bytes), in.gpus,
                    in.gpus == 1 ? "" : "s", fit_at_n.empty() ? "none" : fmt::format("{}", fmt::join(fit_at_n, ", ")));
    out += fewest ? fmt::format("the fewest GPUs that fit: {} ({})\n", *fewest, fmt::join(fewest_rows, ", "))
                  : fmt::format("none on up to {} GPUs\n", kZeroMaxGpus);
  }
  out +=
      "Model: Rajbhandari et al., ZeRO (SC 2020), Sec. 5: psi*(w + g + K), sharded by N per stage; a lower "
      "bound (no communication buffers, no fragmentation).\n";
  return out;
}

nlohmann::json zero_table_json(const ZeroTable& table) {
  const ZeroInputs& in = table.inputs;
  nlohmann::json rows = nlohmann::json::array();
  for (const ZeroRow& row : table.rows) {
    rows.push_back(
        {{"strategy", to_string(row.strategy)},
         {"per_gpu",
          {{"weights", row.per_gpu.weights},
           {"gradients", row.per_gpu.gradients},
           {"optimizer_state", row.per_gpu.optimizer_state},
           {"activations", row.per_gpu.activations},
           {"workspaces", row.per_gpu.workspaces},
           {"total", row.per_gpu.total()}}},
         {"fits", in.budget_bytes ? nlohmann::json(row.per_gpu.total() <= *in.budget_bytes) : nlohmann::json(nullptr)},
         {"min_gpus", json_or_null(row.min_gpus)},
         {"never_fits", row.never_fits}});
  }
  nlohmann::json json = {{"kind", "predicted"},
                         {"source",
                          "Rajbhandari et al., ZeRO: Memory Optimizations Toward Training Trillion Parameter Models, "
                          "SC 2020, Sec. 5"},
                         {"parameters", in.parameters},
                         {"bytes_per_parameter",
                          {{"weights", in.bytes.weights},
                           {"gradients", in.bytes.gradients},
                           {"optimizer_state", in.bytes.optimizer_state}}},
                         {"activation_bytes", in.activation_bytes},
                         {"workspace_bytes", in.workspace_bytes},
                         {"gpus", in.gpus},
                         {"budget_bytes", json_or_null(in.budget_bytes)},
                         {"max_gpus", kZeroMaxGpus},
                         {"fewest_gpus", json_or_null(zero_fewest_gpus(table))},
                         {"rows", rows}};
  if (!in.activation_source.empty()) json["activation_source"] = in.activation_source;
  if (in.frozen_parameters > 0) {
    json["frozen_parameters"] = in.frozen_parameters;
    json["bytes_per_parameter"]["frozen_weights"] = in.bytes.frozen_weights;
  }
  return json;
}

}  // namespace oomtune
