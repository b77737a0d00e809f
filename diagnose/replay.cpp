#include "diagnose/replay.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace oomtune::diagnose {

namespace ar = alloc_rules;

bool block_would_split(bool is_large, bool expandable, int64_t block_bytes, int64_t rounded_bytes,
                       int64_t max_split_size) {
  const int64_t remaining = block_bytes - rounded_bytes;
  if (!is_large || expandable) return remaining >= ar::kMinBlockSize;
  return rounded_bytes < max_split_size && remaining > ar::kSmallSize;
}

Replay::Replay(const Snapshot& snapshot, int device, const ar::AllocatorConfig& config, Labeler labeler, int sites)
    : snapshot_(&snapshot), config_(config), labeler_(std::move(labeler)) {
  static const std::vector<TraceEvent> kEmpty;
  trace_ = device >= 0 && static_cast<size_t>(device) < snapshot.device_traces.size()
               ? &snapshot.device_traces[static_cast<size_t>(device)]
               : &kEmpty;
  const auto& trace = *trace_;
  release_at_request_ = !records_free_completed(trace);
  by_category_.assign(kMaxLabelCategories, 0);
  by_site_.assign(static_cast<size_t>(std::max(sites, 0)), 0);

  dumped_by_address_.reserve(snapshot.segments.size());
  for (const Segment& s : snapshot.segments) dumped_by_address_.push_back(&s);
  std::stable_sort(dumped_by_address_.begin(), dumped_by_address_.end(),
                   [](const Segment* a, const Segment* b) { return a->address < b->address; });

  // 1. Reserved ranges at dump time, then undo the trace's segment events.
  std::vector<const Segment*> segments;
  for (const Segment& s : snapshot.segments) {
    if (s.device == device || snapshot.device_traces.size() <= 1) segments.push_back(&s);
  }
  for (const Segment* s : segments) {
    add_range(s->address, ReservedRange{s->total_size, s->is_large, s->is_expandable, s->in_private_pool(), s->stream});
  }
  for (size_t i = trace.size(); i-- > 0;) {
    const TraceEvent& e = trace[i];
    switch (e.action) {
      case TraceAction::kSegmentAlloc:
      case TraceAction::kSegmentMap:
        remove_range(e.addr, e.size);
        break;
      case TraceAction::kSegmentFree:
      case TraceAction::kSegmentUnmap:
        add_range(e.addr,
                  ReservedRange{e.size, pool_of_range_is_large(e.addr, e.size), e.action == TraceAction::kSegmentUnmap,
                                range_is_private(e.addr), snapshot.stream_of(e)});
        break;
      default:
        break;
    }
  }

  // 2. Blocks live when recording began: orphan frees, and dumped
  //    allocated blocks that no alloc in the trace explains.
  struct LastAlloc {
    int64_t event = 0;  // the last alloc event at the address
    bool live = false;  // no free completed since
  };
  std::unordered_map<int64_t, LastAlloc> last_alloc_at;  // addr -> its last alloc
  std::vector<std::pair<int64_t, LiveBlock>> initial;
  std::unordered_set<int64_t> orphaned;
  for (size_t i = 0; i < trace.size(); ++i) {
    const TraceEvent& e = trace[i];
    if (e.action == TraceAction::kAlloc) {
      last_alloc_at[e.addr] = {static_cast<int64_t>(i), true};
    } else if (e.action == TraceAction::kFreeRequested || e.action == TraceAction::kFreeCompleted) {
      auto it = last_alloc_at.find(e.addr);
      if (it != last_alloc_at.end() && it->second.live) {
        if (e.action == TraceAction::kFreeCompleted || release_at_request_) it->second.live = false;
      } else if (orphaned.insert(e.addr).second) {
        LiveBlock b;
        b.requested = e.size;
        b.size = ar::round_size(e.size, config_);
        initial.emplace_back(e.addr, b);
      }
    }
  }
  last_alloc_.assign(trace.size(), false);
  for (const Segment* s : segments) {
    for (const Block& b : s->blocks) {
      if (b.state == BlockState::kInactive) continue;
      auto it = last_alloc_at.find(b.address);
      if (it != last_alloc_at.end() && it->second.live) {
        exact_size_[b.address] = b.size;
        last_alloc_[static_cast<size_t>(it->second.event)] = true;
        continue;
      }
      if (orphaned.count(b.address)) continue;
      LiveBlock lb;
      lb.size = b.size;
      lb.requested = b.requested_size;
      lb.frames = b.frames;
      lb.allocated = b.state == BlockState::kActiveAllocated;
      initial.emplace_back(b.address, lb);
    }
  }
  std::sort(initial.begin(), initial.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [addr, block] : initial) {
    block.label = labeler_ ? labeler_(-1, block.frames) : BlockLabel{};
    if (block.allocated && block.frames != 0) initial_allocated_with_frames_ += block.size;
    insert_live(addr, block);
  }
  // Orphan blocks: apply the no-split rule now that their neighbours are known.
  for (auto it = live_.begin(); it != live_.end(); ++it) {
    if (it->second.alloc_event != -1 || !orphaned.count(it->first)) continue;
    auto range = ranges_.upper_bound(it->first);
    if (range == ranges_.begin()) continue;
    --range;
    const int64_t range_end = range->first + range->second.size;
    auto next = std::next(it);
    const int64_t end = std::min(range_end, next == live_.end() ? range_end : next->first);
    const int64_t gap = end - (it->first + it->second.size);
    if (gap > 0 && range->second.is_large && !range->second.is_expandable && gap <= ar::kSmallSize) {
      it->second.size += gap;
      if (it->second.allocated) {
        allocated_ += gap;
        by_category_[it->second.label.category] += gap;
        if (it->second.label.site >= 0) by_site_[static_cast<size_t>(it->second.label.site)] += gap;
      }
    }
  }
  orphan_frees_ = static_cast<int64_t>(orphaned.size());
  initial_allocated_ = allocated_;
  initial_reserved_ = reserved_;
}

