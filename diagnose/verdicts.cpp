#include "diagnose/verdicts.h"

#include <cstddef>

#include "common/id_table.h"

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
    {VerdictId::kInferenceForward, "inference_forward", "Out of memory in inference (a forward without autograd)"},
    {VerdictId::kEvalOutputsAccumulated, "eval_outputs_accumulated",
     "Evaluation outputs of every step kept on the device"},
    {VerdictId::kPrivatePools, "private_pools",
     "Free memory sat in private pools (CUDA graphs, torch.cuda.MemPool) the request could not use"},
    {VerdictId::kOtherStreams, "other_streams", "Free memory sat in segments of other CUDA streams than the request's"},
};

// The rows follow the enum, so a kind is found by its value.
static_assert(rows_follow_ids(kVerdicts, kNumVerdicts), "kVerdicts: one row per VerdictId, in VerdictId order");

}  // namespace

const VerdictKind& verdict_kind(VerdictId id) { return kVerdicts[static_cast<size_t>(id)]; }

}  // namespace oomtune::diagnose
