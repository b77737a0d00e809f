#pragma once
// How a model's parameters lie in a snapshot's trace: its blocks, the stem
// before them and what follows (Note [Blocks from the parameters], Note
// [Blocks from loaded weights], parameter_layout.cpp). Read by the forward
// and backward rules of Note [Phase need] (need_rules.h).

#include <algorithm>
#include <cstdint>
#include <vector>

#include "diagnose/attribution.h"
#include "diagnose/frames.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// How the model's parameters lie, from their allocations (Note [Blocks
/// from the parameters]): its blocks (0 when they show none), the bytes of
/// the parameters before the first block (its stem: embeddings) and, for
/// Note [A language model's head], the stem's largest parameter (the token
/// embedding, vocabulary x d) and its depth in the model where it was
/// moved with .to() (FrameIndex::module_apply_depth; 0 where made on the
/// device), one block's parameter sizes, the most common first (the
/// smaller on a tie), and the parameters after the blocks (the final norm,
/// a head), in allocation order: their sizes and depths.
struct ParameterLayout {
  bool loaded = false;  ///< Note [Blocks from loaded weights]: from the sizes' counts, not their order
  int64_t blocks = 0;
  int64_t block_bytes = 0;  ///< one block's parameters
  int64_t stem_bytes = 0;
  int64_t embedding_bytes = 0;
  int embedding_depth = 0;
  std::vector<int64_t> block_sizes_by_count;
  std::vector<int64_t> tail_sizes;
  std::vector<int> tail_depths;
  /// A parameter after the blocks of the embedding's size was freed: the
  /// head's weight, replaced by the embedding's when tied to it.
  bool head_weight_freed = false;

  /// A head of the embedding's size of its own after the blocks.
  bool has_head_weight() const {
    return embedding_bytes > 0 && std::find(tail_sizes.begin(), tail_sizes.end(), embedding_bytes) != tail_sizes.end();
  }
  /// Moved with .to() and nothing after the blocks shallower than the
  /// embedding: no head of its own (Note [A language model's head]).
  bool moved_without_head() const {
    return embedding_depth > 0 && !tail_depths.empty() && !has_head_weight() &&
           std::all_of(tail_depths.begin(), tail_depths.end(), [&](int depth) { return depth >= embedding_depth; });
  }
  /// The head's weight is the embedding's (Note [Blocks in backward]).
  bool head_tied() const { return head_weight_freed || moved_without_head(); }
};

/// The layout of the parameters allocated in `trace` (those `attribution`
/// calls parameters); empty (no blocks) where they show none or were made
/// before recording began.
ParameterLayout parameter_layout(const std::vector<TraceEvent>& trace, const Attribution& attribution,
                                 const FrameIndex& frames);

}  // namespace oomtune::diagnose
