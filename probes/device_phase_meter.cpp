#include "probes/device_phase_meter.h"

#include <algorithm>

namespace oomtune {

DevicePhaseMeter::DevicePhaseMeter(DeviceStatsSource& source) : source_(source) {
  source_.reset_peaks();
  at_start_ = at_reset_ = source_.read();
  peak_bytes_ = at_start_.allocated_bytes;
  reserved_peak_bytes_ = at_start_.reserved_bytes;
}

DeviceStatsSample DevicePhaseMeter::close_phase() {
  const DeviceStatsSample now = source_.read();
  peak_bytes_ = std::max(peak_bytes_, now.allocated_peak_bytes);
  reserved_peak_bytes_ = std::max(reserved_peak_bytes_, now.reserved_peak_bytes);
  active_peak_bytes_ = std::max(active_peak_bytes_, now.active_peak_bytes);
  if (in_phase_) {
    PhaseMemory& p = phases_[static_cast<std::size_t>(phase_)];
    p.peak_bytes = std::max(p.peak_bytes, now.allocated_peak_bytes);
    p.reserved_peak_bytes = std::max(p.reserved_peak_bytes, now.reserved_peak_bytes);
    p.end_bytes = now.allocated_bytes;
    p.allocations += now.allocations - at_start_.allocations;
    p.allocated_bytes += now.allocated_bytes_total - at_start_.allocated_bytes_total;
  }
  source_.reset_peaks();
  at_start_ = now;
  return now;
}

void DevicePhaseMeter::begin_phase(Phase phase) {
  const DeviceStatsSample now = close_phase();
  phase_ = phase;
  in_phase_ = true;
  PhaseMemory& next = phases_[static_cast<std::size_t>(phase)];
  if (!seen_[static_cast<std::size_t>(phase)]) {
    next.start_bytes = now.allocated_bytes;
    seen_[static_cast<std::size_t>(phase)] = true;
  }
  next.peak_bytes = std::max(next.peak_bytes, now.allocated_bytes);
  next.reserved_peak_bytes = std::max(next.reserved_peak_bytes, now.reserved_bytes);
}

void DevicePhaseMeter::end_phase() {
  close_phase();
  in_phase_ = false;
}

void DevicePhaseMeter::reset_statistics() {
  in_phase_ = false;
  const DeviceStatsSample now = close_phase();
  phases_ = {};
  seen_ = {};
  at_reset_ = now;
  peak_bytes_ = now.allocated_bytes;
  reserved_peak_bytes_ = now.reserved_bytes;
  active_peak_bytes_ = 0;
}

int64_t DevicePhaseMeter::live_bytes() { return source_.read().allocated_bytes; }

PhaseMemory DevicePhaseMeter::phase(Phase phase) const { return phases_[static_cast<std::size_t>(phase)]; }

MeasuredReserved DevicePhaseMeter::measured_reserved() const {
  // The counters as of the last boundary: the meter reads at boundaries only.
  return {reserved_peak_bytes_, active_peak_bytes_, at_start_.segment_allocations - at_reset_.segment_allocations,
          at_start_.num_alloc_retries - at_reset_.num_alloc_retries, at_start_.num_ooms - at_reset_.num_ooms};
}

}  // namespace oomtune
