#pragma once
// The changes `diagnose` can recommend, as one table: id, what the fix acts
// on, and its cost rank. recommendations.cpp estimates what each frees and
// ranks those that are enough by this cost, least first.
//
// Cost ranks (why, in order): fixing a leak costs nothing at run time, nor
// does moving evaluation outputs to the host every few steps, much (one
// copy of outputs the evaluation moves there at its end anyway); the
// allocator settings cost nothing (expandable_segments), as does a fused
// optimizer (fused=True: one kernel, no foreach temporaries, usually
// faster), or little
// (garbage_collection_threshold returns segments, max_split_size_mb can
// slow allocation, pytorch PR #113481); 8-bit AdamW costs a little
// precision of the optimizer state; half the micro-batch with twice the
// accumulation keeps the global batch but runs more, smaller steps;
// activation checkpointing recomputes the forward (+24% to +48% step
// time, docs/checkpointing.md), and so, about, does running without CUDA
// graphs (each kernel launched from the host again); offloading the optimizer moves its states
// and step to the host every step (the slowest). Allocating a side stream's
// tensors on the stream that uses them costs no run time, only a change
// of code: ranked after the allocator settings and a fused optimizer, which
// need none.

#include <cstdint>

namespace oomtune::diagnose {

/// One kind of change.
enum class FixId : uint8_t {
  kFixLeak,
  kExpandableSegments,
  kGarbageCollection,
  kMaxSplitSize,
  kAdamW8bit,
  kMicroBatch,
  kActivationCheckpointing,
  kOptimizerOffload,
  kCombined,          ///< several of the above together
  kMemoryCap,         ///< raise the process's cap: frees nothing, the budget grows
  kConflict,          ///< remove max_split_size_mb beside expandable_segments
  kRecordMore,        ///< a better snapshot next time
  kCheckpointingOn,   ///< activation checkpointing is already on: nothing to turn on
  kEvalAccumulation,  ///< Hugging Face eval_accumulation_steps: evaluation outputs to the CPU every K steps
  kFusedOptimizer,    ///< fused=True: the optimizer's arithmetic without the foreach implementation's temporaries
  kPrivatePools,      ///< no CUDA graphs (or their pools freed): their private pools' free memory usable again
  kOtherStreams,      ///< a side stream's tensors made on the stream that uses them: its cached blocks serve all
};
constexpr int kNumFixes = 17;

/// What a fix reduces; fixes of one target are alternatives, not added up.
enum class FixTarget : uint8_t {
  kLeak,
  kFragmentation,
  kActivations,
  kOptimizerState,
  kEvalOutputs,
  kPrivatePools,
  kNone
};

/// A row of the fix table.
struct FixKind {
  FixId id;
  const char* name;   ///< "expandable_segments", "adamw_8bit", ... (text and JSON)
  const char* label;  ///< short, for combinations: "8-bit AdamW + expandable_segments"
  FixTarget target;
  int cost;  ///< rank, 0 = cheapest (see the list above)
};

/// The row of `id`.
const FixKind& fix_kind(FixId id);

/// fix_kind(id).name.
inline const char* fix_name(FixId id) { return fix_kind(id).name; }

}  // namespace oomtune::diagnose
