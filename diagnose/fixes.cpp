#include "diagnose/fixes.h"

#include <cstddef>

#include "common/id_table.h"

namespace oomtune::diagnose {
namespace {

constexpr FixKind kFixes[kNumFixes] = {
    {FixId::kFixLeak, "fix_leak", "fixing the leak", FixTarget::kLeak, 0},
    {FixId::kExpandableSegments, "expandable_segments", "expandable_segments", FixTarget::kFragmentation, 1},
    {FixId::kGarbageCollection, "garbage_collection", "garbage_collection_threshold", FixTarget::kFragmentation, 2},
    {FixId::kMaxSplitSize, "max_split_size", "max_split_size_mb", FixTarget::kFragmentation, 3},
    {FixId::kAdamW8bit, "adamw_8bit", "8-bit AdamW", FixTarget::kOptimizerState, 4},
    {FixId::kMicroBatch, "micro_batch", "half the micro-batch", FixTarget::kActivations, 5},
    {FixId::kActivationCheckpointing, "activation_checkpointing", "activation checkpointing", FixTarget::kActivations,
     6},
    {FixId::kOptimizerOffload, "optimizer_offload", "optimizer offload", FixTarget::kOptimizerState, 7},
    {FixId::kCombined, "combined", "combined", FixTarget::kNone, 8},
    {FixId::kMemoryCap, "memory_cap", "a larger memory cap", FixTarget::kNone, 9},
    {FixId::kConflict, "conflict", "no max_split_size_mb", FixTarget::kNone, 10},
    {FixId::kRecordMore, "record_more", "a better snapshot", FixTarget::kNone, 11},
    {FixId::kCheckpointingOn, "activation_checkpointing_on", "activation checkpointing (on)", FixTarget::kNone, 12},
    {FixId::kEvalAccumulation, "eval_accumulation_steps", "eval_accumulation_steps", FixTarget::kEvalOutputs, 0},
    {FixId::kFusedOptimizer, "fused_optimizer", "fused=True", FixTarget::kOptimizerState, 1},
    {FixId::kPrivatePools, "private_pools", "no CUDA graphs", FixTarget::kPrivatePools, 6},
    {FixId::kOtherStreams, "other_streams", "one stream's memory", FixTarget::kFragmentation, 3},
};

// The rows follow the enum, so a kind is found by its value.
static_assert(rows_follow_ids(kFixes, kNumFixes), "kFixes: one row per FixId, in FixId order");

}  // namespace

const FixKind& fix_kind(FixId id) { return kFixes[static_cast<size_t>(id)]; }

}  // namespace oomtune::diagnose
