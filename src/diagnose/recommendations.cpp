// What to change, in the order to try it, each with what it would free.
//
// Rules (USERS.md; sources cited per rule):
//   - Leak: fix it at the named site first (detach / .item() what is kept);
//     frees the growth seen over the trace and stops further growth.
//   - Fragmentation: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True first
//     (pytorch PR #113481: the better first resort); frees the reserved but
//     unusable bytes at the oom, since an expandable segment maps pages
//     where the request needs them (c10 Note [Expandable Segments]).
//     max_split_size_mb only as the alternative when expandable segments
//     cannot be used, with a value derived from the sizes of large-pool
//     allocations (just above their 90th percentile, in MiB, and below the
//     failing request), and never together with expandable_segments
//     (pytorch #123548: the combination errors).
//   - garbage_collection_threshold:0.8 when whole cached segments are free
//     at the oom (it frees them before a cudaMalloc, CUDACachingAllocator.cpp
//     garbage_collect_cached_blocks); frees those bytes.
//   - Activations (forward oom or peak, or activations >= 25% of allocated):
//     activation checkpointing frees ~83% of activations (DESIGN.md: 85.9 MB
//     -> 14.5 MB retained on a 4-block GPT) at +24% to +48% step time
//     (docs/checkpointing.md, nine models on libtorch 1.13 CPU); half the
//     micro-batch with twice the gradient accumulation frees half of
//     activations + temporaries and keeps the global batch.
//   - Optimizer state (optimizer verdict, or optimizer state >= 25%): 8-bit
//     AdamW keeps 2 bytes per parameter instead of 8 (frees 75% of the
//     state; if no state is alive yet, 2 x fp32 parameter bytes are about to
//     be allocated, of which it saves 1.5 x parameters); CPU offload frees
//     all of it at the cost of host transfers.
//   - Trace: when it starts mid-run, covers fewer than 2 iterations or has
//     no frames, record with stacks="python" and max_entries = 3 x the
//     events of one iteration (>= 2 steps with margin; torchtitan PR #3628:
//     stacks="all" is 100x slower to dump).

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "common/byte_size.h"
#include "diagnose/diagnosis.h"
#include "probes/allocator_rules.h"

