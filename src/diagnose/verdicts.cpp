#include "diagnose/verdicts.h"

namespace oomtune::diagnose {
namespace {

constexpr VerdictKind kVerdicts[kNumVerdicts] = {
    {VerdictId::kFragmentation, "fragmentation", "Fragmentation: free memory is reserved but in pieces too small"},
    {VerdictId::kActivationsInForward, "activations_in_forward", "Activations in the forward pass"},
    {VerdictId::kBackwardPeak, "backward_peak", "Peak in the backward pass"},
    {VerdictId::kOptimizerStateAllocation, "optimizer_state_allocation",
     "Optimizer state allocated in the optimizer step"},
    {VerdictId::kLeak, "leak", "Memory leak across iterations"},
    {VerdictId::kCapacity, "capacity", "The request did not fit"},
    {VerdictId::kMemoryCap, "memory_cap", "The process's memory cap was the limit, not the device"},
};

}  // namespace

const VerdictKind& verdict_kind(VerdictId id) {
  for (const VerdictKind& k : kVerdicts) {
    if (k.id == id) return k;
  }
  return kVerdicts[0];  // unreachable: every VerdictId has a row (fixes_test checks)
}

}  // namespace oomtune::diagnose
