#pragma once
// The CUDA caching allocator's counters as a DeviceStatsSource (CUDA builds
// only: OOMTUNE_WITH_CUDA), for DevicePhaseMeter (issue #44, item 2).

#include "probes/device_phase_meter.h"

namespace oomtune {

/// Reads c10::cuda::CUDACachingAllocator::getDeviceStats(device) at
/// StatType::AGGREGATE (c10/core/Allocator.h: index 0, every pool) and
/// resets its peaks with resetPeakStats(device), which sets every Stat's
/// peak to its current value and leaves the counts alone (PyTorch 2.11).
/// The device must be initialized (a CUDA tensor made, or
/// at::globalContext().lazyInitDevice(at::kCUDA)).
class CudaStatsSource final : public DeviceStatsSource {
 public:
  explicit CudaStatsSource(int device) : device_(device) {}
  DeviceStatsSample read() override;
  void reset_peaks() override;

 private:
  int device_;
};

}  // namespace oomtune