const Segment* Replay::dumped_segment_at(int64_t addr) const {
  // Segments do not overlap: the one starting last at or below addr is the
  // only candidate. (A scan per segment event made a trace that frees and
  // makes segments often quadratic: 14.6 s for 2*10^6 events beside 3000
  // dumped segments.)
  auto it = std::upper_bound(dumped_by_address_.begin(), dumped_by_address_.end(), addr,
                             [](int64_t a, const Segment* s) { return a < s->address; });
  if (it == dumped_by_address_.begin()) return nullptr;
  const Segment* s = *std::prev(it);
  return addr < s->address + s->total_size ? s : nullptr;
}

bool Replay::pool_of_range_is_large(int64_t addr, int64_t size) const {
  if (const Segment* s = dumped_segment_at(addr)) return s->is_large;
  // A small-pool segment is exactly kSmallBuffer (get_allocation_size()).
  return size != ar::kSmallBuffer;
}

bool Replay::range_is_private(int64_t addr) const {
  const Segment* s = dumped_segment_at(addr);
  return s != nullptr && s->in_private_pool();
}

void Replay::add_range(int64_t addr, const ReservedRange& range) {
  if (range.size <= 0) return;
  remove_range(addr, range.size);  // never double-count an overlap
  ranges_[addr] = range;
  reserved_ += range.size;
  if (!range.is_expandable) return;
  // Expandable mappings that touch form one segment (of one pool, one stream).
  auto same_segment = [](const ReservedRange& a, const ReservedRange& b) {
    return a.is_expandable && b.is_expandable && a.is_large == b.is_large && a.private_pool == b.private_pool &&
           a.stream == b.stream;
  };
  auto it = ranges_.find(addr);
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size == addr && same_segment(prev->second, it->second)) {
      prev->second.size += it->second.size;
      ranges_.erase(it);
      it = prev;
    }
  }
  auto next = std::next(it);
  if (next != ranges_.end() && it->first + it->second.size == next->first && same_segment(it->second, next->second)) {
    it->second.size += next->second.size;
    ranges_.erase(next);
  }
}

