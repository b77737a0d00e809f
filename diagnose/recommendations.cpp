// What to change, each with what it would free and whether that is enough.
//
// Ranking (issue #48): with an out-of-memory, each fix is judged against what
// the failing phase still needed (phase_need.h, Note [Phase need]): "enough"
// when it frees at least that. The enough ones come first, least cost first
// (fixes.h); when none is enough alone, the best fix of each target
// (fragmentation, activations, optimizer state, leak) is added, most freed
// first, until together they are enough ("8-bit AdamW + expandable_segments");
// then the fixes that are not enough, most freed first; then the changes
// with no memory effect (the cap, a conflicting setting, a better snapshot).
// Without an out-of-memory: fixes least cost first.
//
// What each fix frees (USERS.md; sources cited per rule):
//   - Leak: fix it at the named site first (detach / .item() what is kept);
//     frees the growth seen over the trace and stops further growth.
//   - Fragmentation: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True first
//     (pytorch PR #113481: the better first resort). Judged by replaying the
//     trace with it (Note [Allocator settings replayed], setting_replay.h):
//     an expandable segment returns only whole free pages, so reserved but
//     free bytes in holes between live tensors stay reserved. Without a
//     replay (no bound on the memory, a trace the simulator cannot follow):
//     at most the reserved but unusable bytes at the oom.
//     max_split_size_mb only as the alternative when expandable segments
//     cannot be used, with a value derived from the sizes of large-pool
//     allocations (just above their 90th percentile, in MiB, at least 21,
//     below the failing request), judged by its replay too, and never
//     together with expandable_segments (pytorch #123548: the combination
//     errors).
//   - garbage_collection_threshold:0.8 when whole cached segments are free
//     at the oom (it frees them before a cudaMalloc, CUDACachingAllocator.cpp
//     garbage_collect_cached_blocks); frees those bytes.
//   - Activations (forward oom or peak, or activations >= 25% of allocated):
//     activation checkpointing frees ~83% of activations (docs/architecture.md: 85.9 MB
//     -> 14.5 MB retained on a 4-block GPT) at +24% to +48% step time
//     (docs/checkpointing.md, nine models on libtorch 1.13 CPU); half the
//     micro-batch with twice the gradient accumulation frees half of
//     activations + temporaries and keeps the global batch. In a forward
//     oom both also shrink the activations the forward still needed, so
//     they apply to the activations alive plus that need.
//   - Optimizer state (optimizer verdict, or optimizer state >= 25%): 8-bit
//     states keep 1 byte per state and parameter instead of 4 (frees 75%
//     of the state: of the whole states x gradients the first step
//     allocates when the need is that estimate, else of the state alive,
//     else of states x the parameters), offered as the bitsandbytes class
//     of the optimizer the trace names (AdamW8bit, RMSprop8bit, ...; 8-bit
//     AdamW where none is named; not offered for an optimizer bitsandbytes
//     has no 8-bit class of, OptimizerKind); CPU offload frees all of it
//     at the cost of host transfers.
//   - Trace: when it starts mid-run, covers fewer than 2 iterations or has
//     no frames, record with stacks="python" and max_entries = 3 x the
//     events of one iteration (>= 2 steps with margin; torchtitan PR #3628:
//     stacks="all" is 100x slower to dump).

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "allocsim/allocator_rules.h"
#include "common/byte_size.h"
#include "diagnose/diagnosis.h"

