#include "allocsim/capped_step_replay.h"

#include <unordered_set>

#include "allocsim/caching_allocator_sim.h"

namespace oomtune::allocsim {

std::vector<bool> transient_requests(const std::vector<AllocEvent>& events) {
  std::vector<bool> transient(events.size(), false);
  size_t last_request = events.size();
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].kind == AllocEventKind::kAlloc) last_request = i;
  // The latest request, while no later one has been made.
  size_t latest = events.size();
  for (size_t i = 0; i < events.size(); ++i) {
    const AllocEvent& e = events[i];
    if (e.kind == AllocEventKind::kAlloc) {
      latest = i;
    } else if (latest < events.size() && e.id == events[latest].id) {
      transient[latest] = latest != last_request;
      latest = events.size();
    }
  }
  return transient;
}

CappedStepReplay replay_capped_step(const StepEvents& step, int64_t cap_bytes) {
  SimOptions options;
  options.budget_bytes = cap_bytes;
  CachingAllocatorSim sim(options);
  CappedStepReplay replay;
  const auto finish = [&](bool ran) {
    replay.ran = ran;
    replay.peak_reserved_bytes = sim.result().peak_reserved_bytes;
    replay.cache_flushes = sim.result().num_alloc_retries;
    return replay;
  };
  // Ids above any a step's events use: addresses and counters stay below 2^62.
  std::uint64_t persistent_id = std::uint64_t{1} << 62;
  for (const int64_t bytes : step.persistent_bytes) {
    if (!sim.malloc(persistent_id++, bytes)) {
      replay.failed_request_bytes = bytes;
      return finish(false);
    }
  }
  const std::vector<bool> transient = transient_requests(step.events);
  std::unordered_set<std::uint64_t> live;
  for (size_t i = 0; i < step.events.size(); ++i) {
    const AllocEvent& e = step.events[i];
    if (e.kind == AllocEventKind::kFree) {
      if (live.erase(e.id) > 0) sim.free(e.id);
      continue;
    }
    if (sim.malloc(e.id, e.bytes)) {
      live.insert(e.id);
    } else if (transient[i]) {
      ++replay.given_way;
      replay.given_way_bytes += e.bytes;
    } else {
      replay.failed_request_bytes = e.bytes;
      return finish(false);
    }
  }
  return finish(true);
}

int64_t smallest_running_cap(const StepEvents& step, int64_t granularity_bytes) {
  // In granules. Invariant: `high` runs (a cap at the uncapped peak never
  // refuses a request; 0, nothing reserved, is no cap); `low` does not, or is 0.
  const int64_t uncapped = replay_capped_step(step, 0).peak_reserved_bytes;
  int64_t low = 0;
  int64_t high = (uncapped + granularity_bytes - 1) / granularity_bytes;
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    if (replay_capped_step(step, mid * granularity_bytes).ran)
      high = mid;
    else
      low = mid;
  }
  return high * granularity_bytes;
}

}  // namespace oomtune::allocsim
