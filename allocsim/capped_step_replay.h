#pragma once
// One training step replayed under an allocator cap, its transient requests
// giving way: what a CUDA step whose convolutions' cuDNN workspaces find no
// room does (docs/validation.md, "cuDNN's workspaces under a cap").
//
// Why it matters: PyTorch allocates a convolution's workspace after its
// output and, when the caching allocator raises OutOfMemoryError for it
// (after freeing its cached segments and retrying), runs the next engine
// cuDNN lists instead (aten/src/ATen/native/cudnn/Conv_v8.cpp, try_configs;
// a cached engine that fails sends it back to that list). So an eager CNN
// step reserves more without a cap than it needs under one, and the bytes it
// needs are those of its lasting requests. Measured on an H200, ResNet-50
// checkpointed at micro-batch 32 reserved 2024 MiB without a cap; its own
// requests, replayed here, run capped at 1470 MiB.
//
// Rules:
// - A request is transient when it is freed before the step's next request
//   is made (a kernel's workspace); the step's last request never is, there
//   being no next one (scripts/compare_step_events.py, transient_requests).
// - The persistent allocations (weights, optimizer state) come first, in
//   order, and stay; then the step's events in order. A free of an id that
//   no request of the step made (the previous step's gradients) frees
//   nothing.
// - A transient request the capped allocator cannot serve gives way: it is
//   skipped, as if its kernel ran with no workspace, and its free with it. A
//   lasting one that it cannot serve ends the replay: the step does not run.
// The giving way is all-or-nothing where cuDNN falls back to an engine with
// a smaller workspace; the bytes a lasting request needs do not depend on
// that. No libtorch.

#include <cstdint>
#include <vector>

#include "allocsim/alloc_event.h"
#include "allocsim/step_events_json.h"

namespace oomtune::allocsim {

/// Which of `events` are transient requests (Rules above): one flag per
/// event, false for every free.
std::vector<bool> transient_requests(const std::vector<AllocEvent>& events);

/// The outcome of a capped replay.
struct CappedStepReplay {
  bool ran = false;                  ///< every lasting request was served
  int64_t peak_reserved_bytes = 0;   ///< SUM: reserved at its highest (until the failing request, if any)
  int64_t given_way = 0;             ///< COUNT: transient requests the cap refused
  int64_t given_way_bytes = 0;       ///< SUM: their bytes as requested
  int64_t cache_flushes = 0;         ///< COUNT: failed cudaMallocs retried after freeing the cache (num_alloc_retries)
  int64_t failed_request_bytes = 0;  ///< SIZE: the lasting request that was refused; 0 when the step ran
};

/// Replays `step` (its persistent allocations first) on a caching allocator
/// capped at `cap_bytes` (0: no cap), transient requests giving way. Throws
/// InputError for an id requested twice while live.
CappedStepReplay replay_capped_step(const StepEvents& step, int64_t cap_bytes);

/// The smallest cap, a multiple of `granularity_bytes` (> 0), at which
/// replay_capped_step runs the step, found by bisection between 0 and the
/// reserved peak without a cap (at which it runs: the cap never refuses);
/// 0 when the step reserves nothing. Bisection assumes that a step that runs
/// under a cap runs under any larger one, which the allocator does not
/// promise: the answer is a cap that runs, the smallest as far as that holds.
int64_t smallest_running_cap(const StepEvents& step, int64_t granularity_bytes);

}  // namespace oomtune::allocsim
