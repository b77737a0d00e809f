#pragma once
// DevicePhaseMeter: the memory of each phase of a training step on a GPU,
// from the CUDA caching allocator's own counters, in the records the CPU
// tracker fills (PhaseMemory), so that the search and the reports read one
// format whatever measured it (DESIGN.md, "Memory backends").
//
// Rules (issue #44, item 2):
// - At each phase boundary the counters are read and their peaks reset:
//   the phase that ends takes the peaks since its start, as
//   torch.cuda.reset_peak_memory_stats() between phases gives them.
// - A phase's peak is the allocator's allocated-bytes peak (tensors, the
//   caching allocator's rounding included: 512 B blocks), its reserved
//   peak the bytes held from cudaMalloc; allocations and allocated bytes
//   are the counters' growth during the phase.
// - The step's peak is the highest phase peak since reset_statistics(),
//   kept here, since the allocator's own peak is reset at every boundary.
// - The counters come through DeviceStatsSource: libtorch's on a GPU
//   (probes/cuda_stats_source.h, CUDA builds), a fake in tests.

#include <array>
#include <cstdint>

#include "common/phase.h"
#include "probes/memory_records.h"

namespace oomtune {

/// The caching allocator's counters for one device, summed over its pools,
/// at one moment (c10/core/CachingDeviceAllocator.h, DeviceStats at
/// StatType::AGGREGATE; a Stat holds current, peak, allocated and freed).
struct DeviceStatsSample {
  int64_t allocated_bytes = 0;        // SUM: allocated_bytes.current
  int64_t allocated_peak_bytes = 0;   // SUM: allocated_bytes.peak since the last reset
  int64_t reserved_bytes = 0;         // SUM: reserved_bytes.current
  int64_t reserved_peak_bytes = 0;    // SUM: reserved_bytes.peak since the last reset
  int64_t active_peak_bytes = 0;      // SUM: active_bytes.peak since the last reset
  int64_t allocations = 0;            // COUNT: allocation.allocated, ever
  int64_t allocated_bytes_total = 0;  // SUM: allocated_bytes.allocated, ever
  int64_t segment_allocations = 0;    // COUNT: segment.allocated, ever (cudaMalloc calls)
  int64_t num_alloc_retries = 0;      // COUNT: cudaMalloc failures retried after freeing the cache
  int64_t num_ooms = 0;               // COUNT: out-of-memory errors raised
};

/// Where the counters come from.
class DeviceStatsSource {
 public:
  virtual ~DeviceStatsSource() = default;
  /// The counters now.
  virtual DeviceStatsSample read() = 0;
  /// Sets every peak to its current value (resetPeakStats).
  virtual void reset_peaks() = 0;
};

/// Per-phase device memory from a DeviceStatsSource. Not thread-safe: phase
/// boundaries come from the thread that runs the step.
class DevicePhaseMeter {
 public:
  /// Reads `source` once and resets its peaks: statistics start now.
  explicit DevicePhaseMeter(DeviceStatsSource& source);

  /// Ends the current phase and begins `phase`.
  void begin_phase(Phase phase);
  /// Ends the current phase.
  void end_phase();
  /// Forgets phase statistics and the step's peak (between a warm-up step
  /// and the measured one); the counters' growth counts from now.
  void reset_statistics();

  /// Allocated bytes now (bytes).
  int64_t live_bytes();
  /// Statistics of one phase since the last reset.
  PhaseMemory phase(Phase phase) const;
  /// Highest allocated bytes since the last reset, over every phase.
  int64_t peak_bytes() const { return peak_bytes_; }
  /// What the allocator reserved and did since the last reset.
  MeasuredReserved measured_reserved() const;

 private:
  // Reads the counters, gives the current phase (if any) their peaks and
  // growth, and resets the peaks.
  DeviceStatsSample close_phase();

  DeviceStatsSource& source_;
  std::array<PhaseMemory, kNumPhases> phases_{};
  std::array<bool, kNumPhases> seen_{};
  Phase phase_ = Phase::kLoad;
  bool in_phase_ = false;
  DeviceStatsSample at_start_;  // counters when the current phase (or the statistics) began
  DeviceStatsSample at_reset_;  // counters at the last reset_statistics()
  int64_t peak_bytes_ = 0;
  int64_t reserved_peak_bytes_ = 0;
  int64_t active_peak_bytes_ = 0;
};

}  // namespace oomtune
