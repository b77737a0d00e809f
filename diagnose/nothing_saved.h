#pragma once
// Note [Blocks that kept nothing]
// Rationale: a forward run under `with torch.no_grad():` or
// `with torch.inference_mode():` leaves no frame (only their use as a
// decorator does, frames.h), so its out-of-memory read as a training
// forward's: "activations kept for backward", activation checkpointing
// first, which frees nothing where nothing is saved for backward.
// Approach: under autograd every block of a model keeps what its operators
// save for backward (a linear's input, a softmax's output, a norm's input)
// until backward runs. Without autograd a block frees all it allocates but
// its output, which the next block reads and frees in turn; a KV cache's
// entries stay (FrameIndex::stores_kv_cache). So in the failing forward
// run's allocations (the last kMaxAllocations before the out-of-memory,
// each keyed by its layer frame and requested bytes), the period p >= 2
// whose longest stretch of key[j] == key[j - p] covers the most
// allocations, at least two and a half periods, is the model's block (the
// smallest such p on a tie). The stretch's allocations but its last two
// periods (the last complete block, whose output the current block reads,
// and the current one) are the earlier blocks'. When they span two layer
// frames or more and every one of them outside a KV cache was freed before
// the out-of-memory, the blocks kept nothing for backward. Half a block is
// enough of the earliest: GPT-2's no_grad forward recorded on an H200 ran
// out of memory 21 of 23 allocations into its third block, where the CPU's
// recording of it had reached the fourth (2026-12-04).
// Limitations: it needs two and a half blocks' worth of allocations before
// the failure (an out-of-memory earlier keeps the training reading); a
// block that keeps a tensor of its own without autograd (a KV
// cache the model builds itself, as transformers before 5.0 did with the
// key and value it computed; `output_hidden_states=True`; a skip
// connection to a later block) shows no evidence. Blocks whose parameters
// do not require gradients (a frozen backbone) keep nothing under autograd
// too: then checkpointing frees nothing either, as the verdict says. A
// forward under torch.utils.checkpoint is never read this way (its blocks
// keep their inputs).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "diagnose/attribution.h"
#include "diagnose/frames.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// The evidence of Note [Blocks that kept nothing]; all zero when there is none.
struct NothingSaved {
  int64_t block_allocations = 0;  ///< COUNT: allocations in one block (the period)
  int64_t freed_allocations = 0;  ///< COUNT: the earlier blocks' allocations outside a KV cache, all freed
  int64_t freed_bytes = 0;        ///< SUM: their requested bytes
  int64_t first_event = -1;       ///< trace index of the first of them
  int64_t last_event = -1;        ///< trace index of the last of them
  /// Trace indices of the first allocation of each period of the stretch,
  /// oldest first: the earlier blocks', the last complete one's and, where
  /// the current block has allocated before the failure, the current one's
  /// (then stretch_allocations is no multiple of block_allocations).
  std::vector<int64_t> block_first_events;
  int64_t stretch_allocations = 0;  ///< COUNT: allocations in the stretch of blocks
  bool found() const { return freed_allocations > 0; }
};

/// Whether the forward run that the out-of-memory at trace index
/// `oom_event` ends kept nothing in its earlier blocks (Note [Blocks that
/// kept nothing]). The run is the forward allocations before it, back to
/// the first allocation of another phase (attr.event_phase) or an earlier
/// out-of-memory. O(kMaxAllocations^2 / 3) at most; throws nothing.
NothingSaved blocks_kept_nothing(const std::vector<TraceEvent>& trace, const Attribution& attr,
                                 const FrameIndex& frames, size_t oom_event);

}  // namespace oomtune::diagnose
