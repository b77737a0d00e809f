#pragma once
// Runs of a sequence that repeats with a period: the one search under
// diagnose's block readings (Note [Blocks from the parameters], Note [Phase
// need] rule 3, Note [Blocks in backward], Note [Blocks that kept nothing]).
// A model's blocks allocate, free and hold their tensors in the same order,
// so a key per event (bytes; layer frame and bytes) repeats with the block's
// event count as period. Each reading keeps its own choice among the runs
// (the longest, the one reaching the end, the most periods); the runs are
// found here once.

#include <cstddef>

namespace oomtune::diagnose {

/// A maximal run of positions j in [begin, end) of a sequence x where
/// x[j] == x[j - period] for every j: `matched()` comparisons held. The
/// elements that repeat are [begin - period, end), `matched() + period` of
/// them: the run's first period and every period after it so far.
struct PeriodRun {
  size_t begin = 0;
  size_t end = 0;
  size_t matched() const { return end - begin; }
};

/// Calls `visit(PeriodRun)` for each maximal run of positions j in
/// [first + period, n) where `same(j, j - period)`, in order; none for
/// `period` 0. `same(a, b)` compares elements a and b. O(n - first) calls
/// of `same`.
template <typename Same, typename Visit>
void for_each_period_run(size_t first, size_t n, size_t period, Same same, Visit visit) {
  if (period == 0) return;
  size_t begin = first + period;
  for (size_t j = begin; j <= n; ++j) {
    if (j < n && same(j, j - period)) continue;
    if (j > begin) visit(PeriodRun{begin, j});
    begin = j + 1;
  }
}

/// The run of positions j in [first + period, n) where `same(j, j - period)`
/// that ends at n (the sequence's latest elements), scanned from the end:
/// O(its length) calls of `same`. Empty ({n, n}) where x[n - 1] differs from
/// the element `period` before it, and for `period` 0.
template <typename Same>
PeriodRun period_run_ending_at(size_t first, size_t n, size_t period, Same same) {
  size_t j = n;
  while (period > 0 && j >= first + period + 1 && same(j - 1, j - 1 - period)) --j;
  return {j, n};
}

}  // namespace oomtune::diagnose
