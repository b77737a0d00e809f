#pragma once
// Out-of-memory errors that a run survived.
//
// Why it matters: PyTorch's caching allocator records an `oom` trace entry
// whenever it raises OutOfMemoryError, whether or not anything catches the
// error. cuDNN catches those of a convolution's workspace and runs another,
// slower engine (aten/src/ATen/native/cudnn/Conv_v8.cpp, try_configs); a
// batch-size finder catches any in the function it wraps and retries with a
// smaller batch (accelerate/utils/memory.py, find_executable_batch_size,
// which Hugging Face Trainer's auto_find_batch_size uses; Lightning's
// tuner/batch_size_scaling.py); a training loop may skip the batch. Judged as
// the run's failure, such an entry names a request that stopped nothing.
//
// Rule: an oom event is caught when a successful allocation (an `alloc`
// event) follows it in the trace: the program went on allocating. An error
// that ends the run stops its allocations (unwinding frees; dumping a
// snapshot allocates nothing on the device), so the events that ended a run
// are the oom events after the trace's last allocation.

#include <cstddef>
#include <vector>

#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// Index of the last alloc event of `trace`, or trace.size() when it has none.
size_t last_alloc_event(const std::vector<TraceEvent>& trace);

/// Whether the oom event at `index` of `trace` was caught (Rule above), given
/// last_alloc_event(trace).
inline bool oom_caught(size_t index, size_t last_alloc, size_t events) {
  return last_alloc < events && index < last_alloc;
}

/// COUNT: the alloc events after the oom event at `index`, up to the next oom
/// event or the trace's end: what the program went on to allocate.
int64_t allocations_after(const std::vector<TraceEvent>& trace, size_t index);

}  // namespace oomtune::diagnose
