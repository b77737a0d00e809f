#pragma once
// A run of many training steps at varying sequence lengths through the
// caching-allocator simulator (issue #47, item 2): what variable lengths do
// to reserved memory, and what expandable segments or padding to buckets
// would do instead.
//
// Why it matters: each length asks for blocks of other sizes; the caching
// allocator keeps the blocks of earlier steps cached and splits them only
// within its rules (allocsim/caching_allocator_sim.h), so a long step after
// short ones cudaMallocs new segments while the old ones stay reserved.
// Reserved grows well past allocated; with one fixed length the same blocks
// are reused every step. Measured on an H100 (issue #47): a GPT of ~135 M
// parameters at batch 8, lengths uniform in 256–1024, reserved 15.8 GiB for
// 8.9 GiB allocated (1.77×); at a fixed length near 1.05×.
//
// Rules:
// - Before the first step the persistent allocations (parameters, buffers,
//   optimizer state: `persistent_bytes`) are made and never freed.
// - Each step is LengthModel::at(length); its carried-out allocations
//   (gradients kept for the next step) are freed at the next step's
//   carried-in frees, k-th by k-th; the first step's carried-in frees free
//   nothing (the run's first step has no earlier gradients).
// - reserved_over_allocated = peak reserved / peak allocated over the run.
// No libtorch.

#include <cstdint>
#include <string>
#include <vector>

#include "allocsim/bucketing.h"
#include "allocsim/caching_allocator_sim.h"
#include "allocsim/length_model.h"

namespace oomtune::allocsim {

/// One step of a run.
struct LengthStep {
  int64_t length = 0;                ///< COUNT: tokens the step ran at (after padding)
  int64_t peak_allocated_bytes = 0;  ///< SUM: the step's peak allocated (block sizes)
  int64_t peak_reserved_bytes = 0;   ///< SUM: reserved at its highest in the step
  int64_t reserved_bytes = 0;        ///< SUM: reserved when the step ended
  int64_t device_allocs = 0;         ///< COUNT: cudaMalloc calls (page maps) in the step
  int64_t alloc_retries = 0;         ///< COUNT: cache flushes in the step
  bool oom = false;                  ///< a request of the step ran out of memory
};

/// A whole run.
struct LengthRun {
  std::vector<LengthStep> steps;
  SimResult totals;  ///< the simulator's statistics over the run
  /// Peak reserved / peak allocated over the run (0 when nothing was allocated).
  double reserved_over_allocated() const;
  /// COUNT: tokens the steps ran, summed (after padding).
  int64_t tokens = 0;
};

/// Replays `lengths.size()` steps of `step`, step i at pad_length(lengths[i],
/// bucketing), after the `persistent_bytes` allocations. Throws InputError
/// for a length < 1, ConfigError for options the simulator refuses, and
/// InputError when the model's carries do not balance (a step carrying out
/// more or fewer allocations than the next frees is not a steady step).
LengthRun replay_lengths(const LengthModel& step, const std::vector<int64_t>& persistent_bytes,
                         const std::vector<int64_t>& lengths, const SimOptions& options,
                         const Bucketing& bucketing = {});

/// One way to run the drawn lengths, and what it costs.
struct LengthPolicy {
  std::string name;  ///< "as drawn", "expandable_segments", "padded to a multiple of 128", ...
  bool expandable_segments = false;
  Bucketing bucketing;
  LengthRun run;
  /// Tokens run / tokens drawn: the compute padding adds (1 when none).
  double padded_tokens_ratio = 1.0;
};

/// The policies compared for a variable-length run, in this order: as drawn;
/// expandable_segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True);
/// padded to a multiple of each of `multiples`; padded to a power of two.
/// Each replays the same `lengths` with `options` (expandable_segments is
/// set only by its own row).
std::vector<LengthPolicy> compare_length_policies(const LengthModel& step, const std::vector<int64_t>& persistent_bytes,
                                                  const std::vector<int64_t>& lengths, const SimOptions& options,
                                                  const std::vector<int64_t>& multiples = {64, 256});

/// The policy to recommend. Under a budget, first those whose run never ran
/// out of memory, then of them those that never flushed the cache (alloc
/// retries), where any does; then the least peak reserved; among those
/// within 1 % of it, the least padding, then the earlier row (as drawn
/// first). Throws InputError for an empty list.
const LengthPolicy& recommended_policy(const std::vector<LengthPolicy>& policies);

}  // namespace oomtune::allocsim
