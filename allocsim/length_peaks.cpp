#include "allocsim/length_peaks.h"

#include <algorithm>
#include <vector>

namespace oomtune::allocsim {

std::array<int64_t, kNumPhases> phase_live_peaks(const LengthModel& model, int64_t length) {
  const std::vector<AllocEvent> events = model.at(length);
  const std::vector<std::size_t>& partners = model.partners();
  // The step before's carried-out allocations, alive at the start, in order.
  std::vector<int64_t> carried;
  int64_t live = 0;
  for (std::size_t i = 0; i < events.size(); ++i)
    if (events[i].kind == AllocEventKind::kAlloc && partners[i] == LengthModel::kCarriedIn) {
      carried.push_back(events[i].bytes);
      live += events[i].bytes;
    }
  std::array<int64_t, kNumPhases> peaks{};
  std::size_t next_carried = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const AllocEvent& e = events[i];
    auto& peak = peaks[static_cast<std::size_t>(e.phase)];
    peak = std::max(peak, live);  // a phase holds what the one before left, from its start
    if (e.kind == AllocEventKind::kAlloc) {
      live += e.bytes;
    } else if (partners[i] != LengthModel::kCarriedIn) {
      live -= events[partners[i]].bytes;
    } else if (next_carried < carried.size()) {
      live -= carried[next_carried++];
    }
    peak = std::max(peak, live);
  }
  return peaks;
}

}  // namespace oomtune::allocsim
