// Targeted checks of the combinations the golden cases do not show: each
// inexpressible setting is written in its nearest form with a note.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "recipes/recipes.h"
#include "tests/recipes/plan_cases.h"

namespace oomtune {
namespace {

bool any_note_has(const std::vector<std::string>& notes, const std::string& text) {
  for (const auto& note : notes)
    if (note.find(text) != std::string::npos) return true;
  return false;
}

TEST(Writers, CpuPlanWithoutDeepSpeedStaysOnTheCpu) {
  Plan plan = testing::base_plan(4, 2);
  plan.device = Device::kCpu;
  EXPECT_NE(write_accelerate_config(plan).find("\nuse_cpu: true\n"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(write_lightning_trainer(plan))["trainer"]["accelerator"], "cpu");
  EXPECT_FALSE(any_note_has(deepspeed_notes(plan), "measured on the CPU"));
}

TEST(Writers, EightBitAdamWithOffloadBecomesCpuAdamWithANote) {
  Plan plan = testing::base_plan(4, 2);
  plan.config.optimizer = OptimizerKind::kAdamW8bit;
  plan.config.offload_optimizer = true;
  const auto ds = nlohmann::json::parse(write_deepspeed_config(plan));
  EXPECT_EQ(ds["optimizer"]["type"], "AdamW");
  EXPECT_TRUE(any_note_has(deepspeed_notes(plan), "8-bit AdamW with optimizer offload"));
  const auto hf = nlohmann::json::parse(write_hf_training_args(plan));
  EXPECT_EQ(hf["training_args"]["optim"], "adamw_torch");
  EXPECT_EQ(hf["training_args"]["deepspeed"], "ds_config.json");
  EXPECT_TRUE(any_note_has(hf_notes(plan), "8-bit AdamW with optimizer offload"));
  const auto lightning = nlohmann::json::parse(write_lightning_trainer(plan));
  EXPECT_EQ(lightning["optimizer"]["class"], "deepspeed.ops.adam.DeepSpeedCPUAdam");
  EXPECT_TRUE(any_note_has(lightning_notes(plan), "8-bit AdamW with optimizer offload"));
  EXPECT_TRUE(any_note_has(accelerate_notes(plan), "the script builds torch.optim.AdamW(model.parameters()"));
  EXPECT_TRUE(any_note_has(accelerate_notes(plan), "8-bit AdamW with optimizer offload"));
}

TEST(Writers, SgdMomentumWithoutOffloadIsANoteForHf) {
  Plan plan = testing::base_plan(4, 2);
  plan.config.optimizer = OptimizerKind::kSgd;
  plan.optimizer.momentum = 0.9;
  const auto hf = nlohmann::json::parse(write_hf_training_args(plan));
  EXPECT_EQ(hf["training_args"]["optim"], "sgd");
  EXPECT_FALSE(hf["training_args"].contains("adam_beta1"));
  EXPECT_TRUE(any_note_has(hf_notes(plan), "optimizers=(optimizer, None)"));
  const auto ds = nlohmann::json::parse(write_deepspeed_config(plan));
  EXPECT_EQ(ds["optimizer"]["type"], "SGD");
  EXPECT_EQ(ds["optimizer"]["params"]["momentum"], 0.9);
  EXPECT_FALSE(ds.contains("zero_force_ds_cpu_optimizer"));
}

TEST(Writers, AccelerateOffloadWithNonDefaultBetasPointsAtTheDeepSpeedFile) {
  Plan plan = testing::base_plan(4, 2);
  plan.config.offload_optimizer = true;
  EXPECT_FALSE(any_note_has(accelerate_notes(plan), "keeps only lr and weight_decay"));
  plan.optimizer.beta2 = 0.95;
  EXPECT_TRUE(any_note_has(accelerate_notes(plan), "keeps only lr and weight_decay"));
  EXPECT_EQ(find_recipe_writer("accelerate").needs(plan), std::vector<std::string>{"deepspeed"});
}

TEST(Writers, EveryWriterRejectsAnInvalidPlan) {
  Plan plan = testing::base_plan(4, 2);
  plan.global_batch = 7;
  for (const auto& writer : recipe_writers()) EXPECT_THROW(writer.write(plan), ConfigError) << writer.name;
}

TEST(Writers, Fp16UsesDynamicLossScaling) {
  Plan plan = testing::base_plan(4, 2);
  plan.config.precision = Precision::kFp16;
  const auto ds = nlohmann::json::parse(write_deepspeed_config(plan));
  EXPECT_EQ(ds["fp16"]["enabled"], true);
  EXPECT_EQ(ds["fp16"]["loss_scale"], 0);  // 0 = dynamic (DeepSpeed config-json)
  EXPECT_FALSE(ds.contains("bf16"));
  EXPECT_EQ(nlohmann::json::parse(write_lightning_trainer(plan))["trainer"]["precision"], "16-mixed");
  EXPECT_NE(write_accelerate_config(plan).find("\nmixed_precision: 'fp16'\n"), std::string::npos);
}

}  // namespace
}  // namespace oomtune
