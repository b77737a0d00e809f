#include "allocsim/length_replay.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"

namespace oomtune::allocsim {

double LengthRun::reserved_over_allocated() const {
  if (totals.peak_allocated_bytes == 0) return 0.0;
  return static_cast<double>(totals.peak_reserved_bytes) / static_cast<double>(totals.peak_allocated_bytes);
}

LengthRun replay_lengths(const LengthModel& step, const std::vector<int64_t>& persistent_bytes,
                         const std::vector<int64_t>& lengths, const SimOptions& options, const Bucketing& bucketing) {
  if (lengths.size() > 1 && step.carried_out() != step.carried_in())
    throw InputError(
        fmt::format("length replay: the step carries {} allocations out and frees {} made before it: not a steady step",
                    step.carried_out(), step.carried_in()));
  CachingAllocatorSim sim(options);
  std::uint64_t next_id = 1;
  for (int64_t bytes : persistent_bytes) sim.malloc(next_id++, bytes);

  LengthRun run;
  std::vector<std::uint64_t> carried;  // the previous step's carried-out ids, in order
  std::vector<std::uint64_t> fresh;    // template event index -> this step's id
  for (int64_t drawn : lengths) {
    const int64_t length = pad_length(drawn, bucketing);
    const std::vector<AllocEvent> events = step.at(length);
    const std::vector<std::size_t>& partners = step.partners();
    const SimResult before = sim.result();
    LengthStep record;
    record.length = length;
    fresh.assign(events.size(), 0);
    std::vector<std::uint64_t> carried_out;
    std::size_t next_carried = 0;
    for (std::size_t i = 0; i < events.size(); ++i) {
      if (events[i].kind == AllocEventKind::kAlloc) {
        fresh[i] = next_id++;
        sim.malloc(fresh[i], events[i].bytes);
        if (partners[i] == LengthModel::kCarriedIn) carried_out.push_back(fresh[i]);
      } else if (partners[i] != LengthModel::kCarriedIn) {
        sim.free(fresh[partners[i]]);
      } else if (next_carried < carried.size()) {
        sim.free(carried[next_carried++]);
      }
      record.peak_allocated_bytes = std::max(record.peak_allocated_bytes, sim.allocated_bytes());
      record.peak_reserved_bytes = std::max(record.peak_reserved_bytes, sim.reserved_bytes());
    }
    carried = std::move(carried_out);
    const SimResult& after = sim.result();
    record.reserved_bytes = sim.reserved_bytes();
    record.device_allocs = after.num_device_alloc - before.num_device_alloc;
    record.alloc_retries = after.num_alloc_retries - before.num_alloc_retries;
    record.oom = after.num_ooms > before.num_ooms;
    run.tokens += length;
    run.steps.push_back(record);
  }
  run.totals = sim.result();
  return run;
}

std::vector<LengthPolicy> compare_length_policies(const LengthModel& step, const std::vector<int64_t>& persistent_bytes,
                                                  const std::vector<int64_t>& lengths, const SimOptions& options,
                                                  const std::vector<int64_t>& multiples) {
  int64_t drawn_tokens = 0;
  for (int64_t length : lengths) drawn_tokens += length;
  std::vector<LengthPolicy> policies;
  auto add = [&](std::string name, bool expandable, Bucketing bucketing) {
    LengthPolicy policy;
    policy.name = std::move(name);
    policy.expandable_segments = expandable;
    policy.bucketing = bucketing;
    SimOptions run_options = options;
    run_options.config.expandable_segments = expandable;
    policy.run = replay_lengths(step, persistent_bytes, lengths, run_options, bucketing);
    policy.padded_tokens_ratio =
        drawn_tokens > 0 ? static_cast<double>(policy.run.tokens) / static_cast<double>(drawn_tokens) : 1.0;
    policies.push_back(std::move(policy));
  };
  add("as drawn", false, {});
  add("expandable_segments", true, {});
  for (int64_t multiple : multiples) {
    Bucketing bucketing{Bucketing::Kind::kMultiple, multiple};
    add(bucketing.name(), false, bucketing);
  }
  const Bucketing power_of_two{Bucketing::Kind::kPowerOfTwo, 1};
  add(power_of_two.name(), false, power_of_two);
  return policies;
}

const LengthPolicy& recommended_policy(const std::vector<LengthPolicy>& policies) {
  if (policies.empty()) throw InputError("length policies: none to choose from");
  // Under a budget: those that never run out of memory, then those that
  // never flush the cache (each retry frees every cached block and
  // synchronizes); each rule applies only where some policy passes it.
  std::vector<const LengthPolicy*> candidates;
  for (const LengthPolicy& p : policies) candidates.push_back(&p);
  const auto keep = [&candidates](auto passes) {
    std::vector<const LengthPolicy*> kept;
    for (const LengthPolicy* p : candidates)
      if (passes(*p)) kept.push_back(p);
    if (!kept.empty()) candidates = std::move(kept);
  };
  keep([](const LengthPolicy& p) { return p.run.totals.num_ooms == 0; });
  keep([](const LengthPolicy& p) { return p.run.totals.num_alloc_retries == 0; });
  int64_t least = candidates.front()->run.totals.peak_reserved_bytes;
  for (const LengthPolicy* p : candidates) least = std::min(least, p->run.totals.peak_reserved_bytes);
  const LengthPolicy* best = nullptr;
  for (const LengthPolicy* p : candidates) {
    if (static_cast<double>(p->run.totals.peak_reserved_bytes) > 1.01 * static_cast<double>(least)) continue;
    if (!best || p->padded_tokens_ratio < best->padded_tokens_ratio) best = p;
  }
  return *best;
}

}  // namespace oomtune::allocsim
