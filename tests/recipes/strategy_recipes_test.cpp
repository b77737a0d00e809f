// Every strategy of the search is written by every writer (recipes/
// strategy_recipes.h): a plan with only that strategy on carries its form in
// each file, and the plan without it does not. The plans are made by the
// strategy table's own turn_on, as the search makes them.

#include <gtest/gtest.h>

#include "recipes/recipes.h"
#include "recipes/strategy_recipes.h"
#include "search/strategy_table.h"
#include "tests/recipes/plan_cases.h"

namespace oomtune {
namespace {

StrategyContext context() {
  StrategyContext c;
  c.checkpoint_all.mode = CheckpointPlan::Mode::kAll;
  return c;
}

TEST(StrategyRecipes, RowsFollowTheStrategyTableAndTheWriterTable) {
  ASSERT_EQ(recipe_writers().size(), kNumRecipeWriters);
  for (std::size_t i = 0; i < kNumStrategies; ++i) {
    EXPECT_EQ(strategy_recipes()[i].strategy, strategy_table()[i].id) << "row " << i;
    for (std::size_t w = 0; w < kNumRecipeWriters; ++w)
      EXPECT_STREQ(strategy_recipes()[i].forms[w].writer, recipe_writers()[w].name);
  }
}

TEST(StrategyRecipes, EachWriterSaysEachStrategyWhereTheBaseDoesNot) {
  const Plan base = testing::base_plan(8, 4);
  for (const StrategyRow& row : strategy_table()) {
    Plan plan = base;
    plan.config = with_strategies(base.config, strategy_set({row.id}), context());
    for (std::size_t w = 0; w < kNumRecipeWriters; ++w) {
      const RecipeWriter& writer = recipe_writers()[w];
      const RecipeForm& form = recipe_of(row.id).forms[w];
      const std::string with = writer.write(plan);
      const std::string without = writer.write(base);
      EXPECT_NE(with.find(form.text), std::string::npos)
          << row.probe_name << " in " << writer.file_name << ": no \"" << form.text << "\" in\n"
          << with;
      EXPECT_EQ(without.find(form.text), std::string::npos)
          << row.probe_name << " in " << writer.file_name << ": \"" << form.text << "\" also without it";
    }
  }
}

}  // namespace
}  // namespace oomtune
