// The strategy table's rows against the rules of search/strategy_table.h,
// each expectation written out by hand.

#include "search/strategy_table.h"

#include <gtest/gtest.h>

namespace oomtune {
namespace {

TEST(StrategyTable, RowsAreInTheTreesOrderAndIndexedByTheirStrategy) {
  const auto& table = strategy_table();
  ASSERT_EQ(table.size(), kNumStrategies);
  for (std::size_t i = 0; i < table.size(); ++i) EXPECT_EQ(table[i].id, static_cast<Strategy>(i)) << i;
  EXPECT_STREQ(row_of(Strategy::kCheckpointing).probe_name, "activation checkpointing");
  EXPECT_STREQ(row_of(Strategy::kAdafactor).probe_name, "Adafactor");
  // Activations change with checkpointing and bf16 (two probe sizes);
  // the optimizer rows change state only (one).
  EXPECT_EQ(row_of(Strategy::kCheckpointing).probe_sizes, 2);
  EXPECT_EQ(row_of(Strategy::kBf16).probe_sizes, 2);
  EXPECT_EQ(row_of(Strategy::kAdamW8bit).probe_sizes, 1);
  EXPECT_EQ(row_of(Strategy::kOffload).probe_sizes, 1);
  EXPECT_EQ(row_of(Strategy::kAdafactor).probe_sizes, 1);
}

TEST(StrategyTable, ExclusionsAreMutual) {
  for (const StrategyRow& a : strategy_table())
    for (const StrategyRow& b : strategy_table())
      EXPECT_EQ(a.excludes.test(static_cast<std::size_t>(b.id)), b.excludes.test(static_cast<std::size_t>(a.id)))
          << a.probe_name << " / " << b.probe_name;
  EXPECT_TRUE(conflicting(strategy_set({Strategy::kAdamW8bit, Strategy::kOffload})));
  EXPECT_TRUE(conflicting(strategy_set({Strategy::kAdafactor, Strategy::kAdamW8bit})));
  EXPECT_TRUE(conflicting(strategy_set({Strategy::kAdafactor, Strategy::kOffload, Strategy::kBf16})));
  EXPECT_FALSE(conflicting(strategy_set({Strategy::kCheckpointing, Strategy::kOffload, Strategy::kBf16})));
  EXPECT_FALSE(conflicting(strategy_set({Strategy::kAdafactor, Strategy::kBf16, Strategy::kCheckpointing})));
}

TEST(StrategyTable, TurningRowsOnGivesTheConfigurationTheyAreSeenIn) {
  StrategyContext context;
  context.checkpoint_all.mode = CheckpointPlan::Mode::kPaths;
  context.checkpoint_all.paths = {"blocks.1"};
  context.bf16_form = Precision::kBf16Params;
  context.job_optimizer = OptimizerKind::kAdamW;
  TrainingConfig base;
  base.optimizer = OptimizerKind::kAdamW8bit;  // a rescued 8-bit base: offload puts the job's AdamW back
  const TrainingConfig c =
      with_strategies(base, strategy_set({Strategy::kCheckpointing, Strategy::kOffload, Strategy::kBf16}), context);
  EXPECT_EQ(c.checkpoint, context.checkpoint_all);
  EXPECT_TRUE(c.offload_optimizer);
  EXPECT_EQ(c.optimizer, OptimizerKind::kAdamW);
  EXPECT_EQ(c.precision, Precision::kBf16Params);
  TrainingConfig fp32;
  EXPECT_EQ(strategies_used(c, fp32), strategy_set({Strategy::kCheckpointing, Strategy::kOffload, Strategy::kBf16}));
  // bf16 is "another precision than the reference's": none on a bf16 base.
  TrainingConfig bf16_base;
  bf16_base.precision = Precision::kBf16Params;
  EXPECT_EQ(strategies_used(c, bf16_base), strategy_set({Strategy::kCheckpointing, Strategy::kOffload}));
  EXPECT_EQ(strategies_label(strategy_set({Strategy::kCheckpointing, Strategy::kOffload, Strategy::kBf16}), context),
            "checkpointing (all blocks) + optimizer offload + bf16 parameters");
  EXPECT_EQ(strategies_label({}, context), "");
}

TEST(StrategyTable, TheJobAllowsEachRowOnItsBase) {
  JobSpec job;
  TrainingConfig adamw;
  EXPECT_TRUE(row_of(Strategy::kAdamW8bit).allowed(job, adamw));
  EXPECT_FALSE(row_of(Strategy::kBf16).allowed(job, adamw));       // opt-in: allow_bf16
  EXPECT_FALSE(row_of(Strategy::kAdafactor).allowed(job, adamw));  // opt-in: allow_adafactor
  job.allow_bf16 = job.allow_adafactor = true;
  EXPECT_TRUE(row_of(Strategy::kBf16).allowed(job, adamw));
  EXPECT_TRUE(row_of(Strategy::kAdafactor).allowed(job, adamw));
  TrainingConfig sgd;
  sgd.optimizer = OptimizerKind::kSgd;
  EXPECT_FALSE(row_of(Strategy::kAdamW8bit).allowed(job, sgd));
  EXPECT_FALSE(row_of(Strategy::kAdafactor).allowed(job, sgd));
  TrainingConfig offloaded;
  offloaded.offload_optimizer = true;
  EXPECT_FALSE(row_of(Strategy::kOffload).allowed(job, offloaded));
  EXPECT_FALSE(row_of(Strategy::kAdamW8bit).allowed(job, offloaded));
  // Only Adafactor stays out of the rescue (Note [Rescue], search/rescue.cpp).
  for (const StrategyRow& row : strategy_table())
    EXPECT_EQ(row.rescue, row.id != Strategy::kAdafactor) << row.probe_name;
}

}  // namespace
}  // namespace oomtune
