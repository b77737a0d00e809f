// Golden-file tests: every writer's output for every plan in plan_cases.h is
// compared with tests/recipes/golden/<case>/<file>. Regenerate with
// OOMTUNE_UPDATE_GOLDEN=1 and review each changed file by hand against the
// framework docs cited in recipes/recipes.h before committing it.

#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "recipes/plan_toml.h"
#include "recipes/recipes.h"
#include "support/golden_file.h"
#include "tests/recipes/plan_cases.h"

namespace oomtune {
namespace {

class Golden : public ::testing::TestWithParam<std::pair<std::string, Plan>> {};

TEST_P(Golden, EveryWriterMatchesItsGoldenFile) {
  const auto& [name, plan] = GetParam();
  const std::filesystem::path dir = testing::kGoldenDir / name;
  for (const RecipeWriter& writer : recipe_writers()) {
    SCOPED_TRACE(writer.name);
    const std::string actual = writer.write(plan);
    testing::expect_golden_file(dir / writer.file_name, actual);
  }
}

TEST_P(Golden, JsonFilesParseAndCarryTheBatch) {
  const auto& [name, plan] = GetParam();
  const auto ds = nlohmann::json::parse(write_deepspeed_config(plan));
  EXPECT_EQ(ds["train_batch_size"], plan.global_batch);
  EXPECT_EQ(ds["train_micro_batch_size_per_gpu"], plan.config.micro_batch);
  EXPECT_EQ(ds["gradient_accumulation_steps"], plan.config.accumulation_steps);
  const auto hf = nlohmann::json::parse(write_hf_training_args(plan));
  EXPECT_EQ(hf["training_args"]["per_device_train_batch_size"], plan.config.micro_batch);
  EXPECT_EQ(hf["training_args"]["gradient_accumulation_steps"], plan.config.accumulation_steps);
  const auto lightning = nlohmann::json::parse(write_lightning_trainer(plan));
  EXPECT_EQ(lightning["trainer"]["accumulate_grad_batches"], plan.config.accumulation_steps);
  EXPECT_EQ(lightning["datamodule"]["batch_size"], plan.config.micro_batch);
}

TEST_P(Golden, NotesInTheFileAreTheWritersNotes) {
  const auto& [name, plan] = GetParam();
  const auto ds = nlohmann::json::parse(write_deepspeed_config(plan));
  EXPECT_EQ(ds["oomtune_notes"].get<std::vector<std::string>>(), deepspeed_notes(plan));
  const auto hf = nlohmann::json::parse(write_hf_training_args(plan));
  EXPECT_EQ(hf["notes"].get<std::vector<std::string>>(), hf_notes(plan));
  const auto lightning = nlohmann::json::parse(write_lightning_trainer(plan));
  EXPECT_EQ(lightning["notes"].get<std::vector<std::string>>(), lightning_notes(plan));
  const std::string yaml = write_accelerate_config(plan);
  for (const auto& note : accelerate_notes(plan)) EXPECT_NE(yaml.find("# note: " + note), std::string::npos) << note;
}

TEST_P(Golden, GoldenPlanTomlReadsBackToThePlan) {
  const auto& [name, plan] = GetParam();
  if (testing::updating_golden()) GTEST_SKIP() << "updating goldens";
  EXPECT_EQ(read_plan_toml((testing::kGoldenDir / name / kPlanFileName).string()), plan);
}

INSTANTIATE_TEST_SUITE_P(recipes, Golden, ::testing::ValuesIn(testing::golden_plans()),
                         [](const auto& info) { return info.param.first; });

}  // namespace
}  // namespace oomtune
