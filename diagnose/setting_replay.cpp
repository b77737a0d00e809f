#include "diagnose/setting_replay.h"

#include <algorithm>
#include <map>
#include <unordered_set>

#include <fmt/format.h>

#include "allocsim/caching_allocator_sim.h"
#include "common/byte_size.h"
#include "common/error.h"

namespace oomtune::diagnose {
namespace {

namespace sim = oomtune::allocsim;

// Ids for requests the trace does not name by address (earlier
// out-of-memories, the rest of the need): above every device address.
constexpr std::uint64_t kExtraIdBase = std::uint64_t{1} << 62;
// Traces up to this long bisect the cap to 2 MiB.
constexpr size_t kExactTraceEvents = 100000;

// The pool an alloc at `address` targets: the private pool whose dumped
// segment holds it, else the default pool.
sim::PoolId pool_at(const std::vector<PrivatePoolRange>& ranges, int64_t address) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), address,
                             [](int64_t a, const PrivatePoolRange& r) { return a < r.address; });
  if (it == ranges.begin()) return sim::kDefaultPool;
  --it;
  return address < it->address + it->bytes ? it->pool : sim::kDefaultPool;
}

// The stream trace event `e` was made on.
sim::StreamId stream_of(const SettingReplayInput& input, const TraceEvent& e) {
  return input.snapshot != nullptr ? input.snapshot->stream_of(e) : sim::kDefaultStream;
}

// The replay at one cap.
SettingReplay replay_at(const SettingReplayInput& input, const alloc_rules::AllocatorConfig& config, int64_t cap) {
  SettingReplay out;
  const std::vector<TraceEvent>& trace = *input.trace;
  sim::SimOptions options;
  options.config = config;
  (input.cap_is_budget ? options.budget_bytes : options.device_total_bytes) = cap;
  // A trace with free_completed releases blocks there; one without, at free_requested.
  const TraceAction release = records_free_completed(trace) ? TraceAction::kFreeCompleted : TraceAction::kFreeRequested;
  std::uint64_t next_extra = kExtraIdBase;
  sim::CachingAllocatorSim allocator(options);
  std::unordered_set<std::uint64_t> live;  // trace addresses the simulator holds
  const std::vector<PrivatePoolRange>& ranges = input.private_pool_ranges;
  if (!config.expandable_segments && !input.initial_segments.empty()) {
    for (const sim::ExistingSegment& segment : input.initial_segments) {
      allocator.add_existing_segment(segment);
      for (const sim::ExistingBlock& b : segment.allocated_blocks) live.insert(b.id);
    }
    allocator.use_segment_addresses(input.segment_addresses);
  } else {
    for (const InitialBlock& b : input.initial_blocks) {
      const auto id = static_cast<std::uint64_t>(b.address);
      if (allocator.malloc(id, b.bytes, pool_at(ranges, b.address), b.stream)) live.insert(id);
    }
  }
  sim::PoolId last_private = sim::kDefaultPool;  // of the latest alloc that went to a private pool
  out.replayed = true;
  auto fail = [&](int64_t event, int64_t bytes, bool in_need) {
    out.failed_event = event;
    out.failed_bytes = bytes;
    out.failed_in_need = in_need;
    out.reserved_bytes = allocator.reserved_bytes();
    return out;
  };
  size_t next_empty_cache = 0;
  for (size_t i = 0; i < input.oom_index && i < trace.size(); ++i) {
    const TraceEvent& e = trace[i];
    if (next_empty_cache < input.empty_cache_at.size() && input.empty_cache_at[next_empty_cache] == i) {
      allocator.empty_cache();
      ++next_empty_cache;
    }
    const auto id = static_cast<std::uint64_t>(e.addr);
    if (e.action == TraceAction::kAlloc) {
      if (live.count(id)) throw InputError(fmt::format("trace event {}: an alloc at a live address", i));
      const sim::PoolId pool = pool_at(ranges, e.addr);
      if (pool != sim::kDefaultPool) last_private = pool;
      if (!allocator.malloc(id, e.size, pool, stream_of(input, e))) return fail(static_cast<int64_t>(i), e.size, false);
      live.insert(id);
    } else if (e.action == release) {
      if (live.erase(id)) allocator.free(id);
    } else if (e.action == TraceAction::kOom) {
      // The program went on without this request: try it, give it back.
      const std::uint64_t extra = next_extra++;
      if (allocator.malloc(extra, e.size, sim::kDefaultPool, stream_of(input, e))) allocator.free(extra);
    }
  }
  const sim::PoolId request_pool = input.request_in_graph_capture ? last_private : sim::kDefaultPool;
  const int64_t request = trace[input.oom_index].size;
  const sim::StreamId request_stream = stream_of(input, trace[input.oom_index]);
  if (!allocator.malloc(next_extra++, request, request_pool, request_stream)) {
    return fail(static_cast<int64_t>(input.oom_index), request, false);
  }
  out.served_bytes = request;
  // The rest of the phase's need, as requests of the failing request's size.
  const int64_t rounded = alloc_rules::round_size(request, config);
  for (int64_t left = input.still_needed_bytes - rounded; left > 0; left -= rounded) {
    const int64_t bytes = std::min(left, rounded);
    if (!allocator.malloc(next_extra++, bytes, request_pool, request_stream)) {
      return fail(static_cast<int64_t>(input.oom_index), bytes, true);
    }
    out.served_bytes += bytes;
  }
  out.served_bytes = std::max(request, input.still_needed_bytes);
  out.fits = true;
  out.reserved_bytes = allocator.reserved_bytes();
  out.headroom_bytes = std::max<int64_t>(0, cap - out.reserved_bytes);
  return out;
}

