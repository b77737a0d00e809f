#include "strategies/training_config.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace oomtune {
namespace {

TEST(TrainingConfig, DefaultsArePinned) {
  TrainingConfig c;
  EXPECT_EQ(c.micro_batch, 1);
  EXPECT_EQ(c.accumulation_steps, 1);
  EXPECT_EQ(c.checkpoint.mode, CheckpointPlan::Mode::kNone);
  EXPECT_EQ(c.optimizer, OptimizerKind::kAdamW);
  EXPECT_FALSE(c.offload_optimizer);
  EXPECT_EQ(c.precision, Precision::kFp32);
  EXPECT_EQ(to_string(c), "micro_batch=1,accum=1,ckpt=none,optimizer=adamw,offload=off,precision=fp32");
}

TEST(TrainingConfig, OverridesParseAndRoundTrip) {
  TrainingConfig c = parse_config_overrides("ckpt=auto,micro_batch=4,optimizer=adamw8bit", TrainingConfig{});
  EXPECT_EQ(c.micro_batch, 4);
  EXPECT_EQ(c.checkpoint.mode, CheckpointPlan::Mode::kAll);
  EXPECT_EQ(c.optimizer, OptimizerKind::kAdamW8bit);
  const TrainingConfig back = parse_config_overrides(to_string(c), TrainingConfig{});
  EXPECT_EQ(back, c);

  TrainingConfig d =
      parse_config_overrides("ckpt=paths:blocks.0+blocks.2,offload=on,precision=bf16,accum=2", TrainingConfig{});
  EXPECT_EQ(d.checkpoint.paths, (std::vector<std::string>{"blocks.0", "blocks.2"}));
  EXPECT_TRUE(d.offload_optimizer);
  EXPECT_EQ(parse_config_overrides(to_string(d), TrainingConfig{}), d);
  EXPECT_EQ(parse_checkpoint_plan("every:2").every_k, 2);
  EXPECT_EQ(parse_checkpoint_plan("first:3").first_n, 3);
}

TEST(TrainingConfig, EveryPrecisionRoundTripsThroughItsName) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16, Precision::kBf16Params})
    EXPECT_EQ(parse_precision(to_string(p)), p) << to_string(p);
  EXPECT_EQ(to_string(Precision::kBf16Params), "bf16_params");
  TrainingConfig c;
  c.precision = Precision::kBf16Params;
  c.offload_optimizer = true;
  EXPECT_EQ(to_string(c), "micro_batch=1,accum=1,ckpt=none,optimizer=adamw,offload=on,precision=bf16_params");
  EXPECT_EQ(parse_config_overrides(to_string(c), TrainingConfig{}), c);
  try {
    parse_precision("bf16_param");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'bf16_params'?"), std::string::npos) << e.what();
  }
}

TEST(TrainingConfig, BadOverridesNameTheProblem) {
  try {
    parse_config_overrides("micro_bach=4", TrainingConfig{});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'micro_bach' (did you mean 'micro_batch'?"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_config_overrides("micro_batch=0", TrainingConfig{}), ConfigError);
  EXPECT_THROW(parse_config_overrides("optimizer=lion", TrainingConfig{}), ConfigError);
  EXPECT_THROW(parse_config_overrides("ckpt=some", TrainingConfig{}), ConfigError);
  EXPECT_THROW(parse_config_overrides("offload=maybe", TrainingConfig{}), ConfigError);
  EXPECT_THROW(parse_config_overrides("precision", TrainingConfig{}), ConfigError);
}

std::string checkpoint_error(const std::string& text) {
  try {
    parse_checkpoint_plan(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// Found by tests/fuzz/fuzz_job_files.cpp: "paths:a++" read as {"a", ""},
// which plan.toml wrote as "paths:a+", read back as {"a"}: a different plan.
TEST(TrainingConfig, EveryCheckpointPlanItReadsWritesBackTheSame) {
  for (const std::string text : {"paths:blocks.0++", "paths:+blocks.0", "paths:blocks.0++blocks.1", "paths:a+"})
    EXPECT_EQ(checkpoint_error(text), "config: ckpt paths: empty path in '" + text + "' (write paths:A+B)");
  EXPECT_EQ(checkpoint_error("paths:"), "config: ckpt paths: needs at least one path, e.g. paths:blocks.0");
  // Counts are digits within int64: strtoll clamped the first to its maximum.
  for (const std::string text : {"every:99999999999999999999", "every: 2", "first:+2", "every:2x", "first:0"})
    EXPECT_NE(checkpoint_error(text).find("must be a whole number >= 1, got '" + text.substr(text.find(':') + 1) + "'"),
              std::string::npos)
        << text;
  for (const std::string text : {"none", "all", "every:3", "first:9223372036854775807", "paths:a", "paths:a.b+c"})
    EXPECT_EQ(to_string(parse_checkpoint_plan(text)), text);
}

// What optimizer offload keeps on the host per trainable parameter: fp32
// master and gradient, 4 + 4, and the offloaded optimizer's fp32 state
// (TrainingStep.OffloadKeepsOptimizerStateOffTheDeviceAndUpdatesIdentically
// measures the 16 of AdamW on the CPU).
TEST(TrainingConfig, OffloadKeepsMastersGradientsAndStateOnTheHost) {
  EXPECT_EQ(offload_host_bytes_per_parameter(OptimizerKind::kAdamW, false), 16);
  EXPECT_EQ(offload_host_bytes_per_parameter(OptimizerKind::kAdamW8bit, false), 16);  // offloaded as AdamW
  EXPECT_EQ(offload_host_bytes_per_parameter(OptimizerKind::kSgd, true), 12);
  EXPECT_EQ(offload_host_bytes_per_parameter(OptimizerKind::kSgd, false), 8);
}

}  // namespace
}  // namespace oomtune
