#pragma once
// What a trial on a GPU measures besides the tracker's event records (issue
// #44, items 2 and 3): the CUDA caching allocator capped at the budget, its
// blocks fed to the MemoryTracker as they come and go, and its own counters
// per phase. The tracker's records (static split, largest allocation with
// its operator, event stream, backward's activation peak) then hold the
// GPU's blocks at their requested sizes; the phases, the step's peak and
// measured reserved bytes come from the allocator's counters (allocated
// bytes include its 512-byte rounding, as torch.cuda.max_memory_allocated
// does).
//
// CUDA builds only (OOMTUNE_WITH_CUDA); elsewhere start() returns nullptr
// and require_cuda_trial refuses device = "cuda" before a trial starts.
//
// Not yet run on a GPU (none was lent when this was written): the parts are
// tested apart on the CPU (DevicePhaseMeter against a fake source, the
// tracker's device feed, the fraction arithmetic), not together.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/phase.h"
#include "probes/largest_block.h"
#include "probes/memory_records.h"
#include "probes/memory_tracker.h"

namespace oomtune {

class CudaMeasurement {
 public:
  /// Starts measuring on the current CUDA device: initialises it, caps the
  /// caching allocator at `budget_bytes` (setMemoryFraction with
  /// allocator_fraction, probes/cuda_budget.h; nullopt: no cap), feeds its
  /// blocks to `tracker` (probes/cuda_allocator_trace.h) and starts a
  /// DevicePhaseMeter on its counters. nullptr in a build without CUDA.
  /// Throws c10::Error from CUDA (no device, driver error).
  /// With `record_history`, the allocator records its history (events
  /// with TorchScript frames, up to 100,000) and each phase is marked in it
  /// ("oomtune:<phase>", START and END: diagnose/phase_marks.h), for
  /// write_snapshot.
  static std::unique_ptr<CudaMeasurement> start(MemoryTracker& tracker, std::optional<int64_t> budget_bytes,
                                                bool record_history = false);

  virtual ~CudaMeasurement() = default;
  /// Phase boundaries, as MemoryTracker's (device_phase_meter.h).
  virtual void begin_phase(Phase phase) = 0;
  virtual void end_phase() = 0;
  virtual void reset_statistics() = 0;
  /// The allocator's record of `phase` since the last reset: allocated
  /// peak, reserved peak, start/end bytes, allocations (bytes, counts).
  virtual PhaseMemory phase(Phase phase) const = 0;
  /// Highest allocated bytes since the last reset, over every phase and
  /// the steps after them (call end_phase first).
  virtual int64_t peak_bytes() const = 0;
  /// Reserved and active peaks, cudaMalloc calls, retries and OOMs since
  /// the last reset.
  virtual MeasuredReserved measured_reserved() const = 0;
  /// The allocator's state for an out-of-memory result: "allocator:
  /// allocated X, reserved Y (cap Z), device free W".
  virtual std::string allocator_state() = 0;
  /// The largest block the allocator can hand out now, by bisection to 2
  /// MiB (its large-segment granularity) up to `bound_bytes` (the job's
  /// usable budget; the cap, if lower), with cudaMemGetInfo's free and
  /// total (probes/largest_block.h). Allocates and frees, then returns the
  /// cached blocks to the driver (emptyCache): call it once the trial's
  /// records are read.
  virtual AllocatableRecord allocatable(int64_t bound_bytes) = 0;
  /// Pinned host bytes in use now (CUDA's caching host allocator, which
  /// rounds each block up to a power of two; at::HostAllocator get_stats
  /// active_bytes): where an offloaded optimizer keeps its state on a GPU
  /// machine, out of the CPU allocator's sight.
  virtual int64_t pinned_host_bytes() = 0;
  /// Writes the allocator's snapshot (torch::cuda::_memory_snapshot_pickled,
  /// the pickle torch.cuda.memory._dump_snapshot writes) to `path`,
  /// atomically. Throws Error when it cannot be written.
  virtual void write_snapshot(const std::string& path) = 0;
};

}  // namespace oomtune