void Replay::remove_range(int64_t addr, int64_t size) {
  if (size <= 0) return;
  const int64_t end = addr + size;
  auto it = ranges_.upper_bound(addr);
  if (it != ranges_.begin()) --it;
  while (it != ranges_.end() && it->first < end) {
    const int64_t r_begin = it->first;
    const int64_t r_end = r_begin + it->second.size;
    if (r_end <= addr) {
      ++it;
      continue;
    }
    const ReservedRange r = it->second;
    it = ranges_.erase(it);
    reserved_ -= r.size;
    if (r_begin < addr) {
      ranges_[r_begin] = ReservedRange{addr - r_begin, r.is_large, r.is_expandable, r.private_pool, r.stream};
      reserved_ += addr - r_begin;
    }
    if (r_end > end) {
      ranges_[end] = ReservedRange{r_end - end, r.is_large, r.is_expandable, r.private_pool, r.stream};
      reserved_ += r_end - end;
      it = ranges_.upper_bound(end);
    }
  }
}

void Replay::insert_live(int64_t addr, LiveBlock block) {
  // A new block over a stale one: the stale one is gone.
  auto it = live_.upper_bound(addr);
  if (it != live_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size > addr) {
      ++inconsistencies_;
      release(prev);
    }
  }
  it = live_.lower_bound(addr);
  while (it != live_.end() && it->first < addr + block.size) {
    ++inconsistencies_;
    auto next = std::next(it);
    release(it);
    it = next;
  }
  if (block.allocated) {
    allocated_ += block.size;
    requested_ += block.requested;
    by_category_[block.label.category] += block.size;
    if (block.label.site >= 0) by_site_[static_cast<size_t>(block.label.site)] += block.size;
  }
  live_.emplace(addr, block);
}

void Replay::release(std::map<int64_t, LiveBlock>::iterator it) {
  const LiveBlock& b = it->second;
  if (b.allocated) {
    allocated_ -= b.size;
    requested_ -= b.requested;
    by_category_[b.label.category] -= b.size;
    if (b.label.site >= 0) by_site_[static_cast<size_t>(b.label.site)] -= b.size;
  }
  live_.erase(it);
}

int64_t Replay::block_size_at(int64_t addr, int64_t requested) const {
  const int64_t rounded = ar::round_size(requested, config_);
  auto range = ranges_.upper_bound(addr);
  if (range == ranges_.begin()) return rounded;
  --range;
  const int64_t range_end = range->first + range->second.size;
  if (addr >= range_end) return rounded;
  auto next = live_.upper_bound(addr);
  const int64_t end = next == live_.end() ? range_end : std::min(range_end, next->first);
  const int64_t gap = end - addr;
  if (gap < rounded) return rounded;
  const int64_t max_split = config_.max_split_size;
  return block_would_split(range->second.is_large, range->second.is_expandable, gap, rounded, max_split) ? rounded
                                                                                                         : gap;
}

void Replay::apply(size_t index) {
  const TraceEvent& e = (*trace_)[index];
  next_ = index + 1;
  switch (e.action) {
    case TraceAction::kAlloc: {
      LiveBlock b;
      b.requested = e.size;
      b.alloc_event = static_cast<int64_t>(index);
      b.frames = e.frames;
      b.size = last_alloc_[index] ? exact_size_[e.addr] : block_size_at(e.addr, e.size);
      auto range = ranges_.upper_bound(e.addr);
      if (range == ranges_.begin() || std::prev(range)->first + std::prev(range)->second.size <= e.addr) {
        ++inconsistencies_;  // outside every known segment
      }
      b.label = labeler_ ? labeler_(b.alloc_event, b.frames) : BlockLabel{};
      insert_live(e.addr, b);
      break;
    }
    case TraceAction::kFreeRequested: {
      auto it = live_.find(e.addr);
      if (it == live_.end()) {
        ++inconsistencies_;
      } else if (release_at_request_) {
        release(it);
      } else if (it->second.allocated) {
        LiveBlock& b = it->second;
        allocated_ -= b.size;
        requested_ -= b.requested;
        by_category_[b.label.category] -= b.size;
        if (b.label.site >= 0) by_site_[static_cast<size_t>(b.label.site)] -= b.size;
        b.allocated = false;
      }
      break;
    }
    case TraceAction::kFreeCompleted: {
      auto it = live_.find(e.addr);
      if (it == live_.end()) {
        ++inconsistencies_;
      } else {
        release(it);
      }
      break;
    }
    case TraceAction::kSegmentAlloc:
    case TraceAction::kSegmentMap:
      add_range(e.addr,
                ReservedRange{e.size, pool_of_range_is_large(e.addr, e.size), e.action == TraceAction::kSegmentMap,
                              range_is_private(e.addr), snapshot_->stream_of(e)});
      break;
    case TraceAction::kSegmentFree:
    case TraceAction::kSegmentUnmap: {
      // Blocks still live inside a freed range are stale.
      auto it = live_.lower_bound(e.addr);
      while (it != live_.end() && it->first < e.addr + e.size) {
        ++inconsistencies_;
        auto next = std::next(it);
        release(it);
        it = next;
      }
      remove_range(e.addr, e.size);
      break;
    }
    default:
      break;
  }
}

