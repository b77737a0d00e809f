// Targeted checks of the combinations the golden cases do not show: each
// inexpressible setting is written in its nearest form with a note.

#include <algorithm>

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
  EXPECT_TRUE(any_note_has(accelerate_notes(plan), "accelerate.utils.DummyOptim(model.parameters())"));
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

// Accelerate's inline deepspeed_config drops gradient_clipping 0.0 (DeepSpeed
// >= 0.19.3 then clips at 1.0) and has no key for the buckets or
// torch_autocast: under DeepSpeed the YAML names ds_config.json instead.
TEST(Writers, AccelerateUnderDeepSpeedIsTheDeepSpeedFile) {
  for (const Precision precision : {Precision::kFp32, Precision::kBf16, Precision::kBf16Params}) {
    Plan plan = testing::base_plan(4, 2);
    plan.config.precision = precision;
    plan.config.offload_optimizer = precision != Precision::kBf16Params;
    SCOPED_TRACE(to_string(plan.config));
    const std::string yaml = write_accelerate_config(plan);
    EXPECT_NE(yaml.find("\ndeepspeed_config:\n  deepspeed_config_file: 'ds_config.json'\n  zero3_init_flag: false\n"
                        "distributed_type: 'DEEPSPEED'\n"),
              std::string::npos)
        << yaml;
    std::string keys;  // the YAML less its '#' note lines
    for (std::size_t at = 0, end = 0; at < yaml.size(); at = end + 1) {
      end = std::min(yaml.find('\n', at), yaml.size());
      if (yaml[at] != '#') keys += yaml.substr(at, end - at + 1);
    }
    for (const char* inline_key : {"gradient_clipping", "zero_stage", "offload_optimizer_device", "mixed_precision"})
      EXPECT_EQ(keys.find(inline_key), std::string::npos) << inline_key;
    EXPECT_TRUE(any_note_has(accelerate_notes(plan), "accelerate.utils.DummyOptim(model.parameters())"));
    EXPECT_EQ(find_recipe_writer("accelerate").needs(plan), std::vector<std::string>{"deepspeed"});
  }
}

// The job's gradient clipping reaches every framework as what it clips by:
// max_grad_norm, gradient_clipping, gradient_clip_val with the "norm"
// algorithm (or, under DeepSpeed, the strategy config's gradient_clipping),
// and for Accelerate without DeepSpeed a note naming
// accelerator.clip_grad_norm_. None: 0 written where the framework's
// default clips (HF, DeepSpeed), nothing where it does not (Lightning).
TEST(Writers, EveryFileClipsAsTheJob) {
  for (const bool offload : {false, true}) {
    Plan plan = testing::base_plan(4, 2);
    plan.config.offload_optimizer = offload;
    plan.optimizer.max_grad_norm = 0.75;
    SCOPED_TRACE(to_string(plan.config));
    EXPECT_EQ(nlohmann::json::parse(write_hf_training_args(plan))["training_args"]["max_grad_norm"], 0.75);
    EXPECT_EQ(nlohmann::json::parse(write_deepspeed_config(plan))["gradient_clipping"], 0.75);
    const auto trainer = nlohmann::json::parse(write_lightning_trainer(plan))["trainer"];
    if (offload) {
      EXPECT_EQ(trainer["strategy"]["kwargs"]["config"]["gradient_clipping"], 0.75);
      EXPECT_FALSE(trainer.contains("gradient_clip_val"));  // DeepSpeed clips; Lightning's precision leaves it
    } else {
      EXPECT_EQ(trainer["gradient_clip_val"], 0.75);
      EXPECT_EQ(trainer["gradient_clip_algorithm"], "norm");
    }
    EXPECT_EQ(any_note_has(accelerate_notes(plan), "accelerator.clip_grad_norm_(model.parameters(), 0.75)"), !offload);
  }
  const Plan unclipped = testing::base_plan(4, 2);
  EXPECT_EQ(nlohmann::json::parse(write_hf_training_args(unclipped))["training_args"]["max_grad_norm"], 0.0);
  EXPECT_EQ(nlohmann::json::parse(write_deepspeed_config(unclipped))["gradient_clipping"], 0.0);
  EXPECT_FALSE(nlohmann::json::parse(write_lightning_trainer(unclipped))["trainer"].contains("gradient_clip_val"));
  EXPECT_FALSE(any_note_has(accelerate_notes(unclipped), "clip_grad_norm_"));
}

TEST(Writers, EveryWriterRejectsAnInvalidPlan) {
  Plan plan = testing::base_plan(4, 2);
  plan.global_batch = 7;
  for (const auto& writer : recipe_writers()) EXPECT_THROW(writer.write(plan), ConfigError) << writer.name;
}

