#include "diagnose/parameter_layout.h"

#include <cstddef>
#include <map>
#include <utility>

#include "diagnose/period_runs.h"

namespace oomtune::diagnose {
namespace {

// Note [Blocks from the parameters]
// Rationale: rule 3 sees the blocks a forward ran before it failed, not how
// many it had still to run; a real GPT-2 failed in its 11th block of 12, and
// a fix judged against the rest of the 11th alone looked enough.
// Approach: a model's parameters are allocated in module order (Module._apply
// moves them child by child, nn/modules/module.py; so does construction on
// the device): the stem, then block after block, then the head. Their sizes
// then repeat with a period p (the tensors of one block: GPT-2's 12, from
// ln_1's weight to the MLP's c_proj bias). The longest run of sizes equal to
// the size p before, for the smallest p >= 2 that reaches it, covering at
// least two periods with at least two sizes in one, gives the blocks:
// floor(run / p). A period of one size (every tensor alike) could be one
// block or several, and is not used; neither is a count below the blocks the
// forward already ran. Parameters made before recording began have no
// allocation in the trace: then nothing is counted.
// Limitations: blocks of unlike shapes (an encoder-decoder's two stacks)
// give the longest stack's count; parameters allocated out of module order
// give none, but those of Note [Blocks from loaded weights]. Above
// kMaxParameterAllocations the search (quadratic) is skipped.
constexpr size_t kMaxParameterAllocations = 4096;

// Note [Blocks from loaded weights]
// Rationale: from_pretrained(..., device_map=) in transformers 5.x loads the
// weights in a thread pool (core_model_loading.py, frames.h): GPT-2 small's
// 148 tensors came to an H200 interleaved, the embeddings last, and no
// period of sizes repeats (gpu_hf_gpt2_pretrained_oom.pickle).
// Approach: where the parameters were loaded so (FrameIndex::loads_weights),
// their sizes are counted instead of read in order (short spurious periods
// show in the interleaving: two sizes repeating over five tensors): a model of
// N blocks holds each block parameter size k times N, and a few more
// (stem, final norm, head). The largest N >= 2 for which the sizes' counts
// divided by N leave a block of two sizes or more and no more tensors
// outside it than in it is the blocks (GPT-2 small: 12; 74 tensors of 3072
// B, six a block and the final norm's two). Their order unknown, the
// largest tensor outside the blocks is the embedding, taken as the stem;
// the others are the tail, where a second of the embedding's size is a head
// of its own (an untied language model's).
// Limitations: a head tied to the embedding makes no tensor of its own:
// its logits are not counted (a loaded model does not show whether it is a
// language model); the stem's other tensors (position embeddings) are
// counted after the blocks.

/// Note [Blocks from loaded weights]: the layout of parameters of `sizes`
/// (bytes, in any order) from how often each size comes; none without N.
ParameterLayout layout_from_counts(const std::vector<int64_t>& sizes) {
  std::map<int64_t, int64_t> counts;
  for (const int64_t bytes : sizes) ++counts[bytes];
  int64_t most = 0;
  for (const auto& [bytes, count] : counts) most = std::max(most, count);
  ParameterLayout layout;
  for (int64_t n = most; n >= 2 && layout.blocks == 0; --n) {
    int64_t in_block = 0, outside = 0, kinds = 0;
    for (const auto& [bytes, count] : counts) {
      in_block += count / n;
      outside += count % n;
      kinds += count >= n ? 1 : 0;
    }
    if (kinds >= 2 && outside <= in_block) layout.blocks = n;
  }
  if (layout.blocks == 0) return {};
  layout.loaded = true;
  std::vector<std::pair<int64_t, int64_t>> ranked;  // (-per block, size): the most common first, the smaller on a tie
  std::vector<int64_t> outside;                     // the tensors outside the blocks, largest first
  for (const auto& [bytes, count] : counts) {
    const int64_t per_block = count / layout.blocks;
    if (per_block > 0) ranked.emplace_back(-per_block, bytes);
    layout.block_bytes += per_block * bytes;
    outside.insert(outside.end(), static_cast<size_t>(count % layout.blocks), bytes);
  }
  std::sort(ranked.begin(), ranked.end());
  for (const auto& [per_block, bytes] : ranked) layout.block_sizes_by_count.push_back(bytes);
  std::sort(outside.rbegin(), outside.rend());
  if (!outside.empty()) {
    layout.embedding_bytes = layout.stem_bytes = outside.front();
    layout.tail_sizes.assign(outside.begin() + 1, outside.end());
    layout.tail_depths.assign(layout.tail_sizes.size(), 0);
  }
  return layout;
}

}  // namespace

ParameterLayout parameter_layout(const std::vector<TraceEvent>& trace, const Attribution& attr,
                                 const FrameIndex& frames) {
  std::vector<size_t> events;  // the parameters' allocations
  std::vector<int64_t> sizes;
  bool loaded = true;  // every one by from_pretrained's loading
  for (size_t i = 0; i < trace.size(); ++i) {
    if (trace[i].action == TraceAction::kAlloc && attr.event_category[i] == Category::kParameters) {
      events.push_back(i);
      sizes.push_back(trace[i].size);
      loaded = loaded && frames.loads_weights(trace[i].frames);
    }
  }
  const size_t n = sizes.size();
  if (loaded && n > 0) return layout_from_counts(sizes);
  if (n > kMaxParameterAllocations) return {};
  size_t best_length = 0, best_period = 0, best_begin = 0;  // the sizes that repeat, their period, where
  for (size_t p = 2; 2 * p <= n; ++p) {
    for_each_period_run(
        0, n, p, [&](size_t a, size_t b) { return sizes[a] == sizes[b]; },
        [&](PeriodRun r) {
          const size_t length = r.matched() + p;
          if (length < 2 * p || length <= best_length) return;
          const auto period = sizes.begin() + static_cast<std::ptrdiff_t>(r.begin - p);
          const auto end = period + static_cast<std::ptrdiff_t>(p);
          if (std::all_of(period, end, [&](int64_t s) { return s == *period; })) return;
          best_length = length;
          best_period = p;
          best_begin = r.begin - p;
        });
  }
  if (best_period == 0) return {};
  ParameterLayout layout;
  layout.blocks = static_cast<int64_t>(best_length / best_period);
  for (size_t i = 0; i < best_begin; ++i) {
    layout.stem_bytes += sizes[i];
    if (sizes[i] <= layout.embedding_bytes) continue;
    layout.embedding_bytes = sizes[i];
    layout.embedding_depth = frames.module_apply_depth(trace[events[i]].frames);
  }
  std::map<int64_t, int> counts;  // one block's parameter sizes
  for (size_t i = best_begin; i < best_begin + best_period; ++i) {
    ++counts[sizes[i]];
    layout.block_bytes += sizes[i];
  }
  std::vector<std::pair<int, int64_t>> ranked;  // (-count, size): the most common first, the smaller on a tie
  for (const auto& [bytes, count] : counts) ranked.emplace_back(-count, bytes);
  std::sort(ranked.begin(), ranked.end());
  for (const auto& [count, bytes] : ranked) layout.block_sizes_by_count.push_back(bytes);
  const size_t blocks_end = best_begin + static_cast<size_t>(layout.blocks) * best_period;
  for (size_t i = blocks_end; i < n; ++i) {
    layout.tail_sizes.push_back(sizes[i]);
    layout.tail_depths.push_back(frames.module_apply_depth(trace[events[i]].frames));
  }
  // Whether the first parameter after the blocks of the embedding's size is freed (one scan of the trace).
  const auto head =
      std::find(sizes.begin() + static_cast<std::ptrdiff_t>(blocks_end), sizes.end(), layout.embedding_bytes);
  if (layout.embedding_bytes > 0 && head != sizes.end()) {
    const size_t at = events[static_cast<size_t>(head - sizes.begin())];
    for (size_t j = at + 1; j < trace.size(); ++j) {
      if (trace[j].addr != trace[at].addr) continue;
      if (trace[j].action == TraceAction::kFreeRequested) layout.head_weight_freed = true;
      if (trace[j].action == TraceAction::kFreeRequested || trace[j].action == TraceAction::kAlloc) break;
    }
  }
  return layout;
}

}  // namespace oomtune::diagnose