int64_t Replay::reserved_bytes(ar::Pool pool) const {
  int64_t total = 0;
  for (const auto& [addr, r] : ranges_) {
    if (r.is_large == (pool == ar::Pool::kLarge)) total += r.size;
  }
  return total;
}

bool RangeScope::covers(const ReservedRange& r) const {
  if (pools != PoolScope::kAll && r.private_pool != (pools == PoolScope::kPrivatePools)) return false;
  switch (streams) {
    case StreamScope::kOnly:
      return r.stream == stream;
    case StreamScope::kOthers:
      return r.stream != stream;
    default:
      return true;
  }
}

namespace {
/// Calls fn(gap_bytes, range) for each free gap in ranges of one pool within `scope`.
template <typename Fn>
void for_each_gap(const std::map<int64_t, ReservedRange>& ranges, const std::map<int64_t, LiveBlock>& live,
                  ar::Pool pool, const RangeScope& scope, Fn&& fn) {
  for (const auto& [addr, r] : ranges) {
    if (r.is_large != (pool == ar::Pool::kLarge) || !scope.covers(r)) continue;
    const int64_t end = addr + r.size;
    int64_t cursor = addr;
    auto it = live.upper_bound(addr);
    if (it != live.begin()) {
      auto prev = std::prev(it);
      cursor = std::max(cursor, prev->first + prev->second.size);
    }
    for (; it != live.end() && it->first < end; ++it) {
      if (it->first > cursor) fn(it->first - cursor, r);
      cursor = std::max(cursor, it->first + it->second.size);
    }
    if (end > cursor) fn(end - cursor, r);
  }
}
}  // namespace

int64_t Replay::free_bytes(ar::Pool pool, const RangeScope& scope) const {
  int64_t total = 0;
  for_each_gap(ranges_, live_, pool, scope, [&](int64_t gap, const ReservedRange&) { total += gap; });
  return total;
}

int64_t Replay::largest_free_block(ar::Pool pool, const RangeScope& scope) const {
  int64_t best = 0;
  for_each_gap(ranges_, live_, pool, scope, [&](int64_t gap, const ReservedRange&) { best = std::max(best, gap); });
  return best;
}

int64_t Replay::reserved_bytes_in(const RangeScope& scope) const {
  int64_t total = 0;
  for (const auto& [addr, r] : ranges_) total += scope.covers(r) ? r.size : 0;
  return total;
}

int64_t Replay::segments_in(const RangeScope& scope) const {
  return std::count_if(ranges_.begin(), ranges_.end(), [&](const auto& r) { return scope.covers(r.second); });
}

const ReservedRange* Replay::range_at(int64_t addr) const {
  auto it = ranges_.upper_bound(addr);
  if (it == ranges_.begin()) return nullptr;
  --it;
  return addr < it->first + it->second.size ? &it->second : nullptr;
}

int64_t Replay::fully_free_segment_bytes(const RangeScope& scope) const {
  int64_t total = 0;
  for (const auto& [addr, r] : ranges_) {
    if (!scope.covers(r)) continue;
    auto it = live_.upper_bound(addr);
    bool used = false;
    if (it != live_.begin() && std::prev(it)->first + std::prev(it)->second.size > addr) used = true;
    if (it != live_.end() && it->first < addr + r.size) used = true;
    if (!used) total += r.size;
  }
  return total;
}

}  // namespace oomtune::diagnose
