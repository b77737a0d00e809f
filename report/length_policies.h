#pragma once
// LengthPolicies: what variable sequence lengths do to the CUDA caching
// allocator over a run, as `oomtune probe` reports it for a job with a
// length distribution (issue #47 item 2; docs/sequence_length.md, "Variable
// lengths"). The step's events fitted in T (allocsim/length_model.h) are
// replayed for many steps at lengths drawn from the job's distribution
// (job/length_distribution.h, with the job's seed): as drawn, with
// expandable_segments, padded to multiples of kPaddingMultiples and to a
// power of two (allocsim/length_replay.h); one of them is recommended
// (allocsim::recommended_policy). Its renderers (text lines, JSON). No
// libtorch.
//
// Limitations: one micro-batch per step (an accumulated step's later
// micro-batches also hold the gradients); the persistent allocations are
// those of the trial that recorded the events; no other process on the GPU.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "allocsim/length_model.h"
#include "allocsim/length_replay.h"
#include "job/length_distribution.h"

namespace oomtune {

/// COUNT: the steps replayed unless the probe is told otherwise
/// (`--replay-steps`): enough for reserved to stop growing in the issue's
/// example (uniform 256–1024 reaches its peak within the first tens of steps,
/// bench/lengths).
constexpr int64_t kDefaultReplaySteps = 100;

/// COUNT: tokens; the bucket multiples compared besides a power of two: 64
/// (tensor-core friendly shapes, what HF's pad_to_multiple_of is usually
/// given) and 256.
constexpr std::array<int64_t, 2> kPaddingMultiples = {64, 256};

/// The policies compared for one variable-length job.
struct LengthPolicies {
  std::string distribution;                      // "uniform 256-1024" or "histogram FILE (N lengths, MIN-MAX)"
  std::uint64_t seed = 0;                        // the job's seed the lengths were drawn with
  int64_t steps = 0;                             // COUNT: steps replayed
  int64_t micro_batch = 0;                       // COUNT: samples per replayed step (the events' micro-batch)
  std::optional<int64_t> budget_bytes;           // SUM: the usable budget the simulator enforced, if any
  std::vector<allocsim::LengthPolicy> policies;  // in compare_length_policies' order
  std::size_t recommended = 0;                   // index into policies
};

/// Draws `steps` lengths from `lengths` with `seed` and replays `step` (its
/// events at `micro_batch`) after `persistent_bytes` under each policy, the
/// simulator enforcing `budget_bytes` when given. Throws InputError as
/// draw_lengths and replay_lengths do (a step that is not steady: carries
/// that do not balance) and for steps < 1.
LengthPolicies replay_length_policies(const allocsim::LengthModel& step, const std::vector<int64_t>& persistent_bytes,
                                      const LengthDistribution& lengths, const std::string& description,
                                      std::uint64_t seed, int64_t steps, int64_t micro_batch,
                                      std::optional<int64_t> budget_bytes);

/// What a user changes to run `policy`: "nothing (lengths as they come)",
/// "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "pad each batch to a
/// multiple of N tokens (DataCollatorWithPadding(..., pad_to_multiple_of=N))",
/// "pad each batch to the next power of two".
std::string policy_change(const allocsim::LengthPolicy& policy);

/// The text lines (each ending in "\n").
std::string render_length_policies_text(const LengthPolicies& p);
/// JSON with the same numbers; units in the key names.
nlohmann::json length_policies_json(const LengthPolicies& p);

}  // namespace oomtune
