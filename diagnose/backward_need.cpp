#include "diagnose/need_rules.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "common/byte_size.h"
#include "diagnose/period_runs.h"

namespace oomtune::diagnose {
namespace {

constexpr size_t kMaxTurnFrees = 4096;  // backward's latest frees of forward tensors read for its turns

/// An allocation as a recomputation repeats it: its layer frame
/// (FrameIndex::layer_frame) and requested bytes.
struct AllocKey {
  int64_t layer = -1;
  int64_t bytes = 0;
  bool operator==(const AllocKey& o) const { return layer == o.layer && bytes == o.bytes; }
};

struct AllocKeyHash {
  size_t operator()(const AllocKey& k) const {
    return std::hash<int64_t>()(k.layer) ^ (std::hash<int64_t>()(k.bytes) * 0x9E3779B97F4A7C15ULL);
  }
};

AllocKey alloc_key(const FrameIndex& frames, const TraceEvent& e) { return {frames.layer_frame(e.frames), e.size}; }

/// The keys of the allocations of events [first, end) that recompute a
/// checkpointed block, up to the first allocation that does not.
std::vector<AllocKey> recomputation_keys(const std::vector<TraceEvent>& trace, const FrameIndex& frames, size_t first,
                                         size_t end) {
  std::vector<AllocKey> keys;
  for (size_t i = first; i < end; ++i) {
    if (trace[i].action != TraceAction::kAlloc && trace[i].action != TraceAction::kOom) continue;
    if (!frames.recomputes(trace[i].frames)) break;
    keys.push_back(alloc_key(frames, trace[i]));
  }
  return keys;
}

/// The allocations of forward in events [begin, end) inside checkpoint()
/// (FrameIndex::checkpointed), as (layer, bytes), in trace order.
std::vector<AllocKey> checkpointed_forward_keys(const std::vector<TraceEvent>& trace, const Attribution& attr,
                                                const FrameIndex& frames, size_t begin, size_t end) {
  std::vector<AllocKey> keys;
  for (size_t i = begin; i < end; ++i) {
    if (trace[i].action == TraceAction::kAlloc && attr.event_phase[i] == Phase::kForward &&
        frames.checkpointed(trace[i].frames))
      keys.push_back(alloc_key(frames, trace[i]));
  }
  return keys;
}

/// How often `run` lies in a row in `keys` (a block's runs in forward).
int64_t occurrences(const std::vector<AllocKey>& keys, const std::vector<AllocKey>& run) {
  int64_t count = 0;
  for (size_t j = 0; j + run.size() <= keys.size(); ++j) {
    if (std::equal(run.begin(), run.end(), keys.begin() + static_cast<std::ptrdiff_t>(j))) ++count;
  }
  return count;
}

/// Where the forward of backward run `run`'s iteration begins: after the
/// last backward or optimizer event before it.
size_t iteration_forward_begin(const Attribution& attr, const PhaseRun& run) {
  size_t begin = run.first_event;
  while (begin > 0 && attr.event_phase[begin - 1] != Phase::kBackward &&
         attr.event_phase[begin - 1] != Phase::kOptimizer) {
    --begin;
  }
  return begin;
}

// Note [The turns after a recomputed block]
// Rationale: an out-of-memory in backward's first checkpointed block (the
// model's last) has no turn before it to read the turns from (Note [Blocks
// in backward]), so rule 5 counted the rest of the block's recomputation
// alone: 0.04 to 0.47 of what the run without the cap allocated from there
// on eight recorded model families (bench/needs), a fix judged enough by
// it far from enough.
// Approach: where this is backward's first recomputation, the model's
// blocks show in its parameters (Note [Blocks from the parameters]) as
// often as the block's recomputation so far shows among forward's
// allocations inside checkpoint(), and the gradients alive are at least
// the parameters after the blocks (the layers after them train, their
// gradients made first: with them frozen, as LoRA leaves them, nothing is
// counted; a few KiB of the engine's other tensors count as gradients
// too, hence not "any"), each turn keeps its block's
// parameters' gradients, G, and frees its checkpointed input, I (forward's
// allocations inside checkpoint() still alive, a block's output each and
// what checkpoint saved beside it, over the blocks before the last): it
// ends N = G - I higher. So turn j
// after this one starts j x N - R above now, R what this recomputation
// holds so far, and its recomputation rises as far as this one will:
// (turns - 1) x N + the rest of the recomputation is a peak; after the
// last turn, turns x N - R and the parameters before the blocks' gradients
// (and a tied head's sum, Note [Blocks in backward]) is another.
// Limitations: a lower bound: each block's backward beyond its
// recomputation is not counted; blocks whose parameters are frozen while
// the head trains get gradients counted they never make.

/// Note [The turns after a recomputed block]: raises `need` (rule 5's,
/// the rest of the recomputation `rest`) by the turns after the first;
/// false where it does not apply.
bool turns_after_first_recomputation(const NeedQuery& q, const PhaseRun& run, const std::vector<TraceEvent>& trace,
                                     const Attribution& attr, const FrameIndex& frames, const ParameterLayout& layout,
                                     const std::vector<AllocKey>& recomputed, size_t recomputation_start, int64_t rest,
                                     PhaseNeed& need) {
  // The layers after the blocks train: backward made their gradients first (a head tied and moved with
  // .to() has its gradient too, the embedding's size).
  int64_t after_blocks = layout.moved_without_head() ? layout.embedding_bytes : 0;
  for (const int64_t bytes : layout.tail_sizes) after_blocks += bytes;
  if (layout.blocks < 2 || layout.block_bytes <= 0 || after_blocks <= 0 ||
      q.live[static_cast<size_t>(Category::kGradients)] < after_blocks)
    return false;
  for (size_t i = run.first_event; i < recomputation_start; ++i) {
    if (trace[i].action == TraceAction::kAlloc && frames.recomputes(trace[i].frames)) return false;  // not the first
  }
  // This iteration's forward inside checkpoint(): its allocations, and those still alive now.
  const size_t forward_begin = iteration_forward_begin(attr, run);
  const int64_t turns =
      occurrences(checkpointed_forward_keys(trace, attr, frames, forward_begin, run.first_event), recomputed);
  if (turns != layout.blocks) return false;
  const int64_t inputs = bytes_alive(trace, forward_begin, q.oom_event, [&](size_t i) {
    return i < run.first_event && attr.event_phase[i] == Phase::kForward && frames.checkpointed(trace[i].frames);
  });
  const int64_t input = inputs / (turns - 1);
  const int64_t net = layout.block_bytes - input;
  if (net <= 0) return false;
  // What this recomputation holds now.
  const int64_t holds = bytes_alive(trace, recomputation_start, q.oom_event, [](size_t) { return true; });
  const int64_t tied_sum = layout.head_tied() ? layout.embedding_bytes : 0;
  const int64_t later = (turns - 1) * net + rest;
  const int64_t end = turns * net - holds + layout.stem_bytes + tied_sum;
  need.model_blocks = turns;
  need.blocks_after = turns - 1;
  need.block_net_bytes = net;
  need.block_so_far_bytes = holds;
  need.stem_gradient_bytes = layout.stem_bytes;
  need.tied_gradient_sum_bytes = tied_sum;
  need.still_needed_bytes = std::max({need.still_needed_bytes, later, end});
  need.estimate += fmt::format(
      "; then {} more block{} (the model's parameters repeat in {}), each turn keeping its {} of parameters' "
      "gradients and freeing its {} checkpointed input: the last one's recomputation {} above now{}; each block's "
      "backward beyond its recomputation is not counted",
      turns - 1, turns == 2 ? "" : "s", turns, format_bytes(layout.block_bytes), format_bytes(input),
      format_bytes(later),
      end <= later ? ""
                   : fmt::format("; after the blocks, the {} of parameters before them get their gradients{}: {} "
                                 "above now (this recomputation's {} freed)",
                                 format_bytes(layout.stem_bytes),
                                 tied_sum > 0 ? fmt::format(" and the token embedding's is added to the tied head's "
                                                            "({})",
                                                            format_bytes(tied_sum))
                                              : "",
                                 format_bytes(end), format_bytes(holds)));
  return true;
}

}  // namespace

// Note [Recomputed block]
// Rationale: with activation checkpointing, backward reruns each block's
// forward (torch/utils/checkpoint.py: recompute_fn, or unpack_hook, for
// use_reentrant=False; CheckpointFunction.backward for use_reentrant=True).
// An out-of-memory there fails one allocation of a block that had already
// run once, in forward; a fix judged against the request alone fails at the
// recomputation's next allocation.
// Approach: the recomputation so far (its allocations since the last
// backward allocation that is not a recomputation's) and the failing
// request, each as its layer frame and requested bytes, are looked up in
// forward's allocations: the last place where they appear in a row
// (backward recomputes the last block first: the latest such run is that
// block, or one of the same shapes). From the failing request's
// counterpart on, the forward's growth is replayed: allocations add; frees
// of what the matched run allocated subtract; it ends with forward, at an
// allocation outside checkpoint(), or where the next block starts (the
// recomputation's first allocation, by layer and bytes, again). Its peak is
// what the rest of the recomputation allocated at least: a recomputation
// keeps the tensors saved for backward on top of what the forward kept
// (non-reentrant: _checkpoint_hook stores them until backward unpacks
// them; reentrant: the rerun forward's graph holds them), so it grows at
// least as far.
// Limitations: a lower bound; the block's own backward, after its
// recomputation, is not counted. Non-reentrant checkpointing stops a
// recomputation early by default (torch/utils/checkpoint.py,
// set_checkpoint_early_stop: once backward's last saved tensor is
// recomputed), so forward's last allocations (the block's output) may not
// be repeated; the block's backward, uncounted, then allocates at least
// their gradients. A recomputation whose shapes differ from its forward (a
// random choice inside the block) matches nothing: then the request alone.
bool recomputed_block(const NeedQuery& q, const PhaseRun& run, const std::vector<TraceEvent>& trace,
                      const Attribution& attr, const FrameIndex& frames, const ParameterLayout& layout,
                      PhaseNeed& need) {
  const TraceEvent& oom = trace[q.oom_event];
  if (q.phase != Phase::kBackward || !frames.recomputes(oom.frames)) return false;
  auto key_of = [&](const TraceEvent& e) { return alloc_key(frames, e); };
  // The recomputation so far, last allocation first, then reversed.
  std::vector<AllocKey> recomputed{key_of(oom)};
  size_t recomputation_start = q.oom_event;  // its first allocation
  for (size_t i = q.oom_event; i-- > run.first_event;) {
    if (trace[i].action != TraceAction::kAlloc) continue;
    if (!frames.recomputes(trace[i].frames)) break;
    recomputed.push_back(key_of(trace[i]));
    recomputation_start = i;
  }
  std::reverse(recomputed.begin(), recomputed.end());
  std::vector<size_t> forward;  // forward's allocation events, in trace order
  for (size_t i = 0; i < run.first_event; ++i) {
    if (trace[i].action == TraceAction::kAlloc && attr.event_phase[i] == Phase::kForward) forward.push_back(i);
  }
  const size_t k = recomputed.size();
  if (forward.size() < k) return false;
  size_t match = forward.size() - k + 1;  // the first of the latest run of k matching allocations
  while (match-- > 0) {
    size_t j = k;
    while (j > 0 && key_of(trace[forward[match + j - 1]]) == recomputed[j - 1]) --j;
    if (j == 0) break;
  }
  if (match == static_cast<size_t>(-1)) return false;

  // Replay the rest of the block in forward, from the failing request's counterpart.
  const size_t first = forward[match + k - 1];
  std::unordered_map<int64_t, int64_t> block;  // address -> bytes, allocated since forward[match]
  for (size_t j = match; j + 1 < match + k; ++j) block[trace[forward[j]].addr] = trace[forward[j]].size;
  int64_t grown = 0, peak = 0;
  size_t last = first;
  for (size_t i = first; i < run.first_event; ++i) {
    const TraceEvent& e = trace[i];
    if (e.action == TraceAction::kAlloc) {
      if (attr.event_phase[i] != Phase::kForward) break;
      if (i != first && (!frames.checkpointed(e.frames) || key_of(e) == recomputed.front())) break;
      block[e.addr] = e.size;
      grown += e.size;
      peak = std::max(peak, grown);
      last = i;
    } else if (e.action == TraceAction::kFreeRequested) {
      const auto it = block.find(e.addr);
      if (it == block.end()) continue;
      grown -= it->second;
      block.erase(it);
      last = i;
    }
  }
  need.method = NeedMethod::kRecomputedBlock;
  need.lower_bound = true;
  need.recomputed_allocs = static_cast<int64_t>(k);
  need.forward_first_event = static_cast<int64_t>(first);
  need.forward_last_event = static_cast<int64_t>(last);
  need.still_needed_bytes = std::max(q.rounded_bytes, peak);
  need.estimate = fmt::format(
      "recomputed block: the recomputation's {} allocation{} so far, the failing one included, match forward's "
      "from event {} on; from the failing one's counterpart to the block's end (events {} to {}) forward grew by up "
      "to {}",
      k, k == 1 ? "" : "s", forward[match], first, last, format_bytes(peak));
  if (!turns_after_first_recomputation(q, run, trace, attr, frames, layout, recomputed, recomputation_start, peak,
                                       need))
    need.estimate += "; the block's backward after its recomputation is not counted";
  return true;
}

// Note [Blocks in backward]
// Rationale: backward runs the model's blocks one after another, the last
// first. With activation checkpointing a block's turn is its recomputation,
// then its backward; without, its backward alone, which frees what its
// forward saved as it goes. Each keeps its weights' gradients. Past the
// first block, the trace holds a whole turn of a block of the same shapes;
// before this rule an out-of-memory in a block's backward (the autograd
// engine's frameless allocations) had only its request as need.
// Approach: a turn begins with a marker: with checkpointing, an allocation
// that recomputes after one that does not (FrameIndex::recomputes);
// without, backward's frees of tensors this iteration's forward allocated,
// keyed by (layer frame, bytes), repeat block by block: the period p whose
// run of key[j] == key[j - p] ending at the last free is the longest
// gives the turns, one at the run's first free and every p frees after it
// (the head's frees come before the run; a block may free two tensors of
// one key, as a real GPT-2's does at modeling_gpt2.py:264, recorded with
// scripts/record_cpu_snapshot.py). Where the current turn so far
// is the previous one's, or the start of it (its recomputed allocations,
// else its freed forward tensors, by layer and bytes), the previous turn
// gives its peak growth P from its marker, its peak L up to its last free
// of a forward tensor (what a last block grows by, with no next block's
// gradients after it) and its growth N at its end (allocations add, freed
// tensors subtract, whoever allocated them); this turn has grown by S. The
// blocks after it: with checkpointing, the block's runs in this iteration's
// forward (its recomputed allocations in a row among forward's inside
// checkpoint()) less the turns begun; without, the tensors forward made
// with the first free's key still alive, over that key's frees in a turn
// (one turn per block not yet reached); either at most the blocks the
// parameters show (Note [Blocks from the parameters]) where those are no
// fewer than the turns begun. Block
// j after this one starts j x N - S above now; the need is the largest
// peak: P - S for this turn (L - S when it is the last), j x N - S + P for
// block j (+ L for the last).
// After the blocks, backward reaches the layers before them (the stem:
// embeddings), each making a gradient of its parameters' size: where the
// parameters' allocations show the stem and as many blocks as backward
// counts (Note [Blocks from the parameters]), the last block's end plus
// the stem's bytes is a peak too. The last block's turn ends at its last
// freed forward tensor, E above its marker in the previous turn (a turn
// ends with the next block's first gradients, which the last has none
// of): after x N + E - S. A token embedding tied to the head (the head's
// weight allocated after the blocks and freed, replaced by the
// embedding's; or a model moved with .to() and no head of its own, Note
// [A language model's head]) has a gradient from the head waiting in
// autograd's input buffer since backward began; the embedding's is added
// to it out of place (torch/csrc/autograd/input_buffer.cpp accumulate): a
// third tensor of the embedding's size. Recorded on the CPU (--model
// gpt2, qwen2, gemma, bert's MLM and opt, tied, and llama, neox, phi3,
// untied; --batch 1 --seq 32 --oom-in backward --share 0.8), the need
// was 0.74 to 0.82 of the uncapped run's for every tied one and 1.03 to
// 1.34 for the untied, with (after + 1) x N and no sum; with both, 0.87
// to 1.02.
// Limitations: a lower bound: the stem's temporaries (embedding backward's
// sort and counts) and layers outside the blocks the parameters do not
// show are not counted; nor the stem where parameters were made before
// recording or the blocks the parameters show are not backward's (a first
// block of other shapes: T5's relative attention bias). Blocks of other
// shapes (an encoder-decoder's two stacks) are taken to grow as this one.
bool backward_blocks(const NeedQuery& q, const PhaseRun& run, const std::vector<TraceEvent>& trace,
                     const Attribution& attr, const FrameIndex& frames, const ParameterLayout& layout,
                     PhaseNeed& need) {
  if (q.phase != Phase::kBackward) return false;
  // This iteration's forward: its allocations still alive when backward began, by address.
  const size_t forward_begin = iteration_forward_begin(attr, run);
  std::unordered_map<int64_t, AllocKey> forward_alive;
  for (size_t i = forward_begin; i < run.first_event; ++i) {
    if (trace[i].action == TraceAction::kAlloc && attr.event_phase[i] == Phase::kForward)
      forward_alive[trace[i].addr] = alloc_key(frames, trace[i]);
    else if (trace[i].action == TraceAction::kFreeRequested)
      forward_alive.erase(trace[i].addr);
  }
  // Backward's frees of them, in order, and the recomputation markers.
  std::vector<std::pair<size_t, AllocKey>> freed;
  std::vector<size_t> recomputation_starts;
  bool recomputing = false;
  for (size_t i = run.first_event; i <= q.oom_event; ++i) {
    const TraceEvent& e = trace[i];
    if (e.action == TraceAction::kFreeRequested && i < q.oom_event) {
      const auto it = forward_alive.find(e.addr);
      if (it == forward_alive.end()) continue;
      freed.emplace_back(i, it->second);
      forward_alive.erase(it);
    } else if (e.action == TraceAction::kAlloc || e.action == TraceAction::kOom) {
      const bool r = frames.recomputes(e.frames);
      if (r && !recomputing) recomputation_starts.push_back(i);
      recomputing = r;
    }
  }
  const bool checkpointed = !recomputation_starts.empty();
  std::vector<size_t> starts = std::move(recomputation_starts);
  AllocKey marker;
  int64_t markers_per_turn = 1;  // the marker's key among one turn's frees
  if (!checkpointed) {
    // The period of backward's frees up to the out-of-memory: the p whose
    // run of key[j] == key[j - p] ending at the last free is the longest
    // (the smallest p on a tie), so a whole turn and the current one so far
    // repeat. A turn begins at the run's first free and every p after it.
    const size_t first = freed.size() > kMaxTurnFrees ? freed.size() - kMaxTurnFrees : 0;
    const size_t n = freed.size();
    size_t period = 0, begin = n, most = 0;
    for (size_t p = 1; first + p < n; ++p) {
      const PeriodRun r =
          period_run_ending_at(first, n, p, [&](size_t a, size_t b) { return freed[a].second == freed[b].second; });
      if (r.matched() > most) {
        most = r.matched();
        period = p;
        begin = r.begin - p;
      }
    }
    if (period > 0) {
      marker = freed[begin].second;
      for (size_t k = begin; k < n; k += period) starts.push_back(freed[k].first);
      markers_per_turn = std::count_if(freed.begin() + static_cast<std::ptrdiff_t>(begin),
                                       freed.begin() + static_cast<std::ptrdiff_t>(begin + period),
                                       [&](const auto& f) { return f.second == marker; });
    }
  }
  if (starts.size() < 2) return false;
  const size_t previous = starts[starts.size() - 2];
  const size_t current = starts.back();

  // The same block: its recomputed allocations, else its freed forward tensors, so far.
  auto freed_keys = [&](size_t first, size_t end) {
    std::vector<AllocKey> keys;
    for (const auto& [i, key] : freed) {
      if (first <= i && i < end) keys.push_back(key);
    }
    return keys;
  };
  const std::vector<AllocKey> done =
      checkpointed ? recomputation_keys(trace, frames, previous, current) : freed_keys(previous, current);
  const std::vector<AllocKey> now =
      checkpointed ? recomputation_keys(trace, frames, current, q.oom_event + 1) : freed_keys(current, q.oom_event);
  if (now.size() > done.size() || !std::equal(now.begin(), now.end(), done.begin())) return false;
  if (checkpointed && !frames.recomputes(trace[q.oom_event].frames) && now.size() != done.size()) return false;

  // The previous turn's growth from its marker (allocations add, freed
  // tensors subtract): its peak, its peak up to its last freed forward
  // tensor, its end; and this turn's so far.
  size_t last_free = previous;  // the previous turn's last free of a forward tensor
  for (const auto& [i, key] : freed) {
    if (previous <= i && i < current) last_free = i;
  }
  int64_t grown = 0, peak = 0, last_peak = 0, last_end = 0;
  for (size_t i = previous; i < current; ++i) {
    if (trace[i].action == TraceAction::kAlloc) grown += trace[i].size;
    if (trace[i].action == TraceAction::kFreeRequested) grown -= trace[i].size;
    peak = std::max(peak, grown);
    if (i <= last_free) {
      last_peak = peak;
      last_end = grown;
    }
  }
  const int64_t net = grown;
  const int64_t so_far = net_growth(trace, current, q.oom_event);

  int64_t blocks = 0, after = 0;
  if (checkpointed) {
    // The block's runs in this iteration's forward: its recomputation's
    // allocations in a row among forward's inside checkpoint().
    blocks = occurrences(checkpointed_forward_keys(trace, attr, frames, forward_begin, run.first_event), done);
    after = std::max<int64_t>(0, blocks - static_cast<int64_t>(starts.size()));
  } else {
    for (const auto& [addr, key] : forward_alive) after += key == marker ? 1 : 0;
    after /= markers_per_turn;
    blocks = static_cast<int64_t>(starts.size()) + after;
  }
  // No more blocks than the parameters show, where they show those begun
  // (a Llama's forward leaves a tensor of the marker's key alive beyond
  // its blocks').
  const int64_t begun = static_cast<int64_t>(starts.size());
  if (layout.blocks >= begun && blocks > layout.blocks) {
    after = std::max<int64_t>(0, layout.blocks - begun);
    blocks = layout.blocks;
  }
  int64_t needed = (after == 0 ? last_peak : peak) - so_far;
  for (int64_t j = 1; j <= after; ++j) needed = std::max(needed, j * net - so_far + (j == after ? last_peak : peak));
  const int64_t stem = layout.blocks == blocks ? layout.stem_bytes : 0;
  const int64_t tied_sum = stem > 0 && layout.head_tied() ? layout.embedding_bytes : 0;
  if (stem > 0) needed = std::max(needed, after * net + last_end - so_far + stem + tied_sum);

  need.method = NeedMethod::kBackwardBlocks;
  need.lower_bound = true;
  need.blocks_done = static_cast<int64_t>(starts.size()) - 1;
  need.model_blocks = blocks;
  need.blocks_after = after;
  need.block_peak_bytes = peak;
  need.last_block_peak_bytes = last_peak;
  need.block_net_bytes = net;
  need.block_so_far_bytes = so_far;
  need.stem_gradient_bytes = stem;
  need.tied_gradient_sum_bytes = tied_sum;
  need.still_needed_bytes = std::max(q.rounded_bytes, needed);
  need.estimate = fmt::format(
      "blocks in backward{}: the previous block's {}backward (events {} to {}) grew by up to {} ({} to its last "
      "freed activation) and kept {}; this one had {} {}; {} of the {} blocks still to come after it, each "
      "starting that much higher; {}",
      checkpointed ? " (checkpointed)" : "", checkpointed ? "recomputation and " : "", previous, current - 1,
      format_bytes(peak), format_bytes(last_peak), format_bytes(net), so_far < 0 ? "freed" : "grown by",
      format_bytes(std::abs(so_far)), after, blocks,
      stem > 0 ? fmt::format("then the {} of parameters before the blocks (embeddings) get their gradients{}; their "
                             "temporaries are not counted",
                             format_bytes(stem),
                             tied_sum > 0 ? fmt::format(", the token embedding's added to the tied head's into a "
                                                        "new {}",
                                                        format_bytes(tied_sum))
                                          : "")
               : "what backward allocates after the blocks is not counted");
  return true;
}

}  // namespace oomtune::diagnose
