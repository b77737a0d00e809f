#include "diagnose/nothing_saved.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "diagnose/period_runs.h"

namespace oomtune::diagnose {
namespace {

constexpr size_t kMaxAllocations = 4096;  // the forward's latest allocations examined
// Half periods a stretch covers at least: half a block's allocations or more
// of earlier blocks, the last complete one, the current one.
constexpr size_t kMinHalfPeriods = 5;
constexpr size_t kMinLayers = 2;  // a block runs more than one layer

struct Allocation {
  size_t event;
  int64_t layer;
  int64_t bytes;
  bool operator==(const Allocation& o) const { return layer == o.layer && bytes == o.bytes; }
};

}  // namespace

NothingSaved blocks_kept_nothing(const std::vector<TraceEvent>& trace, const Attribution& attr,
                                 const FrameIndex& frames, size_t oom_event) {
  NothingSaved none;
  // The forward run's latest allocations, oldest first.
  std::vector<Allocation> run;
  for (size_t i = oom_event; i-- > 0 && run.size() < kMaxAllocations;) {
    const TraceEvent& e = trace[i];
    if (e.action == TraceAction::kOom) break;
    if (e.action != TraceAction::kAlloc) continue;
    if (attr.event_phase[i] != Phase::kForward) break;
    if (frames.checkpointed(e.frames)) return none;  // its blocks keep their inputs
    run.push_back({i, frames.layer_frame(e.frames), e.size});
  }
  std::reverse(run.begin(), run.end());
  const size_t n = run.size();

  // The period whose stretch covers the most allocations.
  size_t best_p = 0, best_begin = 0, best_end = 0;  // the stretch [best_begin, best_end)
  for (size_t p = 2; kMinHalfPeriods * p <= 2 * n; ++p) {
    for_each_period_run(
        0, n, p, [&](size_t a, size_t b) { return run[a] == run[b]; },
        [&](PeriodRun r) {
          const size_t begin = r.begin - p;  // the stretch [begin, r.end)
          if (2 * (r.end - begin) >= kMinHalfPeriods * p && r.end - begin > best_end - best_begin) {
            best_p = p;
            best_begin = begin;
            best_end = r.end;
          }
        });
  }
  if (best_p == 0) return none;

  // The earlier blocks: the stretch but its last two periods.
  const size_t earlier_end = best_end - 2 * best_p;
  std::unordered_set<size_t> examined;  // their trace indices, KV cache entries aside
  std::unordered_set<int64_t> layers;
  NothingSaved found;
  found.block_allocations = static_cast<int64_t>(best_p);
  for (size_t k = best_begin; k < earlier_end; ++k) {
    const TraceEvent& e = trace[run[k].event];
    if (frames.stores_kv_cache(e.frames)) continue;
    examined.insert(run[k].event);
    layers.insert(run[k].layer);
    ++found.freed_allocations;
    found.freed_bytes += e.size;
    if (found.first_event < 0) found.first_event = static_cast<int64_t>(run[k].event);
    found.last_event = static_cast<int64_t>(run[k].event);
  }
  if (layers.size() < kMinLayers || found.freed_bytes == 0) return none;
  found.stretch_allocations = static_cast<int64_t>(best_end - best_begin);
  for (size_t k = best_begin; k < best_end; k += best_p) found.block_first_events.push_back(run[k].event);
  // Each must be freed before the out-of-memory. An address handed out
  // again while one of them held it (a trace no allocator makes) keeps it.
  std::unordered_map<int64_t, bool> live;  // addr -> held by one of them
  size_t freed = 0;
  for (size_t i = run[best_begin].event; i < oom_event; ++i) {
    const TraceEvent& e = trace[i];
    if (e.action == TraceAction::kAlloc) {
      auto [it, fresh] = live.try_emplace(e.addr, false);
      if (!fresh && it->second) return none;
      it->second = examined.count(i) != 0;
    } else if (e.action == TraceAction::kFreeRequested || e.action == TraceAction::kFreeCompleted) {
      const auto it = live.find(e.addr);
      if (it == live.end()) continue;
      freed += it->second ? 1 : 0;
      live.erase(it);
    }
  }
  return freed == examined.size() ? found : none;
}

}  // namespace oomtune::diagnose
