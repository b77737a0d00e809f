#include "probes/cuda_stats_source.h"

#include <c10/cuda/CUDACachingAllocator.h>

namespace oomtune {

DeviceStatsSample CudaStatsSource::read() {
  namespace allocator = c10::cuda::CUDACachingAllocator;
  const auto stats = allocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_));
  constexpr auto kAll = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  DeviceStatsSample s;
  s.allocated_bytes = stats.allocated_bytes[kAll].current;
  s.allocated_peak_bytes = stats.allocated_bytes[kAll].peak;
  s.reserved_bytes = stats.reserved_bytes[kAll].current;
  s.reserved_peak_bytes = stats.reserved_bytes[kAll].peak;
  s.active_peak_bytes = stats.active_bytes[kAll].peak;
  s.allocations = stats.allocation[kAll].allocated;
  s.allocated_bytes_total = stats.allocated_bytes[kAll].allocated;
  s.segment_allocations = stats.segment[kAll].allocated;
  s.num_alloc_retries = stats.num_alloc_retries;
  s.num_ooms = stats.num_ooms;
  return s;
}

void CudaStatsSource::reset_peaks() {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_));
}

}  // namespace oomtune
