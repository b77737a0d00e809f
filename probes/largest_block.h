#pragma once
// The largest single block the CUDA caching allocator can hand out right
// now (issue #44 item 5; the seeds' diagnose_oom probe): after a trial on a
// GPU, by bisection over tensor sizes, since neither the allocator nor the
// driver says it (cudaMemGetInfo gives free bytes, which fragmentation and
// the process's cap keep from being one block). Reported beside the step's
// largest request: a request below free bytes but above this block is what
// fragmentation or the cap refused.
//
// The bisection never asks for more than the job's usable budget, and a
// job without a budget gets none: a try of the device's whole free memory,
// even for a moment, made every other process on the GPU run out of memory
// (six trials beside each other on an H200, 2026-11-29: "Process 1562 has
// 138.40 GiB memory in use"; then a GPU test's trial without a budget,
// "Process 1227 has 136.23 GiB").

#include <cstdint>
#include <functional>

namespace oomtune {

/// What a GPU could give one more tensor after a trial.
struct AllocatableRecord {
  int64_t largest_block_bytes = 0;  // SUM: the largest size that allocated, to `granularity`
  int64_t device_free_bytes = 0;    // SUM: cudaMemGetInfo free, before the bisection
  int64_t device_total_bytes = 0;   // SUM: cudaMemGetInfo total
  int64_t attempts = 0;             // COUNT: allocations tried
  int64_t bound_bytes = 0;          // the bisection's upper bound (the usable budget, or the cap): a block
                                    // this large means "at least this"; 0 when unknown (older JSON)
};

/// The largest multiple of `granularity` in [0, upper_bytes] for which
/// `try_allocate(bytes)` returns true (it allocates and frees at once),
/// assuming that success at n means success below n. Bisection: at most
/// ceil(log2(upper / granularity)) + 1 calls, counted in `*attempts` when
/// given. 0 when even `granularity` fails. Throws std::invalid_argument
/// when granularity is not positive or upper_bytes is negative.
int64_t largest_allocatable(const std::function<bool(int64_t)>& try_allocate, int64_t upper_bytes, int64_t granularity,
                            int64_t* attempts = nullptr);

}  // namespace oomtune