// `replay()`, or replayed = false with the reason where the trace does not
// fit the simulator (an alloc at a live address, a free of an unknown one).
template <typename Fn>
SettingReplay unless_unreplayable(Fn replay) {
  try {
    return replay();
  } catch (const Error& e) {
    SettingReplay out;
    out.failure = e.what();
    return out;
  }
}

}  // namespace

std::vector<PrivatePoolRange> private_pool_ranges(const Snapshot& snapshot, int device) {
  std::vector<const Segment*> segments;
  for (const Segment& s : snapshot.segments) {
    // As Replay: a snapshot with one device's trace is that device's.
    const bool of_device = s.device == device || snapshot.device_traces.size() <= 1;
    if (of_device && s.in_private_pool()) segments.push_back(&s);
  }
  std::sort(segments.begin(), segments.end(),
            [](const Segment* a, const Segment* b) { return a->address < b->address; });
  std::map<std::pair<int64_t, int64_t>, sim::PoolId> numbers;
  std::vector<PrivatePoolRange> ranges;
  for (const Segment* s : segments) {
    const sim::PoolId pool = numbers.emplace(s->pool_id, static_cast<sim::PoolId>(numbers.size() + 1)).first->second;
    ranges.push_back({s->address, s->total_size, pool});
  }
  return ranges;
}

std::vector<sim::ExistingSegment> existing_segments(const Replay& replay,
                                                    const std::vector<PrivatePoolRange>& private_ranges) {
  std::vector<sim::ExistingSegment> segments;
  size_t blocks_placed = 0;
  for (const auto& [address, range] : replay.ranges()) {
    if (range.is_expandable) return {};
    sim::ExistingSegment segment;
    segment.address = static_cast<std::uint64_t>(address);
    segment.bytes = range.size;
    segment.pool = range.is_large ? alloc_rules::Pool::kLarge : alloc_rules::Pool::kSmall;
    segment.memory_pool = range.private_pool ? pool_at(private_ranges, address) : sim::kDefaultPool;
    segment.stream = range.stream;
    const int64_t end = address + range.size;
    for (auto it = replay.live().lower_bound(address); it != replay.live().end() && it->first < end; ++it) {
      if (it->first + it->second.size > end) return {};
      sim::ExistingBlock b;
      b.id = static_cast<std::uint64_t>(it->first);
      b.address = static_cast<std::uint64_t>(it->first);
      b.bytes = it->second.size;
      b.requested_bytes = it->second.requested;
      segment.allocated_blocks.push_back(b);
    }
    blocks_placed += segment.allocated_blocks.size();
    segments.push_back(std::move(segment));
  }
  if (blocks_placed != replay.live().size()) return {};  // a block outside every range
  return segments;
}

std::vector<size_t> empty_cache_calls(const std::vector<TraceEvent>& trace, const FrameIndex& frames) {
  std::vector<size_t> calls;
  bool in_call = false;
  for (size_t i = 0; i < trace.size(); ++i) {
    const TraceEvent& e = trace[i];
    const bool freed = e.action == TraceAction::kSegmentFree || e.action == TraceAction::kSegmentUnmap;
    const bool by_call = freed && frames.calls_empty_cache(e.frames);
    if (by_call && !in_call) calls.push_back(i);
    in_call = by_call;
  }
  return calls;
}

SettingReplay replay_with_setting(const SettingReplayInput& input, const alloc_rules::AllocatorConfig& config) {
  return unless_unreplayable([&] {
    SettingReplay out = replay_at(input, config, input.cap_low_bytes);
    if (out.fits || !input.cap_is_budget || input.cap_high_bytes - 1 <= input.cap_low_bytes) return out;
    // Fails at the lowest cap: find the smallest cap below the highest that serves it.
    if (!replay_at(input, config, input.cap_high_bytes - 1).fits) return out;
    int64_t fails = input.cap_low_bytes, fits = input.cap_high_bytes - 1;
    // To 2 MiB; a long trace, each replay of which takes seconds, to 1/32 of the range.
    const int64_t step = input.trace->size() <= kExactTraceEvents
                             ? alloc_rules::kRoundLarge
                             : std::max(alloc_rules::kRoundLarge, (fits - fails) / 32);
    while (fits - fails > step) {
      const int64_t mid = fails + (fits - fails) / 2;
      (replay_at(input, config, mid).fits ? fits : fails) = mid;
    }
    out.smallest_cap_bytes = fits;
    return out;
  });
}

SettingReplay replay_as_recorded(const SettingReplayInput& input, const alloc_rules::AllocatorConfig& config) {
  return unless_unreplayable([&] { return replay_at(input, config, input.cap_low_bytes); });
}

std::string as_recorded_clause(const SettingReplay& r, int64_t oom_event) {
  if (!r.replayed) return "";
  if (r.reproduces(oom_event)) return "runs out of memory at the same request, as the real allocator did";
  if (r.fits || r.failed_in_need) return "serves the request, which the real allocator refused";
  return fmt::format("fails already at event {} (a {} request), before the out-of-memory", r.failed_event,
                     format_bytes(r.failed_bytes));
}

std::string failure_phrase(const SettingReplay& r, int64_t oom_event) {
  if (r.failed_in_need) {
    return fmt::format("the rest of the phase's need (a {} request after it)", format_bytes(r.failed_bytes));
  }
  if (r.failed_event != oom_event) {
    return fmt::format("a {} request at event {}, before it,", format_bytes(r.failed_bytes), r.failed_event);
  }
  return fmt::format("the {} request", format_bytes(r.failed_bytes));
}

}  // namespace oomtune::diagnose
