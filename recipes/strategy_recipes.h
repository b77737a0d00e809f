#pragma once
// How each strategy of the search (search/strategy_table.h) is written in
// each framework's file: the recipe side of a strategy row. The table lives
// here, a layer above the search, because the writers do; the search's rows
// and these rows are matched by Strategy, and the test
// (tests/recipes/strategy_recipes_test.cpp) writes every file for a plan with
// only that strategy on and checks the file says it. A strategy added to the
// search without a row here, or a writer that drops one, fails that test.
//
// A setting a framework cannot express is still written: as the note that
// says how (recipes.h, "nothing is dropped silently"), so an entry may be a
// note's words rather than a key.

#include <array>
#include <string>

#include "search/strategy_table.h"

namespace oomtune {

/// One writer's form of a strategy: the text its file carries when the
/// strategy is on and does not carry when it is off (on a plan of fp32
/// AdamW, no checkpointing, no offload).
struct RecipeForm {
  const char* writer;  ///< RecipeWriter::name: "plan", "deepspeed", "hf", "lightning", "accelerate"
  const char* text;    ///< a key with its value, or the words of the note that says how
};

/// COUNT: writers in recipe_writers() (recipes.h).
inline constexpr std::size_t kNumRecipeWriters = 5;

/// One strategy, in every writer's file.
struct StrategyRecipe {
  Strategy strategy;
  std::array<RecipeForm, kNumRecipeWriters> forms;  // in recipe_writers() order
};

/// The table, in the strategy table's order: strategy_recipes()[i].strategy
/// == Strategy(i). Keys and notes are the ones docs/recipes.md lists per
/// writer, with the framework pages they come from.
const std::array<StrategyRecipe, kNumStrategies>& strategy_recipes();

/// The row of `strategy`.
const StrategyRecipe& recipe_of(Strategy strategy);

}  // namespace oomtune
