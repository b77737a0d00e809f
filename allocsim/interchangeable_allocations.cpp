#include "allocsim/interchangeable_allocations.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <numeric>
#include <unordered_map>
#include <utility>

namespace oomtune::allocsim {

std::vector<std::size_t> interchangeable_order(const std::vector<AllocEvent>& events) {
  constexpr std::size_t kNever = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> freed_at(events.size(), kNever);
  std::unordered_map<std::uint64_t, std::size_t> live;  // id -> index of its alloc
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind == AllocEventKind::kAlloc) {
      live[events[i].id] = i;
    } else if (const auto it = live.find(events[i].id); it != live.end()) {
      freed_at[it->second] = i;
      live.erase(it);
    }
  }
  std::vector<std::size_t> order(events.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  for (std::size_t begin = 0; begin < events.size();) {
    if (events[begin].kind != AllocEventKind::kAlloc) {
      ++begin;
      continue;
    }
    std::size_t end = begin;
    while (end < events.size() && events[end].kind == AllocEventKind::kAlloc) ++end;
    // (bytes, call) -> indices, in order
    std::map<std::pair<int64_t, std::uint64_t>, std::vector<std::size_t>> places;
    for (std::size_t i = begin; i < end; ++i)
      if (events[i].call != 0) places[{events[i].bytes, events[i].call}].push_back(i);
    for (const auto& [size_and_call, at] : places) {
      if (at.size() < 2) continue;
      std::vector<std::size_t> by_free = at;
      std::stable_sort(by_free.begin(), by_free.end(),
                       [&](std::size_t a, std::size_t b) { return freed_at[a] < freed_at[b]; });
      for (std::size_t k = 0; k < at.size(); ++k) order[at[k]] = by_free[k];
    }
    begin = end;
  }
  return order;
}

void order_interchangeable_allocations(std::vector<AllocEvent>& events) {
  const std::vector<std::size_t> order = interchangeable_order(events);
  std::vector<AllocEvent> reordered;
  reordered.reserve(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    reordered.push_back(events[order[i]]);
    reordered.back().order = events[i].order;
  }
  events = std::move(reordered);
}

}  // namespace oomtune::allocsim
