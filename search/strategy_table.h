#pragma once
// The strategy table: one row per memory-saving strategy the search can turn
// on, as src/commands.cpp has one row per subcommand. The memory model
// (memory_model.h) keeps one measured effect per row, and the search
// (search_state.h and its files) probes, rescues and walks by looping over the rows.
//
// Rules:
// - A row says how the strategy changes a TrainingConfig (turn_on), whether
//   a configuration uses it beyond a reference one (used), how many probe
//   sizes its effect needs (one when it changes only memory that does not
//   grow with the micro-batch, such as optimizer state; two when it changes
//   the activations per sample), which rows it cannot be on with
//   (excludes), whether the job lets the search try it (allowed), and
//   whether it may be part of a rescue combination (Note [Rescue] in
//   rescue.cpp).
// - Rows in the tree's order: checkpointing, 8-bit AdamW, optimizer
//   offload, bf16, Adafactor. The rescue tries combinations in this order
//   (fewest strategies first), the walk adds nodes in it, and the ties of
//   the verification (search.h, Ties) count one per row used.
// - Rows that only add work (only_adds_work: checkpointing recomputes,
//   offload moves the optimizer step to the CPU) can be removed again
//   (turn_off): the search compares a configuration with the same one
//   without them.
// - Optimizer rows (optimizer_state) replace where or how the optimizer
//   keeps its state; the walk pairs each with bf16 (Note [Pairs]).
// - Activation checkpointing keeps its own probe (a refused block class is
//   retried without it) and its own nodes (selective checkpointing); bf16
//   keeps its fallback form (Note [bf16 fallback]). Both are rows all the
//   same: the memory model, the rescue and the counts read them as any row.
// How each row is written in each framework's file is the recipe side of the
// row: recipes/strategy_recipes.h, a layer above (its test fails for a row
// without one). No libtorch: the strategies' code that runs a step is in
// training_step.cpp.

#include <array>
#include <bitset>
#include <cstddef>
#include <initializer_list>
#include <string>

#include "job/job_spec.h"
#include "strategies/training_config.h"

namespace oomtune {

/// The strategies the search turns on, in the tree's order (the index of a
/// row in strategy_table()).
enum class Strategy : std::size_t { kCheckpointing, kAdamW8bit, kOffload, kBf16, kAdafactor };

/// COUNT: rows of the strategy table.
inline constexpr std::size_t kNumStrategies = 5;

/// A set of strategies, bit i for Strategy i.
using StrategySet = std::bitset<kNumStrategies>;

/// What turning a strategy on depends on in one search.
struct StrategyContext {
  CheckpointPlan checkpoint_all;                        // what "all blocks" checkpoints (fewer after a refused class)
  Precision bf16_form = Precision::kBf16;               // bf16 autocast, or bf16 parameters after a fallback
  OptimizerKind job_optimizer = OptimizerKind::kAdamW;  // what optimizer offload offloads
};

/// One strategy of the search.
struct StrategyRow {
  Strategy id;
  /// In the search's notes about its probe: "activation checkpointing".
  const char* probe_name;
  /// In node names and rescue labels: "8-bit AdamW"; bf16 names its form.
  std::string (*node_name)(const StrategyContext& context);
  /// COUNT: probe sizes its effect is fitted to (1 or 2).
  int probe_sizes;
  /// Whether `config` uses the strategy where `reference` does not (the
  /// reference matters for precision only: bf16 is "a precision other than
  /// the base's"; the others are judged on `config` alone).
  bool (*used)(const TrainingConfig& config, const TrainingConfig& reference);
  /// Turns the strategy on in `config`.
  void (*turn_on)(TrainingConfig& config, const StrategyContext& context);
  /// Whether the job lets the search try it on `base` (the configuration
  /// the strategies build on: the job's, or a rescued one).
  bool (*allowed)(const JobSpec& job, const TrainingConfig& base);
  /// Strategies it is never on together with.
  StrategySet excludes;
  /// Changes the optimizer state (its form or its place): paired with bf16.
  bool optimizer_state;
  /// May be part of a rescue combination (Note [Rescue]).
  bool rescue;
  /// How the updates differ from the job optimizer's (a format string
  /// whose {} is that optimizer's name), or nullptr where they do not.
  const char* changes_updates;
  /// The work a strategy that only adds work adds, as the subject of "...
  /// cannot make a step faster" ("recomputation"), or nullptr for one that
  /// can make a step faster (bf16, another optimizer). Such a strategy is
  /// never predicted, nor counted when verified, faster than the same
  /// configuration without it (search.h, Rules: Work added).
  const char* only_adds_work;
  /// Removes the strategy from `config`, for the rows with only_adds_work
  /// (nullptr for the others): checkpointing none; offload keeps the
  /// optimizer turn_on chose, on the device.
  void (*turn_off)(TrainingConfig& config);
};

/// The table, in the tree's order: strategy_table()[i].id == Strategy(i).
const std::array<StrategyRow, kNumStrategies>& strategy_table();

/// The set of `strategies`.
StrategySet strategy_set(std::initializer_list<Strategy> strategies);

/// The row of `strategy`.
const StrategyRow& row_of(Strategy strategy);

/// The strategies `config` uses beyond `reference` (StrategyRow::used).
StrategySet strategies_used(const TrainingConfig& config, const TrainingConfig& reference);

/// Whether `set` holds two strategies that exclude each other.
bool conflicting(StrategySet set);

/// `base` with every strategy of `set` turned on, in table order.
TrainingConfig with_strategies(TrainingConfig base, StrategySet set, const StrategyContext& context);

/// "checkpointing (all blocks) + optimizer offload": the node names of
/// `set`, in table order, joined by " + " ("" for none).
std::string strategies_label(StrategySet set, const StrategyContext& context);

}  // namespace oomtune