// Autocast keeps fp32 weights: DeepSpeed's torch_autocast, never its
// bf16/fp16 sections (which cast the weights). Without offload the other
// frameworks use their own autocast.
TEST(Writers, AutocastIsTorchAutocastInDeepSpeed) {
  for (const auto& [precision, dtype] :
       {std::pair{Precision::kBf16, "bfloat16"}, std::pair{Precision::kFp16, "float16"}}) {
    Plan plan = testing::base_plan(4, 2);
    plan.config.precision = precision;
    const auto ds = nlohmann::json::parse(write_deepspeed_config(plan));
    EXPECT_EQ(ds["torch_autocast"], (nlohmann::json{{"enabled", true}, {"dtype", dtype}}));
    EXPECT_FALSE(ds.contains("bf16"));
    EXPECT_FALSE(ds.contains("fp16"));
    EXPECT_TRUE(any_note_has(deepspeed_notes(plan), "needs DeepSpeed 0.17.2 or later"));
    const auto hf = nlohmann::json::parse(write_hf_training_args(plan))["training_args"];
    EXPECT_EQ(hf["bf16"], precision == Precision::kBf16);
    EXPECT_EQ(hf["fp16"], precision == Precision::kFp16);
    EXPECT_EQ(nlohmann::json::parse(write_lightning_trainer(plan))["trainer"]["precision"],
              precision == Precision::kBf16 ? "bf16-mixed" : "16-mixed");
    EXPECT_NE(write_accelerate_config(plan).find(precision == Precision::kBf16 ? "\nmixed_precision: 'bf16'\n"
                                                                               : "\nmixed_precision: 'fp16'\n"),
              std::string::npos);
  }
}

// Under offload every framework runs DeepSpeed, so every file asks for its
// torch_autocast and none for its bf16/fp16 weights (the frameworks add
// those from their own precision switch: HF's bf16, Lightning's
// "bf16-mixed", Accelerate's mixed_precision).
TEST(Writers, AutocastUnderOffloadKeepsFp32WeightsInEveryFile) {
  for (const auto& [precision, dtype] :
       {std::pair{Precision::kBf16, "bfloat16"}, std::pair{Precision::kFp16, "float16"}}) {
    Plan plan = testing::base_plan(4, 2);
    plan.config.precision = precision;
    plan.config.offload_optimizer = true;
    const nlohmann::json autocast{{"enabled", true}, {"dtype", dtype}};
    const auto ds = nlohmann::json::parse(write_deepspeed_config(plan));
    EXPECT_EQ(ds["torch_autocast"], autocast);
    EXPECT_FALSE(ds.contains("bf16") || ds.contains("fp16"));
    const auto hf = nlohmann::json::parse(write_hf_training_args(plan))["training_args"];
    EXPECT_EQ(hf["bf16"], false);
    EXPECT_EQ(hf["fp16"], false);
    EXPECT_EQ(hf["deepspeed"], "ds_config.json");
    EXPECT_TRUE(any_note_has(hf_notes(plan), "which casts the weights"));
    const auto trainer = nlohmann::json::parse(write_lightning_trainer(plan))["trainer"];
    EXPECT_EQ(trainer["precision"], "32-true");
    const auto& config = trainer["strategy"]["kwargs"]["config"];
    EXPECT_EQ(config["torch_autocast"], autocast);
    EXPECT_FALSE(config.contains("bf16") || config.contains("fp16"));
    EXPECT_EQ(write_accelerate_config(plan).find("mixed_precision:"), std::string::npos);
  }
}

// bf16_params is DeepSpeed's bf16 mode at ZeRO stage 0 in every file (issue:
// Lightning's "deepspeed_stage_1" was ZeRO-1, one flat fp32 optimizer tensor).
TEST(Writers, Bf16ParamsIsDeepSpeedsBf16ModeAtStageZero) {
  Plan plan = testing::base_plan(4, 2);
  plan.config.precision = Precision::kBf16Params;
  const auto ds = nlohmann::json::parse(write_deepspeed_config(plan));
  EXPECT_EQ(ds["bf16"], (nlohmann::json{{"enabled", true}}));
  EXPECT_EQ(ds["zero_optimization"], (nlohmann::json{{"stage", 0}}));
  EXPECT_FALSE(ds.contains("torch_autocast"));
  EXPECT_EQ(nlohmann::json::parse(write_hf_training_args(plan))["training_args"]["bf16"], true);
  const auto trainer = nlohmann::json::parse(write_lightning_trainer(plan))["trainer"];
  EXPECT_EQ(trainer["precision"], "bf16-mixed");
  EXPECT_EQ(trainer["strategy"]["class"], "lightning.pytorch.strategies.DeepSpeedStrategy");  // no registered name
  EXPECT_EQ(trainer["strategy"]["kwargs"]["config"]["zero_optimization"], (nlohmann::json{{"stage", 0}}));
  EXPECT_EQ(trainer["strategy"]["kwargs"]["config"]["gradient_clipping"], 0.0);
}