namespace oomtune::diagnose {
namespace {

constexpr double kCheckpointingSaving = 0.83;  // DESIGN.md measurement (85.9 MB -> 14.5 MB)
constexpr double kEightBitSaving = 0.75;       // 8 -> 2 bytes of Adam state per parameter
constexpr double kMajorShare = 0.25;           // a category "matters" above this share
constexpr int64_t kMaxEntriesQuantum = 10000;
constexpr int64_t kMinMaxEntries = 100000;     // PyTorch's default max_entries

int64_t cat(const CategoryBytes& c, Category k) { return c[static_cast<size_t>(k)]; }

bool conf_has(const std::string& conf, const char* key) { return conf.find(key) != std::string::npos; }

/// max_split_size_mb from the sizes of large-pool blocks alive at the moment of interest.
int64_t max_split_mb(const Diagnosis& d, const OomReport& oom) {
  std::vector<int64_t> sizes;
  for (const SegmentView& s : d.segment_map) {
    if (!s.is_large) continue;
    for (const auto& b : s.blocks) sizes.push_back(b.size);
  }
  if (sizes.empty()) return 0;
  std::sort(sizes.begin(), sizes.end());
  const int64_t p90 = sizes[std::min(sizes.size() - 1, sizes.size() * 9 / 10)];
  int64_t mb = p90 / kMiB + 1;
  const int64_t request_mb = oom.rounded_bytes / kMiB;
  if (request_mb > 1 && mb >= request_mb) mb = request_mb - 1;
  return std::max<int64_t>(mb, 2);  // PyTorch requires > 1 MiB (kLargeBuffer rules)
}

}  // namespace

void recommend(Diagnosis& d) {
  auto& out = d.recommendations;
  const OomReport* oom = d.ooms.empty() ? nullptr : &d.ooms.back();
  const CategoryBytes& cats = oom ? oom->live_by_category : d.peak.by_category;
  const int64_t allocated = std::max<int64_t>(1, oom ? oom->allocated_bytes : d.peak.allocated_bytes);
  const std::string verdict = d.verdicts.empty() ? "" : d.verdicts.front().id;
  auto has_verdict = [&](const char* id) {
    return std::any_of(d.verdicts.begin(), d.verdicts.end(), [&](const Verdict& v) { return v.id == id; });
  };
  const AllocatorSettings& s = d.allocator_settings;

  if (!d.leaks.empty()) {
    const LeakSuspect& l = d.leaks.front();
    int64_t growth = 0;
    for (const auto& x : d.leaks) growth += x.last_live_bytes - x.first_live_bytes;
    out.push_back(Recommendation{
        "fix_leak", fmt::format("Fix the leak at {}", l.site.site),
        fmt::format("What this site allocates is never freed (+{} per iteration). Typical cause: a tensor kept "
                    "across iterations with its autograd graph (e.g. losses.append(loss)); keep loss.item() or "
                    "loss.detach() instead.",
                    format_bytes(l.growth_per_iteration_bytes)),
        growth, "growth of the leaking sites over the trace; it would keep growing with more iterations"});
  }

  if (oom && oom->fragmentation) {
    if (!s.expandable_segments) {
      out.push_back(Recommendation{
          "expandable_segments", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
          fmt::format("The {} that was reserved but free at the out-of-memory lay in blocks of at most {}; with "
                      "expandable segments the allocator maps pages into one growing segment per stream, so "
                      "free memory is not stranded in fixed-size segments. Try this first (pytorch PR #113481).",
                      format_bytes(oom->reserved_free_bytes), format_bytes(oom->largest_free_block_bytes)),
          oom->reserved_free_bytes, "reserved but unallocated bytes at the out-of-memory"});
      const int64_t mb = max_split_mb(d, *oom);
      if (mb > 0) {
        out.push_back(Recommendation{
            "max_split_size", fmt::format("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{}", mb),
            fmt::format("Only if expandable_segments cannot be used, and never together with it (pytorch "
                        "#123548). {} MiB is just above the 90th percentile of the large-pool blocks alive at the "
                        "out-of-memory and below the {} request: blocks of {} MiB or more are then never split by "
                        "smaller tensors, so large free blocks stay whole. It can slow allocation (pytorch PR "
                        "#113481).",
                        mb, format_bytes(oom->rounded_bytes), mb),
            oom->pool_free_bytes, "up to the free bytes of the pool, if large blocks stay unsplit"});
      }
    }
  }
  if (oom && oom->fully_free_segment_bytes > 0 && s.garbage_collection_threshold == 0.0) {
    out.push_back(Recommendation{
        "garbage_collection", "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8",
        fmt::format("{} sat in cached segments with no live block at the out-of-memory; above 80% of the budget "
                    "the allocator then returns such segments before calling cudaMalloc.",
                    format_bytes(oom->fully_free_segment_bytes)),
        oom->fully_free_segment_bytes, "bytes in fully free cached segments at the out-of-memory"});
  }
  if (conf_has(s.conf, "max_split_size_mb") && (s.expandable_segments || conf_has(s.conf, "expandable_segments:True"))) {
    out.push_back(Recommendation{
        "conflict", "Remove max_split_size_mb from PYTORCH_CUDA_ALLOC_CONF",
        "max_split_size_mb together with expandable_segments errors or is ignored (pytorch #123548); keep "
        "expandable_segments.",
        0, "no memory effect; avoids a configuration error"});
  }

  const int64_t act = cat(cats, Category::kActivations);
  const int64_t temp = cat(cats, Category::kTemporaries);
  if (act > 0 && (has_verdict("activations_in_forward") || has_verdict("backward_peak") ||
                  static_cast<double>(act) >= kMajorShare * static_cast<double>(allocated))) {
    out.push_back(Recommendation{
        "activation_checkpointing", "Activation checkpointing on the model's repeated blocks",
        fmt::format("{} of activations were alive{}; recomputing them in backward keeps only block inputs "
                    "(oomtune autotune applies it; +24% to +48% step time on the nine models measured in "
                    "docs/checkpointing.md).",
                    format_bytes(act), oom ? " at the out-of-memory" : " at the peak"),
        static_cast<int64_t>(std::llround(kCheckpointingSaving * static_cast<double>(act))),
        "83% of activations, as measured on a 4-block GPT (DESIGN.md)"});
    out.push_back(Recommendation{
        "micro_batch", "Halve the micro-batch and double gradient accumulation steps",
        "Activations and temporaries scale with the micro-batch; the global batch (micro-batch x accumulation "
        "steps) stays the same.",
        (act + temp) / 2, "half of activations + temporaries alive then"});
  }

  const int64_t state = cat(cats, Category::kOptimizerState);
  const int64_t params = cat(cats, Category::kParameters);
  if (has_verdict("optimizer_state_allocation") ||
      static_cast<double>(state) >= kMajorShare * static_cast<double>(allocated)) {
    const int64_t base = state > 0 ? state : 2 * params;
    out.push_back(Recommendation{
        "adamw_8bit", "8-bit AdamW (blockwise-quantized states)",
        fmt::format("Adam/AdamW keeps two fp32 states per parameter ({} {}); 8-bit states need a quarter.",
                    format_bytes(base), state > 0 ? "alive" : "about to be allocated (2 x parameters)"),
        static_cast<int64_t>(std::llround(kEightBitSaving * static_cast<double>(base))), "75% of optimizer state"});
    out.push_back(Recommendation{
        "optimizer_offload", "Offload optimizer states to host memory",
        "The optimizer step then runs on the CPU copy; GPU memory keeps only parameters and gradients.", base,
        "all optimizer state"});
  }

  if (oom && oom->memory_cap) {
    out.push_back(Recommendation{
        "memory_cap", "Raise or remove torch.cuda.set_per_process_memory_fraction, if the cap is not deliberate",
        fmt::format("The device had {} free at the out-of-memory; the cap, below {}, refused the {} segment. "
                    "Keep it when it is there on purpose (a GPU shared with other jobs) and apply the changes "
                    "above instead.",
                    format_bytes(oom->device_free_bytes), format_bytes(oom->reserved_bytes + oom->segment_bytes),
                    format_bytes(oom->segment_bytes)),
        0, fmt::format("no memory effect; a larger budget, up to {} more (CUDA's free bytes then)",
                       format_bytes(oom->device_free_bytes))});
  }

  const TraceSummary& t = d.trace;
  const bool no_frames = t.alloc_events > 0 && t.alloc_events_without_frames == t.alloc_events;
  if (t.truncated || t.iterations < 2 || no_frames) {
    const int64_t per_iteration = std::max<int64_t>(t.events_per_iteration, 1);
    int64_t entries = 3 * per_iteration;
    entries = (entries + kMaxEntriesQuantum - 1) / kMaxEntriesQuantum * kMaxEntriesQuantum;
    entries = std::max(entries, kMinMaxEntries);
    std::string why;
    if (t.truncated) why = "the trace starts mid-run (it frees blocks it never saw allocated)";
    else if (t.iterations < 2) why = fmt::format("the trace covers {} iteration{}", t.iterations, t.iterations == 1 ? "" : "s");
    if (no_frames) why += std::string(why.empty() ? "" : "; ") + "no allocation has frames";
    out.push_back(Recommendation{
        "record_more",
        fmt::format("torch.cuda.memory._record_memory_history(max_entries={}, stacks=\"python\") before the model "
                    "is built",
                    entries),
        fmt::format("{}: record at least 2 steps ({}) with Python stacks only "
                    "(stacks=\"all\" dumps are ~100x slower, torchtitan PR #3628).",
                    why,
                    // Under two iterations no per-iteration count exists: the
                    // whole trace is at most one step.
                    t.iterations >= 2 ? fmt::format("{} events per iteration seen", per_iteration)
                                      : fmt::format("{} events in the whole trace", t.events)),
        0, "no memory effect; a better next snapshot"});
  }
}

}  // namespace oomtune::diagnose
