#include "recipes/zero_estimate.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace oomtune {
namespace {

constexpr int64_t kGB = 1'000'000'000;  // the paper's GB (SI)

// The paper's worked example (Sec. 5, Fig. 1): Ψ = 7.5B, N = 64, K = 12.
ZeroInputs paper_example() {
  ZeroInputs in;
  in.parameters = 7'500'000'000;
  in.bytes = bytes_per_parameter(Precision::kBf16, OptimizerKind::kAdamW);
  in.gpus = 64;
  return in;
}

TEST(ZeroEstimate, BytesPerParameterFollowThePaperAndThe8BitLayout) {
  const BytesPerParameter fp32 = bytes_per_parameter(Precision::kFp32, OptimizerKind::kAdamW);
  EXPECT_EQ(fp32.weights, 4);
  EXPECT_EQ(fp32.gradients, 4);
  EXPECT_EQ(fp32.optimizer_state, 8);
  const BytesPerParameter mixed = bytes_per_parameter(Precision::kBf16, OptimizerKind::kAdamW);
  EXPECT_EQ(mixed.weights, 2);
  EXPECT_EQ(mixed.gradients, 2);
  EXPECT_EQ(mixed.optimizer_state, 12);  // K = 12: fp32 master + m + v
  EXPECT_EQ(bytes_per_parameter(Precision::kFp16, OptimizerKind::kAdamW).optimizer_state, 12);
  // Two int8 moments plus one fp32 absmax per 2048-element block for each.
  EXPECT_EQ(bytes_per_parameter(Precision::kFp32, OptimizerKind::kAdamW8bit).optimizer_state, 2.00390625);
  EXPECT_EQ(bytes_per_parameter(Precision::kBf16, OptimizerKind::kAdamW8bit).optimizer_state, 6.00390625);
  EXPECT_EQ(bytes_per_parameter(Precision::kFp32, OptimizerKind::kSgd).optimizer_state, 0);
  EXPECT_EQ(bytes_per_parameter(Precision::kFp32, OptimizerKind::kSgd, true).optimizer_state, 4);
  EXPECT_EQ(bytes_per_parameter(Precision::kBf16, OptimizerKind::kSgd).optimizer_state, 4);
}

TEST(ZeroEstimate, DefaultsArePinned) {
  ZeroInputs in;
  EXPECT_EQ(in.parameters, 0);
  EXPECT_EQ(in.bytes.weights, 4);
  EXPECT_EQ(in.bytes.gradients, 4);
  EXPECT_EQ(in.bytes.optimizer_state, 8);
  EXPECT_EQ(in.activation_bytes, 0);
  EXPECT_EQ(in.gpus, 1);
  EXPECT_FALSE(in.budget_bytes);
  EXPECT_EQ(kZeroMaxGpus, 1024);
  EXPECT_EQ(kZeroQuantizationBlock, 2048);
}

TEST(ZeroEstimate, ReproducesThePapersExample) {
  const ZeroInputs in = paper_example();
  EXPECT_EQ(zero_per_gpu(in, ShardingStrategy::kDdp, 64).total(), 120 * kGB);         // baseline 120 GB
  EXPECT_EQ(zero_per_gpu(in, ShardingStrategy::kZero1, 64).total(), 31'406'250'000);  // P_os 31.4 GB
  EXPECT_EQ(zero_per_gpu(in, ShardingStrategy::kZero2, 64).total(), 16'640'625'000);  // P_os+g 16.6 GB
  EXPECT_EQ(zero_per_gpu(in, ShardingStrategy::kZero3, 64).total(), 1'875'000'000);   // P_os+g+p 1.9 GB
  EXPECT_EQ(zero_per_gpu(in, ShardingStrategy::kFsdpShardGradOp, 64), zero_per_gpu(in, ShardingStrategy::kZero2, 64));
  EXPECT_EQ(zero_per_gpu(in, ShardingStrategy::kFsdpFullShard, 64), zero_per_gpu(in, ShardingStrategy::kZero3, 64));
  const ZeroMemory z1 = zero_per_gpu(in, ShardingStrategy::kZero1, 64);
  EXPECT_EQ(z1.weights, 15 * kGB);
  EXPECT_EQ(z1.gradients, 15 * kGB);
  EXPECT_EQ(z1.optimizer_state, 1'406'250'000);
  EXPECT_EQ(z1.activations, 0);
}

// A LoRA fine-tune of the paper's model: 7.5B frozen parameters and 20M
// trainable adapters. The frozen weights (2 bytes each in mixed precision)
// are in every GPU's weights column until ZeRO-3 shards them; gradients and
// optimizer state exist for the adapters only.
TEST(ZeroEstimate, FrozenParametersHoldTheirWeightsOnly) {
  ZeroInputs in = paper_example();
  in.parameters = 20'000'000;
  in.frozen_parameters = 7'500'000'000;
  EXPECT_EQ(in.bytes.frozen_weights, 2);
  EXPECT_EQ(bytes_per_parameter(Precision::kFp32, OptimizerKind::kAdamW).frozen_weights, 4);
  TrainingConfig fp32;
  EXPECT_EQ(stored_bytes_per_parameter(fp32).frozen_weights, 4);
  EXPECT_EQ(stored_bytes_per_parameter(fp32, false, /*frozen_bf16=*/true).frozen_weights, 2);
  const ZeroMemory ddp = zero_per_gpu(in, ShardingStrategy::kDdp, 64);
  EXPECT_EQ(ddp.weights, 2 * 20'000'000 + 2 * 7'500'000'000);
  EXPECT_EQ(ddp.gradients, 2 * 20'000'000);
  EXPECT_EQ(ddp.optimizer_state, 12 * 20'000'000);
  const ZeroMemory zero2 = zero_per_gpu(in, ShardingStrategy::kZero2, 64);
  EXPECT_EQ(zero2.weights, ddp.weights);
  EXPECT_EQ(zero2.optimizer_state, 12 * 20'000'000 / 64);
  const ZeroMemory zero3 = zero_per_gpu(in, ShardingStrategy::kZero3, 64);
  EXPECT_EQ(zero3.weights, 2 * 20'000'000 / 64 + 2 * 7'500'000'000 / 64);
  const ZeroTable table = zero_table(in);
  EXPECT_NE(render_zero_table(table).find("(20000000 parameters trainable, 7500000000 frozen at 2 bytes each (weights "
                                          "only); bytes/param: weights 2,"),
            std::string::npos)
      << render_zero_table(table);
  EXPECT_EQ(zero_table_json(table).at("frozen_parameters"), 7'500'000'000);
  EXPECT_EQ(zero_table_json(table).at("bytes_per_parameter").at("frozen_weights"), 2);
  // Without frozen parameters the JSON is as before.
  EXPECT_FALSE(zero_table_json(zero_table(paper_example())).contains("frozen_parameters"));
  in.frozen_parameters = -1;
  EXPECT_THROW(zero_per_gpu(in, ShardingStrategy::kDdp, 1), ConfigError);
}

TEST(ZeroEstimate, SmallestFittingGpuCount) {
  ZeroInputs in = paper_example();
  // 32 GB: Z1 needs 90/N <= 2 (N >= 45), Z2 105/N <= 17 (N >= 7), Z3 120/N <= 32 (N >= 4).
  EXPECT_EQ(zero_min_gpus(in, ShardingStrategy::kDdp, 32 * kGB), std::nullopt);
  EXPECT_EQ(zero_min_gpus(in, ShardingStrategy::kZero1, 32 * kGB), 45);
  EXPECT_EQ(zero_min_gpus(in, ShardingStrategy::kZero2, 32 * kGB), 7);
  EXPECT_EQ(zero_min_gpus(in, ShardingStrategy::kZero3, 32 * kGB), 4);
  EXPECT_EQ(zero_min_gpus(in, ShardingStrategy::kDdp, 120 * kGB), 1);
  // Unsharded activations of 2.5 GB: Z1 can never fit (30 + 2.5 GB before any state).
  in.activation_bytes = 2'500'000'000;
  EXPECT_EQ(zero_min_gpus(in, ShardingStrategy::kZero1, 32 * kGB), std::nullopt);
  EXPECT_EQ(zero_min_gpus(in, ShardingStrategy::kZero2, 32 * kGB), 8);  // 105/N <= 14.5: N >= 7.24
  EXPECT_EQ(zero_min_gpus(in, ShardingStrategy::kZero3, 32 * kGB), 5);  // 120/N <= 29.5: N >= 4.07
  // Past 1024 GPUs counts as never: Z3 with 0.1 GB left needs 120/0.1 = 1200 GPUs.
  EXPECT_EQ(zero_min_gpus(in, ShardingStrategy::kZero3, in.activation_bytes + kGB / 10), std::nullopt);
  EXPECT_EQ(zero_min_gpus(in, ShardingStrategy::kZero3, in.activation_bytes + kGB / 10, 1200), 1200);
}

TEST(ZeroEstimate, FractionalBytesRoundUpPerKind) {
  ZeroInputs in;
  in.parameters = 1'000'000;
  in.bytes = bytes_per_parameter(Precision::kFp32, OptimizerKind::kAdamW8bit);
  EXPECT_EQ(zero_per_gpu(in, ShardingStrategy::kDdp, 1).optimizer_state, 2'003'907);  // 2,003,906.25
  EXPECT_EQ(zero_per_gpu(in, ShardingStrategy::kZero1, 3).optimizer_state, 667'969);  // 667,968.75
  EXPECT_EQ(zero_per_gpu(in, ShardingStrategy::kZero1, 3).weights, 4'000'000);
}

TEST(ZeroEstimate, RejectsZeroGpus) {
  EXPECT_THROW(zero_per_gpu(paper_example(), ShardingStrategy::kZero3, 0), ConfigError);
}

TEST(ZeroEstimate, TableTextAndJson) {
  ZeroInputs in = paper_example();
  in.budget_bytes = 32 * kGB;
  const ZeroTable table = zero_table(in);
  EXPECT_EQ(table.rows[0].strategy, ShardingStrategy::kDdp);
  EXPECT_EQ(table.rows[5].strategy, ShardingStrategy::kFsdpFullShard);
  EXPECT_EQ(table.rows[3].min_gpus, 4);
  EXPECT_EQ(render_zero_table(table),
            "Predicted per-GPU memory with sharding (7500000000 parameters; bytes/param: weights 2, gradients 2, "
            "optimizer state 12; activations at micro-batch 1: 0 B)\n"
            "strategy                  weights    gradients    optimizer  activations    total @64  GPUs to fit "
            "29.80 GiB\n"
            "DDP (ZeRO-0)            13.97 GiB    13.97 GiB    83.82 GiB            -   111.76 GiB  never\n"
            "ZeRO-1                  13.97 GiB    13.97 GiB     1.31 GiB            -    29.25 GiB  45\n"
            "ZeRO-2                  13.97 GiB   223.52 MiB     1.31 GiB            -    15.50 GiB  7\n"
            "ZeRO-3                 223.52 MiB   223.52 MiB     1.31 GiB            -     1.75 GiB  4\n"
            "FSDP SHARD_GRAD_OP      13.97 GiB   223.52 MiB     1.31 GiB            -    15.50 GiB  7\n"
            "FSDP FULL_SHARD        223.52 MiB   223.52 MiB     1.31 GiB            -     1.75 GiB  4\n"
            // At 64 GPUs all but DDP are within 29.80 GiB (ZeRO-1: 29.25 GiB);
            // the fewest: ZeRO-3 at 120 GB / N <= 32 GB, N = 4.
            "Fit 29.80 GiB per GPU at 64 GPUs: ZeRO-1, ZeRO-2, ZeRO-3, FSDP SHARD_GRAD_OP, FSDP FULL_SHARD; the "
            "fewest GPUs that fit: 4 (ZeRO-3, FSDP FULL_SHARD)\n"
            "Model: Rajbhandari et al., ZeRO (SC 2020), Sec. 5: psi*(w + g + K), sharded by N per stage; a lower "
            "bound (no communication buffers, no fragmentation).\n");
  const nlohmann::json json = zero_table_json(table);
  EXPECT_EQ(json["kind"], "predicted");
  EXPECT_EQ(json["parameters"], 7'500'000'000);
  EXPECT_EQ(json["budget_bytes"], 32 * kGB);
  EXPECT_EQ(json["rows"].size(), kNumShardingStrategies);
  EXPECT_EQ(json["rows"][0]["strategy"], "DDP (ZeRO-0)");
  EXPECT_TRUE(json["rows"][0]["min_gpus"].is_null());
  EXPECT_EQ(json["rows"][0]["never_fits"], true);  // DDP shards nothing: 111.76 GiB on any N
  EXPECT_EQ(json["rows"][3]["never_fits"], false);
  EXPECT_EQ(json["rows"][1]["per_gpu"]["total"], 31'406'250'000);
  EXPECT_EQ(json["rows"][1]["min_gpus"], 45);
  EXPECT_EQ(json["bytes_per_parameter"]["optimizer_state"], 12.0);
  EXPECT_EQ(json["fewest_gpus"], 4);
  EXPECT_EQ(json["rows"][0]["fits"], false);  // DDP: 111.76 GiB at 64 GPUs
  EXPECT_EQ(json["rows"][1]["fits"], true);   // ZeRO-1: 29.25 GiB
  EXPECT_EQ(zero_fewest_gpus(table), 4);

  in.budget_bytes.reset();
  const ZeroTable no_budget = zero_table(in);
  EXPECT_FALSE(no_budget.rows[3].min_gpus);
  EXPECT_TRUE(zero_table_json(no_budget)["budget_bytes"].is_null());
  EXPECT_TRUE(zero_table_json(no_budget)["fewest_gpus"].is_null());
  EXPECT_TRUE(zero_table_json(no_budget)["rows"][0]["fits"].is_null());
  EXPECT_EQ(render_zero_table(no_budget).find("Fit "), std::string::npos) << "no budget, no fit line";
  // A budget below the unsharded activations: no row fits at any count.
  in.activation_bytes = 2 * kGB;
  in.budget_bytes = kGB;
  const ZeroTable none = zero_table(in);
  EXPECT_EQ(zero_fewest_gpus(none), std::nullopt);
  EXPECT_NE(render_zero_table(none).find("Fit 953.67 MiB per GPU at 64 GPUs: none; none on up to 1024 GPUs\n"),
            std::string::npos)
      << render_zero_table(none);
  for (const ZeroRow& row : none.rows) EXPECT_TRUE(row.never_fits) << to_string(row.strategy);
  // Just above the activations ZeRO-3 would fit on 1200 GPUs: past the
  // search, not never.
  in.activation_bytes = 2'500'000'000;
  in.budget_bytes = in.activation_bytes + kGB / 10;
  const ZeroTable far = zero_table(in);
  EXPECT_FALSE(far.rows[3].never_fits);
  EXPECT_TRUE(far.rows[1].never_fits);  // ZeRO-1 keeps 30 GB of weights and gradients on each
  EXPECT_NE(render_zero_table(far).find("ZeRO-3 "), std::string::npos);
  EXPECT_NE(render_zero_table(far).find("> 1024\n"), std::string::npos) << render_zero_table(far);
}

// Where the budget is on reserved bytes every GPU holds the libraries'
// workspaces beside its share of the states: in each total, never sharded.
TEST(ZeroEstimate, WorkspacesAreOnEveryGpu) {
  ZeroInputs in = paper_example();
  in.gpus = 8;
  in.budget_bytes = 32 * kGB;
  const ZeroTable without = zero_table(in);
  in.workspace_bytes = 65 * (int64_t{1} << 20);  // two cuBLAS workspaces of 32 MiB and cuBLASLt's 1 MiB
  const ZeroTable with = zero_table(in);
  for (std::size_t i = 0; i < kNumShardingStrategies; ++i) {
    EXPECT_EQ(with.rows[i].per_gpu.workspaces, in.workspace_bytes);
    EXPECT_EQ(with.rows[i].per_gpu.total(), without.rows[i].per_gpu.total() + in.workspace_bytes);
  }
  // ZeRO-3 at 4 GPUs: 30 GB a GPU + 65 MiB > 32 GB? 120 GB / 4 = 30 GB, under
  // 32 GB by 2 GB: still 4. ZeRO-2: 15 GB + 105 GB / N + 65 MiB <= 32 GB
  // needs N = 7 either way.
  EXPECT_EQ(with.rows[3].min_gpus, 4);
  EXPECT_EQ(with.rows[2].min_gpus, 7);
  const std::string text = render_zero_table(with);
  EXPECT_NE(text.find("; in each total, the libraries' workspaces on every GPU: 65.00 MiB (cuBLAS, cuBLASLt))\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(zero_table_json(with)["workspace_bytes"], in.workspace_bytes);
  EXPECT_EQ(zero_table_json(with)["rows"][3]["per_gpu"]["workspaces"], in.workspace_bytes);
  // A budget under the workspaces alone: no strategy fits on any N.
  in.budget_bytes = 64 * (int64_t{1} << 20);
  for (const ZeroRow& row : zero_table(in).rows) EXPECT_TRUE(row.never_fits) << to_string(row.strategy);
}

}  // namespace
}  // namespace oomtune
