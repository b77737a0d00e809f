#include "search/strategy_table.h"

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

namespace oomtune {
namespace {

// An optimizer that replaces the job's AdamW: only on an AdamW base whose
// state stays on the device (offload moves full-precision Adam: the
// frameworks' CPU optimizers are Adam-family).
bool replaces_adamw(const TrainingConfig& base) {
  return base.optimizer == OptimizerKind::kAdamW && !base.offload_optimizer;
}

const std::array<StrategyRow, kNumStrategies> kTable = {{
    {Strategy::kCheckpointing,
     "activation checkpointing",
     [](const StrategyContext&) -> std::string { return "checkpointing (all blocks)"; },
     2,
     [](const TrainingConfig& c, const TrainingConfig&) { return c.checkpoint.enabled(); },
     [](TrainingConfig& c, const StrategyContext& context) { c.checkpoint = context.checkpoint_all; },
     [](const JobSpec&, const TrainingConfig& base) { return !base.checkpoint.enabled(); },
     {},
     /*optimizer_state=*/false,
     /*rescue=*/true,
     nullptr,
     "recomputation",
     [](TrainingConfig& c) { c.checkpoint = CheckpointPlan{}; }},
    {Strategy::kAdamW8bit, "8-bit AdamW", [](const StrategyContext&) -> std::string { return "8-bit AdamW"; }, 1,
     [](const TrainingConfig& c, const TrainingConfig&) { return c.optimizer == OptimizerKind::kAdamW8bit; },
     [](TrainingConfig& c, const StrategyContext&) { c.optimizer = OptimizerKind::kAdamW8bit; },
     [](const JobSpec&, const TrainingConfig& base) { return replaces_adamw(base); },
     strategy_set({Strategy::kOffload, Strategy::kAdafactor}), /*optimizer_state=*/true, /*rescue=*/true,
     "quantized optimizer states: close to, not equal to, {}'s updates", nullptr, nullptr},
    {Strategy::kOffload, "optimizer offload", [](const StrategyContext&) -> std::string { return "optimizer offload"; },
     1, [](const TrainingConfig& c, const TrainingConfig&) { return c.offload_optimizer; },
     // The job's optimizer, in place of a rescued 8-bit AdamW (the
     // frameworks offload full-precision Adam).
     [](TrainingConfig& c, const StrategyContext& context) {
       c.optimizer = context.job_optimizer;
       c.offload_optimizer = true;
     },
     [](const JobSpec&, const TrainingConfig& base) { return !base.offload_optimizer; },
     strategy_set({Strategy::kAdamW8bit, Strategy::kAdafactor}), /*optimizer_state=*/true, /*rescue=*/true, nullptr,
     // On a GPU the step copies the gradients to the host and the updated
     // parameters back, and the update runs on the CPU (ZeRO-Offload, Ren et
     // al., USENIX ATC 2021: strategies/master_weights.h); on the CPU backend
     // its "host" is the same memory, so a measured difference is noise.
     "an optimizer step on the CPU", [](TrainingConfig& c) { c.offload_optimizer = false; }},
    {Strategy::kBf16,
     "bf16 autocast",
     [](const StrategyContext& context) -> std::string {
       return context.bf16_form == Precision::kBf16 ? "bf16" : "bf16 parameters";
     },
     2,
     [](const TrainingConfig& c, const TrainingConfig& reference) { return c.precision != reference.precision; },
     [](TrainingConfig& c, const StrategyContext& context) { c.precision = context.bf16_form; },
     [](const JobSpec& job, const TrainingConfig& base) {
       return job.allow_bf16 && base.precision == Precision::kFp32;
     },
     {},
     /*optimizer_state=*/false,
     /*rescue=*/true,
     nullptr,
     nullptr,
     nullptr},
    {Strategy::kAdafactor, "Adafactor", [](const StrategyContext&) -> std::string { return "Adafactor"; }, 1,
     [](const TrainingConfig& c, const TrainingConfig&) { return c.optimizer == OptimizerKind::kAdafactor; },
     [](TrainingConfig& c, const StrategyContext&) { c.optimizer = OptimizerKind::kAdafactor; },
     [](const JobSpec& job, const TrainingConfig& base) { return job.allow_adafactor && replaces_adamw(base); },
     strategy_set({Strategy::kAdamW8bit, Strategy::kOffload}), /*optimizer_state=*/true, /*rescue=*/false,
     "no momentum and a factored second moment: not {}'s updates; compare the loss curve before relying on it", nullptr,
     nullptr},
}};

}  // namespace

StrategySet strategy_set(std::initializer_list<Strategy> strategies) {
  StrategySet set;
  for (Strategy s : strategies) set.set(static_cast<std::size_t>(s));
  return set;
}

const std::array<StrategyRow, kNumStrategies>& strategy_table() { return kTable; }

const StrategyRow& row_of(Strategy strategy) { return kTable[static_cast<std::size_t>(strategy)]; }

StrategySet strategies_used(const TrainingConfig& config, const TrainingConfig& reference) {
  StrategySet set;
  for (const StrategyRow& row : kTable)
    if (row.used(config, reference)) set.set(static_cast<std::size_t>(row.id));
  return set;
}

bool conflicting(StrategySet set) {
  for (const StrategyRow& row : kTable)
    if (set.test(static_cast<std::size_t>(row.id)) && (set & row.excludes).any()) return true;
  return false;
}

TrainingConfig with_strategies(TrainingConfig base, StrategySet set, const StrategyContext& context) {
  for (const StrategyRow& row : kTable)
    if (set.test(static_cast<std::size_t>(row.id))) row.turn_on(base, context);
  return base;
}

std::string strategies_label(StrategySet set, const StrategyContext& context) {
  std::vector<std::string> parts;
  for (const StrategyRow& row : kTable)
    if (set.test(static_cast<std::size_t>(row.id))) parts.push_back(row.node_name(context));
  return fmt::format("{}", fmt::join(parts, " + "));
}

}  // namespace oomtune
