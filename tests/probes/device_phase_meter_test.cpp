// DevicePhaseMeter turns the CUDA caching allocator's counters into the
// per-phase records the CPU tracker fills. A fake source plays the counters
// (as c10's Stat: current, peak, and what was ever allocated), so every
// expectation below is worked out by hand.

#include "probes/device_phase_meter.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "common/byte_size.h"

namespace oomtune {
namespace {

/// Counters as the allocator keeps them: allocations and frees move the
/// current values, peaks follow until reset, and reserved grows in 20 MiB
/// segments that are never given back (no empty_cache()).
class FakeStats : public DeviceStatsSource {
 public:
  void alloc(int64_t bytes) {
    s_.allocated_bytes += bytes;
    s_.allocated_bytes_total += bytes;
    ++s_.allocations;
    s_.allocated_peak_bytes = std::max(s_.allocated_peak_bytes, s_.allocated_bytes);
    s_.active_peak_bytes = std::max(s_.active_peak_bytes, s_.allocated_bytes);
    while (s_.reserved_bytes < s_.allocated_bytes) {
      s_.reserved_bytes += 20 * kMiB;
      ++s_.segment_allocations;
    }
    s_.reserved_peak_bytes = std::max(s_.reserved_peak_bytes, s_.reserved_bytes);
  }
  void free(int64_t bytes) { s_.allocated_bytes -= bytes; }
  void retry() { ++s_.num_alloc_retries; }

  DeviceStatsSample read() override { return s_; }
  void reset_peaks() override {
    s_.allocated_peak_bytes = s_.allocated_bytes;
    s_.reserved_peak_bytes = s_.reserved_bytes;
    s_.active_peak_bytes = s_.allocated_bytes;
  }

 private:
  DeviceStatsSample s_;
};

// A step by hand: 10 MiB of weights before it; forward keeps 30 MiB and
// frees a 5 MiB temporary; backward makes 10 MiB of gradients and frees
// the activations; the optimizer makes 20 MiB of state.
TEST(DevicePhaseMeter, EachPhaseGetsItsOwnPeakAndCounts) {
  FakeStats stats;
  stats.alloc(10 * kMiB);
  DevicePhaseMeter meter(stats);
  meter.begin_phase(Phase::kForward);
  stats.alloc(30 * kMiB);
  stats.alloc(5 * kMiB);
  stats.free(5 * kMiB);
  meter.begin_phase(Phase::kBackward);
  stats.alloc(10 * kMiB);
  stats.free(30 * kMiB);
  meter.begin_phase(Phase::kOptimizer);
  stats.alloc(20 * kMiB);
  meter.end_phase();

  const PhaseMemory forward = meter.phase(Phase::kForward);
  EXPECT_EQ(forward.start_bytes, 10 * kMiB);
  EXPECT_EQ(forward.peak_bytes, 45 * kMiB);
  EXPECT_EQ(forward.end_bytes, 40 * kMiB);
  EXPECT_EQ(forward.allocations, 2);
  EXPECT_EQ(forward.allocated_bytes, 35 * kMiB);
  EXPECT_EQ(forward.reserved_peak_bytes, 60 * kMiB) << "three 20 MiB segments for 45 MiB";
  const PhaseMemory backward = meter.phase(Phase::kBackward);
  EXPECT_EQ(backward.start_bytes, 40 * kMiB);
  EXPECT_EQ(backward.peak_bytes, 50 * kMiB) << "its own peak, not forward's";
  EXPECT_EQ(backward.end_bytes, 20 * kMiB);
  EXPECT_EQ(backward.allocations, 1);
  EXPECT_EQ(backward.reserved_peak_bytes, 60 * kMiB);
  const PhaseMemory optimizer = meter.phase(Phase::kOptimizer);
  EXPECT_EQ(optimizer.start_bytes, 20 * kMiB);
  EXPECT_EQ(optimizer.peak_bytes, 40 * kMiB);
  EXPECT_EQ(optimizer.end_bytes, 40 * kMiB);
  EXPECT_EQ(meter.peak_bytes(), 50 * kMiB);
  EXPECT_EQ(meter.live_bytes(), 40 * kMiB);
  const MeasuredReserved reserved = meter.measured_reserved();
  EXPECT_EQ(reserved.peak_reserved_bytes, 60 * kMiB);
  EXPECT_EQ(reserved.peak_active_bytes, 50 * kMiB);
  EXPECT_EQ(reserved.segment_allocations, 2) << "the weights' segment came before the meter";
}

// Between the warm-up step and the measured one: phases, peaks and counts
// start again, the live bytes stay.
TEST(DevicePhaseMeter, ResetStatisticsStartsTheMeasuredStep) {
  FakeStats stats;
  DevicePhaseMeter meter(stats);
  meter.begin_phase(Phase::kForward);
  stats.alloc(100 * kMiB);
  stats.retry();
  stats.free(90 * kMiB);
  meter.end_phase();
  meter.reset_statistics();
  EXPECT_EQ(meter.peak_bytes(), 10 * kMiB);
  EXPECT_EQ(meter.phase(Phase::kForward).allocations, 0);
  meter.begin_phase(Phase::kForward);
  stats.alloc(30 * kMiB);
  meter.end_phase();
  const PhaseMemory forward = meter.phase(Phase::kForward);
  EXPECT_EQ(forward.start_bytes, 10 * kMiB);
  EXPECT_EQ(forward.peak_bytes, 40 * kMiB);
  EXPECT_EQ(forward.allocations, 1);
  EXPECT_EQ(meter.peak_bytes(), 40 * kMiB);
  const MeasuredReserved reserved = meter.measured_reserved();
  EXPECT_EQ(reserved.peak_reserved_bytes, 100 * kMiB) << "the cache keeps the warm-up's segments";
  EXPECT_EQ(reserved.segment_allocations, 0) << "none since the reset";
  EXPECT_EQ(reserved.num_alloc_retries, 0) << "the warm-up's retry is before the reset";
}

// A phase that runs twice in a step (each micro-batch's forward) keeps the
// higher peak and both counts.
TEST(DevicePhaseMeter, APhaseThatRunsAgainAddsUp) {
  FakeStats stats;
  DevicePhaseMeter meter(stats);
  for (int64_t mib : {8, 12}) {
    meter.begin_phase(Phase::kForward);
    stats.alloc(mib * kMiB);
    meter.begin_phase(Phase::kBackward);
    stats.free(mib * kMiB);
  }
  meter.end_phase();
  const PhaseMemory forward = meter.phase(Phase::kForward);
  EXPECT_EQ(forward.start_bytes, 0);
  EXPECT_EQ(forward.peak_bytes, 12 * kMiB);
  EXPECT_EQ(forward.allocations, 2);
  EXPECT_EQ(forward.allocated_bytes, 20 * kMiB);
}

}  // namespace
}  // namespace oomtune
