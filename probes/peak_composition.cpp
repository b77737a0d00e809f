#include "probes/peak_composition.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "common/byte_size.h"

namespace oomtune {
namespace {

constexpr std::size_t kBefore = static_cast<std::size_t>(-1);  // the moment before the range
constexpr const char* kUnknownOp = "(unknown)";                // MemoryTracker's label for no operator

// Applies one device event to `live` (address to its allocation's index)
// and `bytes`.
void replay(const std::vector<TrackedEvent>& events, std::size_t i, std::unordered_map<uint64_t, std::size_t>& live,
            int64_t& bytes) {
  const TrackedEvent& e = events[i];
  if (e.kind == TrackedEvent::Kind::kAlloc) {
    live[e.address] = i;
    bytes += e.bytes;
    return;
  }
  const auto block = live.find(e.address);
  if (block == live.end()) return;
  bytes -= events[block->second].bytes;
  live.erase(block);
}

std::string where_allocated(const PeakShare& share) {
  if (!share.earlier_step) return fmt::format("in {}", phase_name(share.phase));
  if (share.phase == Phase::kLoad) return "at load";
  return fmt::format("in an earlier step's {}", phase_name(share.phase));
}

// "aten::linear in forward"; what was loaded outside any operator is the
// model's own tensors.
std::string what_and_when(const PeakShare& share) {
  if (share.earlier_step && share.phase == Phase::kLoad && share.op == kUnknownOp)
    return "the model's parameters and buffers, at load";
  return fmt::format("{} {}", share.op, where_allocated(share));
}

}  // namespace

PeakComposition find_peak_composition(const std::vector<TrackedEvent>& events, std::size_t begin, std::size_t end,
                                      const std::vector<std::string>& op_names) {
  if (begin > end || end > events.size()) throw std::out_of_range("find_peak_composition: bad event range");
  std::unordered_map<uint64_t, std::size_t> live;
  int64_t bytes = 0;
  int64_t highest = 0;  // from `begin` on
  std::size_t moment = kBefore;
  for (std::size_t i = 0; i < end; ++i) {
    if (i == begin) highest = bytes;
    if (events[i].pool != MemoryPool::kDevice) continue;
    replay(events, i, live, bytes);
    if (i >= begin && events[i].kind == TrackedEvent::Kind::kAlloc && bytes > highest) {
      highest = bytes;
      moment = i;
    }
  }

  // Again up to that moment, keeping the blocks.
  live.clear();
  bytes = 0;
  const std::size_t last = moment == kBefore ? begin : moment + 1;
  for (std::size_t i = 0; i < last; ++i)
    if (events[i].pool == MemoryPool::kDevice) replay(events, i, live, bytes);

  PeakComposition composition;
  composition.live_bytes = bytes;
  if (moment != kBefore)
    composition.phase = events[moment].phase;
  else if (begin < events.size())
    composition.phase = events[begin].phase;
  // Key: label, phase, allocated before the range.
  std::map<std::tuple<std::string, Phase, bool>, PeakShare> groups;
  for (const auto& [address, index] : live) {
    const TrackedEvent& e = events[index];
    const std::string label = e.op < op_names.size() ? op_names[e.op] : kUnknownOp;
    PeakShare& share = groups[{label, e.phase, index < begin}];
    share.op = label;
    share.phase = e.phase;
    share.earlier_step = index < begin;
    share.bytes += e.bytes;
    share.blocks += 1;
  }
  for (auto& [key, share] : groups) composition.shares.push_back(std::move(share));
  std::stable_sort(composition.shares.begin(), composition.shares.end(), [](const PeakShare& a, const PeakShare& b) {
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.earlier_step != b.earlier_step) return a.earlier_step;
    if (a.phase != b.phase) return a.phase < b.phase;
    return a.op < b.op;
  });
  return composition;
}

std::vector<std::string> peak_composition_lines(const PeakComposition& composition, std::size_t listed) {
  std::vector<std::string> lines;
  if (composition.live_bytes <= 0) return lines;
  lines.push_back(fmt::format("at the peak          {} of tensors live in {}, by the operator that allocated them:",
                              format_bytes(composition.live_bytes), phase_name(composition.phase)));
  const std::size_t shown = std::min(listed, composition.shares.size());
  for (std::size_t i = 0; i < shown; ++i) {
    const PeakShare& s = composition.shares[i];
    lines.push_back(fmt::format("  {:>12}  {}, {} block{}", format_bytes(s.bytes), what_and_when(s), s.blocks,
                                s.blocks == 1 ? "" : "s"));
  }
  if (shown < composition.shares.size()) {
    int64_t rest = 0, blocks = 0;
    for (std::size_t i = shown; i < composition.shares.size(); ++i) {
      rest += composition.shares[i].bytes;
      blocks += composition.shares[i].blocks;
    }
    lines.push_back(fmt::format("  {:>12}  {} others ({} blocks; --json lists all)", format_bytes(rest),
                                composition.shares.size() - shown, blocks));
  }
  return lines;
}

}  // namespace oomtune
