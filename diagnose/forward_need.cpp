#include "diagnose/need_rules.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/byte_size.h"
#include "diagnose/period_runs.h"

namespace oomtune::diagnose {
namespace {

constexpr int kPeriodMatchPercent = 90;  // a block pattern: >= 90% of the kept allocations repeat with it
constexpr size_t kMinPeriodChecks = 2;   // ... over at least two comparisons (one block and two allocations)

// Note [A language model's head]
// Rationale: after its blocks a language model computes logits, tokens x
// vocabulary, its largest tensor: a real GPT-2 small at 8 x 1024 tokens
// makes 1.53 GiB of them (50257 entries each) after blocks of 684.50 MiB
// (gpu_hf_gpt2_oom.pickle), which a need of the blocks alone leaves out.
// Training then computes its loss over them: cross_entropy's log_softmax
// makes as many fp32 entries again, which autograd keeps for backward
// (torch/nn/functional.py cross_entropy; transformers' ForCausalLMLoss,
// loss/loss_utils.py, calls it on logits.float()). On a recorded GPT-2
// forward (cpu_gpt2_forward_oom.pickle) the uncapped run grew by the
// blocks, the logits and that log_softmax: 75079768 B from the failure.
// Approach: where the parameters show the blocks (Note [Blocks from the
// parameters]) and a stem, d x its element size is the most common size
// among one block's parameters (its norms' weights and biases; the
// smaller on a tie) that divides both the stem's largest parameter (the
// token embedding, vocabulary x d) and the largest output of
// torch.nn.functional.embedding in this forward (tokens x d): a Llama
// block's three MLP matrices, d x ff each, outnumber its two norms but
// divide neither. The model has a vocabulary head where, after the
// blocks, a parameter has the embedding's size (a head of its own, or the
// weight allocated before it was tied to the embedding: a model built on
// the device), or, for a model moved with .to(), which allocates a shared
// parameter once, every parameter there lies as deep in the model as the
// embedding (Module._apply's frames, one per module: GPT-2's ln_f and wte
// 3 deep, in transformer): the base model ends in its final norm and the
// task model adds no head of its own, so the head is the embedding's
// weight, tied (GPT-2 built on the CPU and moved, as
// gpu_hf_gpt2_oom.pickle). A head of another size, shallower (a reward
// model's score, 2 deep), says the model is no language model. The
// logits are counted at 4 bytes an entry
// (fp32 logits, or bf16 ones with the fp32 copy the loss makes), and the
// loss's log_softmax at 4 bytes an entry: rule 3 reads a forward that
// keeps activations, which is training, and training has a loss.
// Limitations: a lower bound for bf16 logits (2 bytes an entry more) and
// for a loss that copies them again (transformers before 4.46 shifted the
// logits with .contiguous()); a model that computes the logits in chunks
// or for some positions only, or a fused linear-cross-entropy loss, needs
// less than counted, and so does a base model ending in its norm trained
// without a vocabulary head (a custom loss on its hidden states); an
// encoder-decoder's tokens are its longer input's.
constexpr int64_t kLogitBytes = 4;

/// A language model's head as the parameters and a forward show it (Note
/// [A language model's head]): its logits' bytes (0 where there is none),
/// tokens and vocabulary, and whether its weight is the embedding's,
/// moved with .to() (no parameter of its own after the blocks).
struct VocabularyHead {
  int64_t logits_bytes = 0;
  int64_t tokens = 0;
  int64_t vocabulary = 0;
  bool tied_and_moved = false;
};

/// The head of Note [A language model's head], for the forward [first, end).
VocabularyHead vocabulary_head(const ParameterLayout& layout, const std::vector<TraceEvent>& trace,
                               const FrameIndex& frames, size_t first, size_t end) {
  if (layout.embedding_bytes <= 0 || layout.tail_sizes.empty()) return {};
  int64_t embedded = 0;  // the largest embedding output: tokens x d x its element size
  for (size_t i = first; i < end && i < trace.size(); ++i) {
    if (trace[i].action == TraceAction::kAlloc && frames.runs_embedding(trace[i].frames))
      embedded = std::max(embedded, trace[i].size);
  }
  const auto d =
      std::find_if(layout.block_sizes_by_count.begin(), layout.block_sizes_by_count.end(), [&](int64_t bytes) {
        return bytes > 0 && layout.embedding_bytes % bytes == 0 && embedded > 0 && embedded % bytes == 0;
      });
  if (d == layout.block_sizes_by_count.end()) return {};
  const bool own_weight = layout.has_head_weight();
  const bool tied_and_moved = layout.moved_without_head();
  if (!own_weight && !tied_and_moved) return {};
  VocabularyHead head;
  head.tokens = embedded / *d;
  head.vocabulary = layout.embedding_bytes / *d;
  head.logits_bytes = head.tokens * head.vocabulary * kLogitBytes;
  head.tied_and_moved = !own_weight;
  return head;
}

}  // namespace

bool forward_blocks(const NeedQuery& q, const PhaseRun& run, const std::vector<TraceEvent>& trace,
                    const Attribution& attr, const FrameIndex& frames, const ParameterLayout& layout, PhaseNeed& need) {
  const int64_t model_blocks = layout.blocks;
  std::vector<int64_t> key, size;  // per kept allocation: its layer frame, its requested bytes
  for (size_t i = run.first_event; i < q.oom_event; ++i) {
    if (trace[i].action != TraceAction::kAlloc || attr.event_category[i] != Category::kActivations) continue;
    key.push_back(frames.layer_frame(trace[i].frames));
    size.push_back(trace[i].size);
  }
  const size_t n = key.size();
  // The pattern of period p holds on [periodic, regular_end): the blocks,
  // the current one and the need. False where no block starts inside it.
  auto read_blocks = [&](size_t p, size_t periodic, size_t regular_end) {
    // A block begins as the first block did: with a run of the layer that
    // made the first allocation of one of the pattern's layers (the first
    // block may keep more, e.g. a causal mask made once; the model's stem,
    // e.g. embeddings, comes before it).
    const std::vector<int64_t> layers(key.begin() + static_cast<std::ptrdiff_t>(periodic),
                                      key.begin() + static_cast<std::ptrdiff_t>(periodic + p));
    size_t first_block = 0;
    while (std::find(layers.begin(), layers.end(), key[first_block]) == layers.end()) ++first_block;
    auto begins_block = [&](size_t j) { return key[j] == key[first_block] && (j == 0 || key[j - 1] != key[j]); };
    size_t start = std::max(periodic, first_block);
    while (start < n && !begins_block(start)) ++start;
    if (start + p > regular_end) return false;
    size_t irregular = 0;  // blocks before the regular ones
    for (size_t j = first_block; j < start; ++j) irregular += begins_block(j) ? 1 : 0;
    // Complete blocks lie inside the regular run; the current one starts after them.
    const size_t blocks = (regular_end - start) / p;
    const size_t current = start + blocks * p;
    int64_t whole = 0, partial = 0;
    for (size_t j = start; j < n; ++j) (j < current ? whole : partial) += size[j];
    need.method = NeedMethod::kForwardBlocks;
    need.lower_bound = true;
    need.blocks_done = static_cast<int64_t>(irregular + blocks);
    need.block_bytes = whole / static_cast<int64_t>(blocks);
    need.block_so_far_bytes = partial;
    // Note [Blocks from the parameters]: the blocks after the current one, where the model says how many.
    VocabularyHead head;
    if (model_blocks > need.blocks_done) {
      need.model_blocks = model_blocks;
      need.blocks_after = model_blocks - need.blocks_done - 1;
      // Note [A language model's head]: its logits after the blocks, then the loss's log_softmax.
      head = vocabulary_head(layout, trace, frames, run.first_event, q.oom_event);
      need.head_bytes = head.logits_bytes;
      need.loss_bytes = head.logits_bytes;
    }
    need.still_needed_bytes = std::max(q.rounded_bytes, need.block_bytes - partial) +
                              need.blocks_after * need.block_bytes + need.head_bytes + need.loss_bytes;
    need.estimate = fmt::format(
        "forward blocks: the activations kept repeat every {} allocation{} (one block of the model); {} complete "
        "block{} (of {}{}) before the failure and {} of the current one{}: at least {}",
        p, p == 1 ? "" : "s", need.blocks_done, need.blocks_done == 1 ? "" : "s", format_bytes(need.block_bytes),
        need.blocks_done == 1 ? "" : " each", format_bytes(partial),
        regular_end < n ? ", temporaries it had not freed yet included" : "",
        need.model_blocks == 0 ? std::string("the rest of this block (the blocks after it are not in the snapshot)")
        : need.head_bytes == 0
            ? fmt::format("the rest of this block and {} more block{} (the model's parameters {} {} blocks; "
                          "what follows the blocks is not in the snapshot{})",
                          need.blocks_after, need.blocks_after == 1 ? "" : "s",
                          layout.loaded ? "loaded by from_pretrained count" : "repeat in", need.model_blocks,
                          layout.loaded && !layout.has_head_weight()
                              ? ": no head weight of their own among them, so the logits of a language model's "
                                "head tied to the embedding are not counted"
                              : "")
            : fmt::format("the rest of this block, {} more block{} (the model's parameters repeat in {} blocks), "
                          "then the head's logits, {} tokens x {} entries x 4 B = {} (the embedding's output and "
                          "its weight over d, a block's most common parameter size that divides both{}), and the "
                          "loss's log_softmax over "
                          "them, {} more (fp32, kept for backward)",
                          need.blocks_after, need.blocks_after == 1 ? "" : "s", need.model_blocks, head.tokens,
                          head.vocabulary, format_bytes(need.head_bytes),
                          head.tied_and_moved ? "; the head is the embedding's weight, tied: the model was moved "
                                                "with .to() and adds no head of its own after the blocks"
                                              : "",
                          format_bytes(need.loss_bytes)));
    return true;
  };
  // Where no period repeats over 90% of the kept allocations (a model that
  // failed in its third block: the stem and the current block's
  // temporaries weigh more), the period with the longest regular run
  // covering a whole block again (the smallest such on a tie), whose
  // block runs two layers or more (frameless allocations repeat anything).
  auto runs_layers = [&](size_t begin, size_t p) {
    std::vector<int64_t> layers;
    for (size_t j = begin; j < begin + p; ++j) {
      if (key[j] >= 0 && std::find(layers.begin(), layers.end(), key[j]) == layers.end()) layers.push_back(key[j]);
    }
    return layers.size() >= 2;
  };
  size_t fallback_p = 0;
  PeriodRun fallback;
  for (size_t p = 1; p + kMinPeriodChecks <= n; ++p) {
    const size_t checks = n - p;
    size_t matches = 0;
    // The longest run of positions j with key[j] == key[j - p] (the later
    // among equals) is where the blocks are regular. It need not reach the
    // end: the current block may still hold temporaries it frees before it
    // ends (a real GPT-2's MLP, issue #48), which earlier blocks freed.
    PeriodRun best{p, p};
    for_each_period_run(
        0, n, p, [&](size_t a, size_t b) { return key[a] == key[b]; },
        [&](PeriodRun r) {
          matches += r.matched();
          if (r.matched() >= best.matched()) best = r;
        });
    if (best.matched() >= std::max(p, kMinPeriodChecks) && best.matched() > fallback.matched() &&
        runs_layers(best.begin - p, p)) {
      fallback_p = p;
      fallback = best;
    }
    if (checks < kMinPeriodChecks || matches * 100 < checks * kPeriodMatchPercent) continue;
    if (read_blocks(p, best.begin - p, best.end)) return true;
  }
  return fallback_p > 0 && read_blocks(fallback_p, fallback.begin - fallback_p, fallback.end);
}

// Note [Blocks without autograd]
// Rationale: a forward without autograd keeps no activations (Note [Blocks
// that kept nothing]): rule 3 has no pattern to read, and the need was the
// request alone. GPT-2's no_grad forward recorded on an H200 failed in its
// third block of four needing 14 times its 1 MiB request (14680064 B: the
// fourth block's temporaries above the KV cache entries the third keeps).
// Approach: each block starts where the one before ended and makes the same
// allocations. Over the last complete block (the period of Note [Blocks
// that kept nothing]), its rise above its start after each allocation, its
// peak P and its end E (what a block leaves: its KV cache entries; its
// output, less the input it frees). At the failure the current block is S
// above its start and has made q allocations: the rest of it rises to the
// complete block's highest after its q-th allocation. With A blocks after it
// (the model's blocks, Note [Blocks from the parameters]), the last starts
// A x E above the current one's start and peaks at A x E + P. A language
// model's logits (Note [A language model's head], 4 B an entry) come after
// the blocks, (A + 1) x E above it. The need is the highest of these less S,
// at least the request.
// Limitations: without the model's block count only the current block's
// rest counts (a lower bound); bf16 logits are counted at 4 B; under
// generate() no logits are counted (transformers 5.x keeps the last
// token's, logits_to_keep).
bool inference_blocks(const NeedQuery& q, const PhaseRun& run, const std::vector<TraceEvent>& trace,
                      const Attribution& attr, const FrameIndex& frames, const ParameterLayout& layout,
                      PhaseNeed& need) {
  const NothingSaved blocks = q.blocks ? *q.blocks : blocks_kept_nothing(trace, attr, frames, q.oom_event);
  const std::vector<int64_t>& starts = blocks.block_first_events;
  const int64_t period = blocks.block_allocations;
  if (!blocks.found() || period <= 0) return false;
  const size_t complete = static_cast<size_t>(blocks.stretch_allocations / period);
  if (complete == 0 || complete > starts.size()) return false;
  const size_t current = complete < starts.size() ? static_cast<size_t>(starts[complete]) : q.oom_event;
  // The last complete block's rise above its start right after each of its allocations (frees only lower it).
  std::vector<int64_t> rise;
  int64_t level = 0, peak = 0;
  for (size_t i = static_cast<size_t>(starts[complete - 1]); i < current; ++i) {
    if (trace[i].action == TraceAction::kAlloc) {
      level += trace[i].size;
      rise.push_back(level);
    } else if (trace[i].action == TraceAction::kFreeRequested) {
      level -= trace[i].size;
    }
    peak = std::max(peak, level);
  }
  const int64_t end = level;
  // The current block so far: its allocations and its rise above its start.
  const auto made = std::count_if(trace.begin() + static_cast<std::ptrdiff_t>(current),
                                  trace.begin() + static_cast<std::ptrdiff_t>(q.oom_event),
                                  [](const TraceEvent& e) { return e.action == TraceAction::kAlloc; });
  const int64_t so_far = net_growth(trace, current, q.oom_event);
  int64_t rest_of_current = 0;  // the complete block's highest from the current one's position on
  for (size_t k = static_cast<size_t>(made); k < rise.size(); ++k) rest_of_current = std::max(rest_of_current, rise[k]);
  need.method = NeedMethod::kInferenceBlocks;
  need.blocks_done = static_cast<int64_t>(complete);
  need.block_bytes = end;
  need.block_so_far_bytes = so_far;
  int64_t highest = rest_of_current;
  VocabularyHead head;
  if (layout.blocks > need.blocks_done) {
    need.model_blocks = layout.blocks;
    need.blocks_after = layout.blocks - need.blocks_done - 1;
    highest = std::max(highest, need.blocks_after * end + peak);
    if (!q.generating) head = vocabulary_head(layout, trace, frames, run.first_event, q.oom_event);
    need.head_bytes = head.logits_bytes;
    if (head.logits_bytes > 0) highest = std::max(highest, (need.blocks_after + 1) * end + head.logits_bytes);
  }
  need.lower_bound = need.model_blocks == 0;
  need.still_needed_bytes = std::max(q.rounded_bytes, highest - so_far);
  need.estimate = fmt::format(
      "blocks without autograd: each of {} allocation{} rises to {} above its start and ends {} above it (what it "
      "keeps: KV cache entries; its output less its input); the current block, {} above its start after {} "
      "allocation{}, rises to {} in the rest of it{}",
      period, period == 1 ? "" : "s", format_bytes(peak), format_bytes(end), format_bytes(so_far), made,
      made == 1 ? "" : "s", format_bytes(rest_of_current),
      need.model_blocks == 0
          ? " (the blocks after it are not in the snapshot)"
          : fmt::format(
                "; {} (the model's parameters {} {} blocks){}",
                need.blocks_after == 0 ? std::string("it is the model's last block")
                                       : fmt::format("the last of {} more block{} peaks {} x {} + {} above its start",
                                                     need.blocks_after, need.blocks_after == 1 ? "" : "s",
                                                     need.blocks_after, format_bytes(end), format_bytes(peak)),
                layout.loaded ? "loaded by from_pretrained count" : "repeat in", need.model_blocks,
                head.logits_bytes > 0 ? fmt::format(", then the head's logits, {} tokens x {} entries x 4 B = {}, made "
                                                    "with the blocks' {} x {} left above its start",
                                                    head.tokens, head.vocabulary, format_bytes(head.logits_bytes),
                                                    need.blocks_after + 1, format_bytes(end))
                                      : ""));
  return true;
}

}  // namespace oomtune::diagnose