namespace oomtune::diagnose {
namespace {

/// The constructor call with fused=True for each class the name covers:
/// "torch.optim.Adam(..., fused=True) or torch.optim.AdamW(..., fused=True)"
/// for "Adam/AdamW" (OptimizerKind: torch 2.11's AdamW runs Adam's step).
std::string fused_call(std::string_view name) {
  std::string out;
  for (size_t begin = 0; begin <= name.size();) {
    const size_t end = std::min(name.find('/', begin), name.size());
    out += fmt::format("{}torch.optim.{}(..., fused=True)", out.empty() ? "" : " or ", name.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

constexpr double kCheckpointingSaving = 0.83;  // docs/architecture.md (from DESIGN.md): 85.9 MB -> 14.5 MB
constexpr double kEightBitSaving = 0.75;       // 8 -> 2 bytes of Adam state per parameter
constexpr double kMajorShare = 0.25;           // a category "matters" above this share
constexpr int64_t kMaxEntriesQuantum = 10000;
constexpr int64_t kMinMaxEntries = 100000;   // PyTorch's default max_entries
constexpr int64_t kSmallestMaxSplitMb = 21;  // PyTorch: max_split_size_mb > 20

int64_t cat(const CategoryBytes& c, Category k) { return c[static_cast<size_t>(k)]; }

/// The batch setting of the code that ran the forward without autograd
/// (TrainingArguments.per_device_eval_batch_size: transformers
/// training_args.py; Lightning takes its evaluation batches from the
/// DataLoaders its hooks return).
std::string halve_inference_batch(InferenceKind kind) {
  switch (kind) {
    case InferenceKind::kGenerate:
      return "Halve the batch passed to generate()";
    case InferenceKind::kTrainerEvaluation:
      return "Halve TrainingArguments(per_device_eval_batch_size=...)";
    case InferenceKind::kLightningEvaluation:
      return "Halve the batch_size of the val/test/predict DataLoader";
    case InferenceKind::kNothingSaved:
      return "Halve the batch passed to the model";
    case InferenceKind::kNoGrad:
    case InferenceKind::kNone:
      break;
  }
  return "Halve the batch (evaluate in smaller batches)";
}

bool conf_has(const std::string& conf, const char* key) { return conf.find(key) != std::string::npos; }

}  // namespace

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
  // PyTorch refuses max_split_size_mb <= kLargeBuffer / 1 MiB = 20
  // (c10/cuda/CUDAAllocatorConfig.cpp, parseMaxSplitSize); a value that
  // must reach the request to help does not help when the request is not
  // above 21 MiB.
  mb = std::max<int64_t>(mb, kSmallestMaxSplitMb);
  return mb < request_mb ? mb : 0;
}

std::string cap_bounds_text(const OomReport& oom) {
  return fmt::format(
      "between {}{} and {}{}", format_bytes(oom.cap_low_bytes),
      oom.cap_low_bytes > oom.reserved_bytes ? " (the most the trace reserved before)" : "",
      format_bytes(oom.cap_high_bytes),
      oom.cap_high_bytes < oom.reserved_bytes + oom.segment_bytes ? " (an earlier error's segment)" : "");
}

std::string stream_text(int64_t stream) {
  return stream == 0 ? "the default stream" : fmt::format("stream {:#x}", static_cast<std::uint64_t>(stream));
}

std::string largest_block_text(const OomReport& oom) {
  return fmt::format("largest free block in the {} pool{}", oom.large_pool ? "large" : "small",
                     oom.other_stream_segments > 0 ? " on " + stream_text(oom.stream) : "");
}

std::string sufficiency_text(const Recommendation& r) {
  const bool combined = r.id == FixId::kCombined;
  switch (r.sufficiency) {
    case Sufficiency::kEnough:
      return combined ? "enough together" : "enough";
    case Sufficiency::kNotEnough:
      return fmt::format("not enough {} (frees {}, needs {})", combined ? "even together" : "alone",
                         format_bytes(r.frees_bytes), format_bytes(r.needs_bytes));
    case Sufficiency::kEnoughIfCapAtLeast:
      return fmt::format("enough only with a memory cap of at least {}", format_bytes(r.smallest_cap_bytes));
    case Sufficiency::kEnoughUpToBlocks:
      return fmt::format("enough{} for a forward of at most {} blocks like these (needs at least {})",
                         combined ? " together" : "", r.most_blocks, format_bytes(r.needs_bytes));
    case Sufficiency::kEnoughForRequest:
      return fmt::format("enough{} for the failing request; what the rest of the phase needs is not in the snapshot",
                         combined ? " together" : "");
    case Sufficiency::kEnoughForRecomputation:
      return fmt::format(
          "enough{} for the rest of the block's recomputation (needs at least {}); the block's "
          "backward after it is not counted",
          combined ? " together" : "", format_bytes(r.needs_bytes));
    case Sufficiency::kEnoughForRecomputedBlocks:
      return fmt::format(
          "enough{} for the recomputations of the blocks still to come (needs at least {}); each block's backward "
          "beyond its recomputation is not counted",
          combined ? " together" : "", format_bytes(r.needs_bytes));
    case Sufficiency::kEnoughForBackwardBlocks:
      return fmt::format(
          "enough{} for the rest of backward's blocks (needs at least {}); what backward allocates after them is "
          "not counted",
          combined ? " together" : "", format_bytes(r.needs_bytes));
    case Sufficiency::kUnknown:
    case Sufficiency::kNoMemoryEffect:
      break;
  }
  return "";
}

namespace {

/// "X was reserved in N segments of WHERE at the out-of-memory, Y of it
/// free": the opening of the fixes for memory only some requests can use.
std::string stranded_text(int64_t reserved_bytes, int64_t segments, std::string_view where, int64_t free_bytes) {
  return fmt::format("{} was reserved in {} segment{} of {} at the out-of-memory, {} of it free",
                     format_bytes(reserved_bytes), segments, segments == 1 ? "" : "s", where, format_bytes(free_bytes));
}

// Note [Enough for how many blocks]
// Rationale: in a first forward the need counts only the rest of the
// current block (phase_need.h, forward blocks): the blocks after it are
// not in the trace. Judged against that lower bound, halving the
// micro-batch read "enough" on the real GPT snapshot (frees 4.00 GiB of a
// need of 648 MiB) while its forward had 5 more blocks of 1.13 GiB to make.
// Approach: a fix frees F + s N of a need N (s = need_share: the part that
// shrinks the activations still to come), so it is enough while N <= F /
// (1 - s). With N = n0 + k b (n0 the rest of the current block, b what a
// complete block keeps) that allows k <= (F / (1 - s) - n0) / b more blocks:
// the fix is "enough for a forward of at most done + 1 + k blocks like
// these". Halving the micro-batch (s = 1/2) is enough while the forward
// still needs no more than what it holds; checkpointing (s = 0.83) while it
// needs up to 4.9 times that.
// Where the parameters say how many blocks follow the current one (Note
// [Blocks from the parameters]), N already counts them (blocks_after), and
// the count starts after them.

// Note [Enough for the request only]
// Rationale: when nothing in the trace says what the failing phase still
// needed (phase_need.h, rule 6), the need is the request alone, and a fix
// that frees it read "enough". On a real Hugging Face GPT-2 out of memory
// in its first forward (an H200, 2026-11-29, under an 8 GiB cap), the
// replay with expandable_segments:True served the 24 MiB request and was
// ranked first as "enough", while the forward had its last block, the
// 1.5 GiB of fp32 logits (8 x 1024 x 50257) and the loss still to come.
// (Rule 3 now reads that snapshot's blocks; an oomtune trial's frameless
// snapshot still has only its request, gpu_trial_gpt_oom.pickle.)
// Approach: such a fix is "enough for the failing request" (a verdict of
// its own); these come after the surely enough ones, those that free the
// most first (the likelier to cover what is not in the snapshot), least
// cost among equals.

/// Judges one fix against the need: sufficiency, needs_bytes and, for a
/// lower-bound need, most_blocks (Note [Enough for how many blocks]).
void judge(const PhaseNeed& need, Recommendation& r) {
  const int64_t needs = need.still_needed_bytes;
  r.needs_bytes = needs;
  // Note [Enough for the request only]
  const Sufficiency enough =
      need.method == NeedMethod::kRequest ? Sufficiency::kEnoughForRequest
      : need.method == NeedMethod::kRecomputedBlock
          ? (need.blocks_after > 0 ? Sufficiency::kEnoughForRecomputedBlocks : Sufficiency::kEnoughForRecomputation)
      : need.method == NeedMethod::kBackwardBlocks ? Sufficiency::kEnoughForBackwardBlocks
                                                   : Sufficiency::kEnough;
  if (r.replayed) {
    r.sufficiency = r.replay_fits && r.most_blocks > 0 ? Sufficiency::kEnoughUpToBlocks
                    : r.replay_fits                    ? enough
                    : r.smallest_cap_bytes > 0         ? Sufficiency::kEnoughIfCapAtLeast
                                                       : Sufficiency::kNotEnough;
    return;
  }
  if (r.frees_bytes < needs) {
    r.sufficiency = Sufficiency::kNotEnough;
    return;
  }
  if (!need.lower_bound || need.block_bytes <= 0 || r.need_share >= 1) {
    r.sufficiency = enough;
    return;
  }
  const double fixed = static_cast<double>(r.frees_bytes) - r.need_share * static_cast<double>(needs);
  const double most_needed = fixed / (1 - r.need_share);
  const double more = std::floor((most_needed - static_cast<double>(needs)) / static_cast<double>(need.block_bytes));
  r.most_blocks = need.blocks_done + 1 + need.blocks_after + std::max<int64_t>(0, static_cast<int64_t>(more));
  r.sufficiency = Sufficiency::kEnoughUpToBlocks;
}

/// An allocator setting judged by its replay (Note [Allocator settings
/// replayed]). When it fits, it frees the need itself. When it fails, it
/// frees the S bytes of the need it served first (the request, then the
/// rest; the real run served none), plus R - R' where the replay then held
/// less reserved (R') than the real run at the out-of-memory (R): reserve
/// that held no tensor, too little for the next request. (A replay that
/// fails before the request compares an earlier R'.)
void judge_by_replay(const Diagnosis& d, const OomReport& oom, const std::string& setting, const SettingReplay& r,
                     Recommendation& rec) {
  if (!r.replayed) return;
  const SettingReplay& recorded = d.as_recorded_replay;
  const std::string caveat = recorded.replayed && !recorded.reproduces(oom.event_index)
                                 ? fmt::format("; approximate: under the snapshot's own settings the same replay {}",
                                               as_recorded_clause(recorded, oom.event_index))
                                 : "";
  rec.replayed = true;
  rec.replay_fits = r.fits;
  rec.smallest_cap_bytes = r.smallest_cap_bytes;
  if (r.fits) {
    rec.frees_bytes = std::max(d.need.still_needed_bytes, oom.rounded_bytes);
    rec.estimate = fmt::format("the trace replayed with {}: {}", setting,
                               d.need.method == NeedMethod::kRequest
                                   ? "the request fits (the rest of the phase's need is not in the snapshot)"
                                   : fmt::format("the request and {} fit", need_covers(d.need)));
    // A lower-bound need (Note [Enough for how many blocks]): the blocks
    // after the current one fit in what the cap leaves.
    if (d.need.lower_bound && d.need.block_bytes > 0) {
      rec.most_blocks = d.need.blocks_done + 1 + d.need.blocks_after + r.headroom_bytes / d.need.block_bytes;
      rec.estimate += fmt::format(", with {} to spare under the cap", format_bytes(r.headroom_bytes));
    }
    rec.estimate += caveat;
  } else {
    rec.frees_bytes = r.served_bytes + std::max<int64_t>(0, oom.reserved_bytes - r.reserved_bytes);
    rec.estimate = fmt::format(
        "the trace replayed with {}: {}{} still fails, at {} reserved; the real allocator had {} then{}", setting,
        r.served_bytes <= 0 ? ""
        : r.served_bytes <= oom.requested_bytes
            ? fmt::format("it serves the {} request; then ", format_bytes(r.served_bytes))
            : fmt::format("it serves the request and {} more of the need; then ",
                          format_bytes(r.served_bytes - oom.requested_bytes)),
        failure_phrase(r, oom.event_index), format_bytes(r.reserved_bytes), format_bytes(oom.reserved_bytes),
        r.smallest_cap_bytes > 0 ? fmt::format(". It fits under a cap of {} or more (the trace puts the cap {})",
                                               format_bytes(r.smallest_cap_bytes), cap_bounds_text(oom))
                                 : "");
    rec.estimate += caveat;
  }
}

/// Judges every fix against the need and puts them in the order of the rules above.
void rank(Diagnosis& d, std::vector<Recommendation> fixes, std::vector<Recommendation> no_effect) {
  auto cost = [](const Recommendation& r) { return fix_kind(r.id).cost; };
  std::vector<Recommendation>& out = d.recommendations;
  if (!d.need.known) {
    std::stable_sort(fixes.begin(), fixes.end(), [&](const auto& a, const auto& b) { return cost(a) < cost(b); });
    out = std::move(fixes);
    out.insert(out.end(), no_effect.begin(), no_effect.end());
    return;
  }
  const int64_t needs = d.need.still_needed_bytes;
  std::vector<Recommendation> enough, short_of;
  for (Recommendation& r : fixes) {
    judge(d.need, r);
    (r.sufficiency == Sufficiency::kNotEnough ? short_of : enough).push_back(r);
  }
  // Surely enough first, then those enough for the most blocks, then those
  // enough for the request that free the most (Note [Enough for the
  // request only]); least cost first among equals.
  std::stable_sort(enough.begin(), enough.end(), [&](const auto& a, const auto& b) {
    const bool a_sure = a.sufficiency == Sufficiency::kEnough, b_sure = b.sufficiency == Sufficiency::kEnough;
    if (a_sure != b_sure) return a_sure;
    if (a.most_blocks != b.most_blocks) return a.most_blocks > b.most_blocks;
    const bool a_request = a.sufficiency == Sufficiency::kEnoughForRequest;
    const bool b_request = b.sufficiency == Sufficiency::kEnoughForRequest;
    if (a_request && b_request && a.frees_bytes != b.frees_bytes) return a.frees_bytes > b.frees_bytes;
    return cost(a) < cost(b);
  });
  std::stable_sort(short_of.begin(), short_of.end(),
                   [](const auto& a, const auto& b) { return a.frees_bytes > b.frees_bytes; });

  // None enough alone: the best of each target together, most freed first, until enough.
  std::vector<Recommendation> combined;
  if (enough.empty()) {
    std::vector<const Recommendation*> best;  // one per target
    for (const Recommendation& r : short_of) {
      const FixTarget target = fix_kind(r.id).target;
      const bool taken = std::any_of(best.begin(), best.end(),
                                     [&](const Recommendation* b) { return fix_kind(b->id).target == target; });
      if (!taken && r.frees_bytes > 0) best.push_back(&r);  // short_of is most-freed first
    }
    Recommendation c;
    c.id = FixId::kCombined;
    std::string changes, frees, reasons;
    for (const Recommendation* r : best) {
      if (c.frees_bytes >= needs) break;
      c.parts.push_back(r->id);
      c.part_frees_bytes.push_back(r->frees_bytes);
      c.frees_bytes += r->frees_bytes;
      c.need_share += r->need_share;
      changes += std::string(changes.empty() ? "" : " + ") + (r->label.empty() ? fix_kind(r->id).label : r->label);
      frees += std::string(frees.empty() ? "" : " + ") + format_bytes(r->frees_bytes);
      reasons += std::string(reasons.empty() ? "" : "; ") + r->change;
    }
    if (c.parts.size() >= 2) {
      c.change = changes;
      c.reason = fmt::format("No single change frees the {} that {} still needed; together: {}.", format_bytes(needs),
                             need_prose(d.need), reasons);
      c.estimate = frees;
      judge(d.need, c);
      combined.push_back(std::move(c));
    }
  }
  const bool combined_enough = !combined.empty() && combined.front().sufficiency != Sufficiency::kNotEnough;
  out = std::move(enough);
  if (combined_enough) out.insert(out.end(), combined.begin(), combined.end());
  out.insert(out.end(), short_of.begin(), short_of.end());
  if (!combined_enough) out.insert(out.end(), combined.begin(), combined.end());
  out.insert(out.end(), no_effect.begin(), no_effect.end());
}

}  // namespace

void recommend(Diagnosis& d) {
  std::vector<Recommendation> out;        // fixes that free memory
  std::vector<Recommendation> no_effect;  // settings and advice
  const OomReport* oom = d.ooms.empty() ? nullptr : &d.ooms.back();
  const CategoryBytes& cats = oom ? oom->live_by_category : d.peak.by_category;
  const int64_t allocated = std::max<int64_t>(1, oom ? oom->allocated_bytes : d.peak.allocated_bytes);
  auto has_verdict = [&](VerdictId id) {
    return std::any_of(d.verdicts.begin(), d.verdicts.end(), [&](const Verdict& v) { return v.id == id; });
  };
  const AllocatorSettings& s = d.allocator_settings;
  const PhaseNeed& need = d.need;
  if (!d.leaks.empty()) {
    const LeakSuspect& l = d.leaks.front();
    int64_t growth = 0;
    for (const auto& x : d.leaks) growth += x.last_live_bytes - x.first_live_bytes;
    out.push_back(Recommendation{
        FixId::kFixLeak, fmt::format("Fix the leak at {}", l.site.site),
        fmt::format("What this site allocates is never freed (+{} per iteration). Typical cause: a tensor kept "
                    "across iterations with its autograd graph (e.g. losses.append(loss)); keep loss.item() or "
                    "loss.detach() instead.",
                    format_bytes(l.growth_per_iteration_bytes)),
        growth, "growth of the leaking sites over the trace; it would keep growing with more iterations"});
  }

  if (oom && has_verdict(VerdictId::kEvalOutputsAccumulated)) {
    // Note [Evaluation outputs]: the largest K that frees what is needed.
    const EvalOutputs& e = oom->eval_outputs;
    const EvalAccumulation k = eval_accumulation(e, need.known ? need.still_needed_bytes : oom->rounded_bytes);
    const auto steps = [](int64_t n) { return fmt::format("{} step{}", n, n == 1 ? "" : "s"); };
    std::string basis = "the outputs alive";
    if (e.step_bytes > 0 && k.steps > 1) basis += fmt::format(" beyond {}", steps(k.steps - 1));
    if (e.at_concat)
      basis += k.steps == 1 ? " + the failing concatenation (none at 1 step)"
                            : fmt::format(" + the failing concatenation beyond {}", steps(k.steps));
    if (e.step_bytes > 0) basis += fmt::format(", at {} a step", format_bytes(e.step_bytes));
    out.push_back(Recommendation{
        FixId::kEvalAccumulation, fmt::format("TrainingArguments(eval_accumulation_steps={})", k.steps),
        fmt::format("The evaluation then moves its outputs to the CPU every {} (to_cpu_and_numpy), so no "
                    "concatenation holds more than {}. If the metrics need no logits, prediction_loss_only=True keeps "
                    "none; if they need only the predicted ids, return logits.argmax(-1) from "
                    "preprocess_logits_for_metrics, which keeps one id per token instead of a score per "
                    "vocabulary entry.",
                    k.steps == 1 ? "step" : steps(k.steps),
                    e.step_bytes > 0
                        ? fmt::format("{}' outputs ({})", steps(k.steps), format_bytes(k.steps * e.step_bytes))
                        : "one step's outputs"),
        k.frees_bytes, basis});
  }

  if (oom && oom->fragmentation && !s.expandable_segments) {
    Recommendation expandable{
        FixId::kExpandableSegments, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        fmt::format("{} was reserved but free at the out-of-memory, and the {} was {}; with expandable segments "
                    "the allocator maps pages into one growing segment per stream, so free memory is not "
                    "stranded in fixed-size segments. Of the allocator settings, try this one first (pytorch PR "
                    "#113481).",
                    format_bytes(oom->reserved_free_bytes), largest_block_text(*oom),
                    format_bytes(oom->largest_free_block_bytes)),
        oom->reserved_free_bytes, "reserved but unallocated bytes at the out-of-memory, at most: not replayed"};
    judge_by_replay(d, *oom, "expandable_segments:True", d.expandable_replay, expandable);
    out.push_back(std::move(expandable));
    const int64_t mb = d.max_split_mb;
    if (mb > 0 && oom->pool_free_bytes > 0) {  // with no free bytes in the pool it frees nothing
      Recommendation split{
          FixId::kMaxSplitSize, fmt::format("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{}", mb),
          fmt::format("Only if expandable_segments cannot be used, and never together with it (pytorch "
                      "#123548). {} MiB is just above the 90th percentile of the large-pool blocks alive at the "
                      "out-of-memory (at least 21: PyTorch refuses 20 and less) and below the {} request: blocks "
                      "of {} MiB or more are then never split by smaller tensors, so large free blocks stay "
                      "whole, while every smaller request keeps to blocks below it. It can slow allocation "
                      "(pytorch PR #113481).",
                      mb, format_bytes(oom->rounded_bytes), mb),
          oom->pool_free_bytes, "up to the free bytes of the pool, if large blocks stay unsplit: not replayed"};
      judge_by_replay(d, *oom, fmt::format("max_split_size_mb:{}", mb), d.max_split_replay, split);
      out.push_back(std::move(split));
    }
  }
  if (oom && oom->fully_free_segment_bytes > 0 && s.garbage_collection_threshold == 0.0) {
    out.push_back(Recommendation{
        FixId::kGarbageCollection, "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8",
        fmt::format("{} sat in cached segments with no live block at the out-of-memory; above 80% of the budget "
                    "the allocator then returns such segments before calling cudaMalloc.",
                    format_bytes(oom->fully_free_segment_bytes)),
        oom->fully_free_segment_bytes, "bytes in fully free cached segments at the out-of-memory"});
  }
  if (conf_has(s.conf, "max_split_size_mb") &&
      (s.expandable_segments || conf_has(s.conf, "expandable_segments:True"))) {
    no_effect.push_back(Recommendation{
        FixId::kConflict, "Remove max_split_size_mb from PYTORCH_CUDA_ALLOC_CONF",
        "max_split_size_mb together with expandable_segments errors or is ignored (pytorch #123548); keep "
        "expandable_segments.",
        0, "no memory effect; avoids a configuration error", Sufficiency::kNoMemoryEffect});
  }

  const int64_t act = cat(cats, Category::kActivations);
  const int64_t temp = cat(cats, Category::kTemporaries);
  // A forward oom, or one recomputing a checkpointed block: the activations
  // still to come shrink too (Note [Phase need]).
  const bool recomputing = need.known && need.method == NeedMethod::kRecomputedBlock;
  const int64_t act_to_come =
      need.known && (need.phase == Phase::kForward || recomputing) ? need.still_needed_bytes : 0;
  const std::string act_basis =
      act_to_come > 0 ? fmt::format(" + the {} the {} still needed", format_bytes(act_to_come),
                                    recomputing ? (need.blocks_after > 0 ? "recomputations" : "recomputation")
                                    : need.later_peak_bytes > 0 ? "forward and the backward after it"
                                                                : "forward")
                      : "";
  const TraceSummary& t = d.trace;
  const bool checkpointing_on = t.checkpointed_forward_allocs > 0;
  // A forward without autograd (generate(), an evaluation under no_grad)
  // keeps nothing for backward: checkpointing has nothing to drop, and the
  // batch is not a micro-batch of a training step.
  const bool inference = has_verdict(VerdictId::kInferenceForward);
  if (act > 0 && (has_verdict(VerdictId::kActivationsInForward) || has_verdict(VerdictId::kBackwardPeak) || inference ||
                  static_cast<double>(act) >= kMajorShare * static_cast<double>(allocated))) {
    if (inference) {
      // No checkpointing fix: nothing is saved for backward (the verdict says so).
    } else if (checkpointing_on) {
      // Note [Checkpointing already on]
      // Forward allocations inside torch.utils.checkpoint (FrameIndex::
      // checkpointed) mean the job checkpoints: what stays of its forward
      // is the checkpointed blocks' inputs, and turning it on frees nothing
      // more. Say so, rather than recommend it (docs/diagnose.md).
      no_effect.push_back(Recommendation{
          FixId::kCheckpointingOn, "Activation checkpointing is already on",
          fmt::format("{} of the {} allocations in forward ran inside torch.utils.checkpoint, which keeps only "
                      "each checkpointed block's inputs for backward and recomputes the rest there. Checkpoint "
                      "any repeated block still outside it, or apply the changes above.",
                      t.checkpointed_forward_allocs, t.forward_alloc_events),
          0, "no memory effect; already applied", Sufficiency::kNoMemoryEffect});
    } else {
      // The head's logits and the loss's log_softmax (Note [A language
      // model's head]) come after the checkpointed blocks: checkpointing
      // keeps them all.
      const int64_t head = act_to_come > 0 ? std::min(need.head_bytes + need.loss_bytes, act_to_come) : 0;
      out.push_back(Recommendation{
          FixId::kActivationCheckpointing, "Activation checkpointing on the model's repeated blocks",
          fmt::format("{} of activations were alive{}; recomputing them in backward keeps only block inputs "
                      "(oomtune autotune applies it; +24% to +48% step time on the nine models measured in "
                      "docs/checkpointing.md).",
                      format_bytes(act), oom ? " at the out-of-memory" : " at the peak"),
          static_cast<int64_t>(std::llround(kCheckpointingSaving * static_cast<double>(act + act_to_come - head))),
          "83% of activations" + act_basis +
              (head > 0 ? fmt::format(" but the head's logits and the loss's log_softmax ({}), outside the blocks",
                                      format_bytes(head))
                        : "") +
              ", as measured on a 4-block GPT (docs/architecture.md)"});
      if (act_to_come > 0) out.back().need_share = kCheckpointingSaving;
    }
    out.push_back(Recommendation{
        FixId::kMicroBatch,
        inference ? halve_inference_batch(oom->inference_kind)
                  : "Halve the micro-batch and double gradient accumulation steps",
        inference ? "What a forward without autograd keeps (a KV cache, outputs) and its temporaries scale with the "
                    "batch, as they do with the sequence length."
                  : "Activations and temporaries scale with the micro-batch; the global batch (micro-batch x "
                    "accumulation steps) stays the same.",
        (act + temp + act_to_come) / 2,
        std::string(inference ? "half of what the forward kept" : "half of activations") + " + temporaries alive then" +
            act_basis});
    if (act_to_come > 0) out.back().need_share = 0.5;
  }

  const int64_t state = cat(cats, Category::kOptimizerState);
  const int64_t params = cat(cats, Category::kParameters);
  if (has_verdict(VerdictId::kOptimizerStateAllocation) ||
      static_cast<double>(state) >= kMajorShare * static_cast<double>(allocated)) {
    // The whole state the step keeps: the first step's estimate, else what
    // is alive, else the optimizer's states (Adam's two) x parameters.
    const OptimizerKind* optimizer = d.optimizer;
    const int states = optimizer ? optimizer->states_per_parameter : 2;
    const bool first_step = need.known && need.method == NeedMethod::kOptimizerFirstStep;
    const int64_t base = first_step ? need.state_total_bytes : state > 0 ? state : states * params;
    const std::string what = first_step  ? "the first step allocates in all"
                             : state > 0 ? "alive"
                                         : fmt::format("about to be allocated ({} x parameters)", states);
    // The temporaries of its arithmetic still to come (an optimizer step's need):
    // bitsandbytes' 8-bit step updates each parameter in place and an
    // offloaded step runs on the host, so neither makes them on the device.
    const bool step_need = first_step || (need.known && need.method == NeedMethod::kOptimizerStep);
    const int64_t temporaries = step_need ? need.temporaries_left_bytes : 0;
    const std::string and_temporaries =
        temporaries > 0 ? fmt::format(" + the {} temporaries of its arithmetic still to come, which it does not make",
                                      format_bytes(temporaries))
                        : "";
    const int64_t eight_bit_frees = std::llround(kEightBitSaving * static_cast<double>(base)) + temporaries;
    const std::string eight_bit_estimate =
        fmt::format("75% of the optimizer state ({} {}){}", format_bytes(base), what, and_temporaries);
    if (!optimizer) {
      out.push_back(Recommendation{FixId::kAdamW8bit, "8-bit AdamW (blockwise-quantized states)",
                                   fmt::format("Adam/AdamW keeps two fp32 states per parameter ({} {}); 8-bit "
                                               "states need a quarter.",
                                               format_bytes(base), what),
                                   eight_bit_frees, eight_bit_estimate});
    } else if (!optimizer->eight_bit.empty()) {
      // bitsandbytes' class of the same optimizer; none for NAdam, RAdam, ...: a change of optimizer is not offered.
      out.push_back(Recommendation{
          FixId::kAdamW8bit,
          fmt::format("8-bit {} ({}: blockwise-quantized states)", optimizer->name, optimizer->eight_bit),
          fmt::format("{} keeps {} in fp32 ({} {}); 8-bit states need a quarter.", optimizer->name, optimizer->states,
                      format_bytes(base), what),
          eight_bit_frees, eight_bit_estimate});
      out.back().label = fmt::format("8-bit {}", optimizer->name);
    }
    // fused=True: the same update in one kernel, without the foreach
    // implementation's whole-list temporaries (torch 2.11: Adam, AdamW and
    // SGD on CUDA).
    if (temporaries > 0 && need.implementation == OptimizerImplementation::kForeach && optimizer &&
        optimizer->fused_on_cuda) {
      out.push_back(Recommendation{
          FixId::kFusedOptimizer, fused_call(optimizer->name),
          fmt::format("The foreach implementation{} holds temporaries of the whole parameter list ({} at its peak); "
                      "the fused kernel updates each parameter in place, with the same result and usually faster.",
                      need.implementation_basis == ImplementationBasis::kHostStepCounters
                          ? ", PyTorch's default on CUDA (assumed: its step counters are on the host, so not fused),"
                      : need.implementation_basis == ImplementationBasis::kDefaultDevice
                          ? ", PyTorch's default on CUDA (assumed: its step counters, made under a default device, "
                            "do not tell),"
                      : need.implementation_assumed() ? ", PyTorch's default on CUDA (assumed: no frame shows it),"
                                                      : " (the step's frames)",
                      format_bytes(need.temporaries_total_bytes)),
          temporaries, fmt::format("the {} of foreach temporaries still to come", format_bytes(temporaries))});
    }
    if (base + temporaries > 0)
      out.push_back(Recommendation{
          FixId::kOptimizerOffload, "Offload optimizer states to host memory",
          "The optimizer step then runs on the CPU copy; GPU memory keeps only parameters and gradients.",
          base + temporaries, fmt::format("all optimizer state ({} {}){}", format_bytes(base), what, and_temporaries)});
  }

  // Note [Private memory pools]
  if (oom && !oom->captures_cuda_graph && oom->private_pool_free_bytes > 0) {
    out.push_back(Recommendation{
        FixId::kPrivatePools,
        "Run without CUDA graphs, or free their pools: torch.compile(mode=\"max-autotune-no-cudagraphs\") "
        "(or the default mode) instead of \"reduce-overhead\"; del graphs no longer replayed "
        "(torch._dynamo.reset() for compiled ones); release a torch.cuda.MemPool no longer used",
        fmt::format("{}, which the rest of the program cannot use. Without CUDA graphs (+launch overhead: each "
                    "kernel launched from the host again) their tensors come from the default pool, where freed "
                    "memory serves every request.",
                    stranded_text(oom->private_pool_reserved_bytes, oom->private_pool_segments, "private memory pools",
                                  oom->private_pool_free_bytes)),
        oom->private_pool_free_bytes,
        "the private pools' free bytes at the out-of-memory; what their graphs keep allocated is needed either "
        "way"});
  }

  // Note [Memory on other streams]
  if (oom && oom->other_stream_free_bytes > 0) {
    out.push_back(Recommendation{
        FixId::kOtherStreams,
        "Make a side stream's tensors on the stream that uses them, or keep fewer of them alive: create the "
        "tensor (torch.empty) before `with torch.cuda.stream(side):` and fill it inside, then "
        "torch.cuda.current_stream().wait_stream(side); drop side-stream tensors once their last use is done",
        fmt::format("{}, which the failing request's stream cannot use: the allocator keeps a freed block for "
                    "the stream whose segment holds it, and a live tensor in each of those segments kept it from "
                    "going back to CUDA{}. Memory made on one stream is reused by every later request on it.",
                    stranded_text(oom->other_stream_reserved_bytes, oom->other_stream_segments, "other streams",
                                  oom->other_stream_free_bytes),
                    oom->other_stream_holders.empty()
                        ? ""
                        : fmt::format("; the site that made most of those tensors: {} ({})",
                                      oom->other_stream_holders.front().site,
                                      format_bytes(oom->other_stream_holders.front().bytes))),
        oom->other_stream_free_bytes,
        "other streams' free bytes at the out-of-memory, had their tensors come from the failing request's "
        "stream: not replayed"});
  }

  if (oom && oom->memory_cap) {
    no_effect.push_back(Recommendation{
        FixId::kMemoryCap, "Raise or remove torch.cuda.set_per_process_memory_fraction, if the cap is not deliberate",
        // The cap's bounds as the memory_cap verdict and the event list give them.
        fmt::format("The device had {} free at the out-of-memory; the cap, {}, refused the {} segment. "
                    "Keep it when it is there on purpose (a GPU shared with other jobs) and apply the changes "
                    "above instead.",
                    format_bytes(oom->device_free_bytes), cap_bounds_text(*oom), format_bytes(oom->segment_bytes)),
        0,
        fmt::format("no memory effect; a larger budget, up to {} more (CUDA's free bytes then){}",
                    format_bytes(oom->device_free_bytes),
                    need.known ? fmt::format(", against the {} that {} still needed",
                                             format_bytes(need.still_needed_bytes), need_prose(need))
                               : ""),
        Sufficiency::kNoMemoryEffect});
  }

  const bool no_frames = t.alloc_events > 0 && t.alloc_events_without_frames == t.alloc_events;
  // Iterations are training steps (forward, then backward); an inference or
  // evaluation out-of-memory has none to cover.
  const bool few_steps = t.iterations < 2 && !inference && !has_verdict(VerdictId::kEvalOutputsAccumulated);
  if (t.truncated || few_steps || no_frames) {
    const int64_t per_iteration = std::max<int64_t>(t.events_per_iteration, 1);
    int64_t entries = 3 * per_iteration;
    entries = (entries + kMaxEntriesQuantum - 1) / kMaxEntriesQuantum * kMaxEntriesQuantum;
    entries = std::max(entries, kMinMaxEntries);
    std::string why;
    if (t.truncated)
      why = "the trace starts mid-run (it frees blocks it never saw allocated)";
    else if (t.events == 0 && t.layout_has_traces && t.allocated_before_trace_with_frames_bytes > 0)
      why =
          "the snapshot's blocks carry stacks but it holds no history (enabled=\"state\" keeps none: "
          "enabled=\"all\", the default, keeps both)";
    else if (few_steps)
      why = fmt::format("the trace covers {} iteration{}", t.iterations, t.iterations == 1 ? "" : "s");
    if (no_frames) why += std::string(why.empty() ? "" : "; ") + "no allocation has frames";
    no_effect.push_back(Recommendation{
        FixId::kRecordMore,
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
        0, "no memory effect; a better next snapshot", Sufficiency::kNoMemoryEffect});
  }
  rank(d, std::move(out), std::move(no_effect));
}

}  // namespace oomtune::diagnose
