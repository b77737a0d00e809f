#pragma once
// The rules of Note [Phase need] (phase_need.h) after the trace's, each in
// a file of its own: the optimizer step's (optimizer_need.cpp), the
// forward's blocks with and without autograd (forward_need.cpp), backward's
// blocks and a checkpointed block's recomputation (backward_need.cpp).
// Internal to diagnose/: estimate_need (phase_need.cpp) tries them in the
// Note's order. Each fills `need` and returns true where it applies.

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "diagnose/attribution.h"
#include "diagnose/frames.h"
#include "diagnose/parameter_layout.h"
#include "diagnose/phase_need.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// Bytes of optimizer state first allocated in events [first, end).
int64_t new_state_bytes(const std::vector<TraceEvent>& trace, const Attribution& attr, size_t first, size_t end);

/// Bytes events [first, end) leave above where they began: allocations
/// add their requested bytes, frees subtract theirs.
int64_t net_growth(const std::vector<TraceEvent>& trace, size_t first, size_t end);

/// Bytes of the allocations in events [first, end) that `counted(i)`
/// selects and that were not freed by `end`.
template <typename Counted>
int64_t bytes_alive(const std::vector<TraceEvent>& trace, size_t first, size_t end, Counted counted) {
  std::unordered_map<int64_t, int64_t> alive;  // addr -> bytes
  for (size_t i = first; i < end && i < trace.size(); ++i) {
    const TraceEvent& e = trace[i];
    if (e.action == TraceAction::kAlloc && counted(i))
      alive[e.addr] = e.size;
    else if (e.action == TraceAction::kFreeRequested)
      alive.erase(e.addr);
  }
  int64_t bytes = 0;
  for (const auto& [addr, size] : alive) bytes += size;
  return bytes;
}

/// Note [Phase need] rule 2: a first step's states still to make (where
/// the optimizer makes any), then the temporaries its arithmetic holds at
/// its peak less those alive; a later step's temporaries alone. False
/// where neither is known (no gradients or parameters alive; an optimizer
/// whose first step makes no state, or whose temporaries are not modelled,
/// for a later step).
bool optimizer_step(const NeedQuery& q, const PhaseRun& run, const std::vector<TraceEvent>& trace,
                    const Attribution& attr, const FrameIndex& frames, bool first_step, PhaseNeed& need);

/// Note [Phase need] rule 3: the block pattern of the activations kept so
/// far; the model's blocks and head from `layout` (parameter_layout).
bool forward_blocks(const NeedQuery& q, const PhaseRun& run, const std::vector<TraceEvent>& trace,
                    const Attribution& attr, const FrameIndex& frames, const ParameterLayout& layout, PhaseNeed& need);

/// Note [Phase need] rule 3 for a forward without autograd (Note [Blocks
/// without autograd], forward_need.cpp): the rest of the current block and
/// the blocks after it above their KV cache entries, then a language
/// model's logits.
bool inference_blocks(const NeedQuery& q, const PhaseRun& run, const std::vector<TraceEvent>& trace,
                      const Attribution& attr, const FrameIndex& frames, const ParameterLayout& layout,
                      PhaseNeed& need);

/// Note [Phase need] rule 4 (Note [Blocks in backward], backward_need.cpp):
/// backward past its first block, the previous block's turn repeated for
/// the current block and those after it, then the stem's gradients.
bool backward_blocks(const NeedQuery& q, const PhaseRun& run, const std::vector<TraceEvent>& trace,
                     const Attribution& attr, const FrameIndex& frames, const ParameterLayout& layout, PhaseNeed& need);

/// Note [Phase need] rule 5 (Note [Recomputed block], backward_need.cpp):
/// the failing request recomputes a checkpointed block in backward; the
/// rest of it as the block's first run in forward allocated.
bool recomputed_block(const NeedQuery& q, const PhaseRun& run, const std::vector<TraceEvent>& trace,
                      const Attribution& attr, const FrameIndex& frames, const ParameterLayout& layout,
                      PhaseNeed& need);

}  // namespace oomtune::diagnose
