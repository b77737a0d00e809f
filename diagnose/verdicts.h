#pragma once
// The verdicts `diagnose` can reach, as one table (like src/commands.cpp's
// subcommands): the id users and JSON see, and the title. verdict_rules.cpp
// decides which apply and writes their evidence; recommendations.cpp asks
// for them by VerdictId, never by string.

#include <cstdint>

namespace oomtune::diagnose {

/// One kind of conclusion (docs/diagnose.md, "Verdicts").
enum class VerdictId : uint8_t {
  kFragmentation,             ///< free memory reserved, but in pieces too small
  kActivationsInForward,      ///< the failing call (or the peak) is in the forward pass
  kBackwardPeak,              ///< ... in the backward pass
  kOptimizerStateAllocation,  ///< ... in the optimizer step
  kLeak,                      ///< a site keeps what it allocates, iteration after iteration
  kCapacity,                  ///< an oom in no recognised phase, not fragmentation
  kMemoryCap,                 ///< CUDA had room: the process's own cap refused the segment
  kInferenceForward,          ///< the failing call is in a forward without autograd (FrameIndex::inference)
  kEvalOutputsAccumulated,    ///< Hugging Face Trainer kept every evaluation step's outputs on the device
  kPrivatePools,              ///< reserved memory sat in private pools (CUDA graphs, MemPool) the request could not use
  kOtherStreams,              ///< free memory sat in segments of other CUDA streams than the request's
};
constexpr int kNumVerdicts = 11;

/// A row of the verdict table.
struct VerdictKind {
  VerdictId id;
  const char* name;   ///< "fragmentation", "activations_in_forward", ... (text and JSON)
  const char* title;  ///< one line for the report
};

/// The row of `id`.
const VerdictKind& verdict_kind(VerdictId id);

/// verdict_kind(id).name.
inline const char* verdict_name(VerdictId id) { return verdict_kind(id).name; }

}  // namespace oomtune::diagnose