// Note [ZeRO buckets]: the buckets together hold at most the trainable
// parameters, in every file that carries a ZeRO config; an even size.
TEST(Writers, OffloadBucketsHoldAtMostTheModel) {
  for (const auto& [precision, elements] :
       {std::pair{Precision::kFp32, int64_t{1'000'000}}, std::pair{Precision::kBf16Params, int64_t{1'000'000}},
        std::pair{Precision::kBf16, int64_t{500'000}},  // two buckets
        std::pair{Precision::kFp16, int64_t{500'000}}}) {
    Plan plan = testing::base_plan(4, 2);
    plan.config.offload_optimizer = true;
    plan.config.precision = precision;
    plan.parameter_count = 1'000'001;
    SCOPED_TRACE(to_string(precision));
    const auto ds = nlohmann::json::parse(write_deepspeed_config(plan))["zero_optimization"];
    EXPECT_EQ(ds["reduce_bucket_size"], elements);
    EXPECT_EQ(ds["allgather_bucket_size"], elements);
    const auto lightning = nlohmann::json::parse(write_lightning_trainer(plan));
    EXPECT_EQ(lightning["trainer"]["strategy"]["kwargs"]["config"]["zero_optimization"], ds);
    EXPECT_FALSE(any_note_has(deepspeed_notes(plan), "[job] parameters"));
  }
  Plan stage0 = testing::base_plan(4, 2);  // no ZeRO, no buckets
  EXPECT_EQ(nlohmann::json::parse(write_deepspeed_config(stage0))["zero_optimization"], (nlohmann::json{{"stage", 0}}));
}

TEST(Writers, OffloadWithoutAParameterCountSaysTheBucketIsUnsized) {
  Plan plan = testing::base_plan(4, 2);
  plan.config.offload_optimizer = true;
  plan.parameter_count.reset();  // a plan.toml written before [job] parameters
  const auto ds = nlohmann::json::parse(write_deepspeed_config(plan));
  EXPECT_FALSE(ds["zero_optimization"].contains("reduce_bucket_size"));
  EXPECT_TRUE(any_note_has(deepspeed_notes(plan), "500000000 elements (1.86 GiB in fp32)"));
  EXPECT_TRUE(any_note_has(lightning_notes(plan), "500000000 elements"));
}

// The measured step's learning rate is constant; the Trainer's default
// schedule ("linear") decays it to 0.
TEST(Writers, HfLearningRateIsConstant) {
  for (const auto& [name, plan] : testing::golden_plans())
    EXPECT_EQ(nlohmann::json::parse(write_hf_training_args(plan))["training_args"]["lr_scheduler_type"], "constant")
        << name;
}

// Under DeepSpeed (offload, bf16_params) the Trainer drops an optimizer
// passed to it (transformers integrations/deepspeed.py deepspeed_init), so
// no note may ask for one; ds_config.json's section carries momentum and
// the implementation.
TEST(Writers, HfNotesNeverPassAnOptimizerTheTrainerDrops) {
  for (const bool offload : {false, true}) {
    Plan sgd = testing::base_plan(4, 2);
    sgd.config.optimizer = OptimizerKind::kSgd;
    sgd.optimizer.momentum = 0.9;
    sgd.config.precision = offload ? Precision::kFp32 : Precision::kBf16Params;
    sgd.config.offload_optimizer = offload;
    Plan single = testing::base_plan(4, 2);
    single.optimizer.implementation = OptimizerImplementation::kSingleTensor;
    single.config.precision = Precision::kBf16Params;
    for (const Plan& plan : {sgd, single}) {
      SCOPED_TRACE(to_string(plan.config));
      EXPECT_FALSE(any_note_has(hf_notes(plan), "optimizers=(optimizer, None)"));
      EXPECT_FALSE(any_note_has(hf_notes(plan), "weight_decay ="));  // DeepSpeed's optimizer decays all
    }
  }
  Plan single = testing::base_plan(4, 2);  // without DeepSpeed the note stands
  single.optimizer.implementation = OptimizerImplementation::kSingleTensor;
  EXPECT_TRUE(any_note_has(hf_notes(single), "optimizers=(optimizer, None)"));
}

// The Trainer's own optimizer leaves biases and norm weights undecayed.
TEST(Writers, HfNotesTheTrainersWeightDecayGroups) {
  Plan plan = testing::base_plan(4, 2);
  EXPECT_TRUE(any_note_has(hf_notes(plan), "but biases and norm weights"));
  plan.optimizer.weight_decay = 0.0;
  EXPECT_FALSE(any_note_has(hf_notes(plan), "but biases and norm weights"));
  plan.optimizer.weight_decay = 0.1;
  plan.config.offload_optimizer = true;  // ds_config.json's optimizer, one group
  EXPECT_FALSE(any_note_has(hf_notes(plan), "but biases and norm weights"));
}

}  // namespace
}  // namespace oomtune
