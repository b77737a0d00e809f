#include "diagnose/phase_need.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/byte_size.h"
#include "diagnose/period_runs.h"

namespace oomtune::diagnose {
namespace {

constexpr int kPeriodMatchPercent = 90;  // a block pattern: >= 90% of the kept allocations repeat with it
constexpr size_t kMinPeriodChecks = 2;   // ... over at least two comparisons (one block and two allocations)
constexpr size_t kMaxTurnFrees = 4096;   // backward's latest frees of forward tensors read for its turns

bool is_training_phase(Phase p) { return p == Phase::kForward || p == Phase::kBackward || p == Phase::kOptimizer; }

/// Bytes of optimizer state first allocated in events [first, end).
int64_t new_state_bytes(const std::vector<TraceEvent>& trace, const Attribution& attr, size_t first, size_t end) {
  int64_t bytes = 0;
  for (size_t i = first; i < end && i < trace.size(); ++i) {
    if (trace[i].action == TraceAction::kAlloc && attr.event_category[i] == Category::kOptimizerState) {
      bytes += trace[i].size;
    }
  }
  return bytes;
}

/// How the optimizer runs its arithmetic: that of the latest event at or
/// before `oom_event` whose stack shows it; kUnknown where none does.
OptimizerImplementation implementation_seen(const std::vector<TraceEvent>& trace, const FrameIndex& frames,
                                            size_t oom_event) {
  for (size_t i = std::min(oom_event + 1, trace.size()); i-- > 0;) {
    const OptimizerImplementation implementation = frames.optimizer_implementation(trace[i].frames);
    if (implementation != OptimizerImplementation::kUnknown) return implementation;
  }
  return OptimizerImplementation::kUnknown;
}

// Note [Step counters on the device]
// Rationale: an optimizer's first step that fails among its states has run
// no arithmetic yet, so no frame shows its implementation; assuming
// foreach, CUDA's default, counts the whole-list temporaries fused=True
// never makes (a fused AdamW failing among its states was estimated to
// need 32.87 MB where it needed 18.95 MB, record_cpu_snapshot.py --fused).
// Approach: torch 2.11's fused (and capturable) Adam, AdamW and Adagrad
// make each parameter's `step` counter on the device before its states,
// torch.zeros((), device=p.device); foreach and single-tensor ones make it
// on the host, torch.tensor(0.0) (adam.py: "special device hosting for
// step"), out of the device's sight. The counters show in _init_group as a
// source line whose every allocation is 0-dim (at most 8 bytes) beside a
// line whose allocations are larger (the states of the parameters' size):
// then fused is assumed for an optimizer with a fused kernel. States made
// with no such line are an implementation's that hosts them: foreach is
// assumed, even under Hugging Face's Trainer (optim="adamw_torch"), whose
// default, fused, holds only where no state was made yet.
// Under a default device (`with torch.device("cuda"):` around the step,
// torch.set_default_device), foreach's torch.tensor(0.0) lands on the device
// too: counters made through torch/utils/_device.py's mode tell nothing, and
// foreach, the default, is assumed (an H200's foreach AdamW, recorded so,
// read as fused: 21.05 MB needed where it needed 34.98 MB, 2026-12-04).
// Limitations: capturable (for CUDA graphs) runs foreach with counters on
// the device and reads as fused; a fused optimizer stepped under a default
// device reads as foreach (its temporaries counted, the need too high); a
// model whose parameters are all 0-dim shows no larger line.
//
// Note [States an option adds]
// Rationale: the table's states per parameter are those of the default
// options; amsgrad=True adds Adam's max_exp_avg_sq, RMSprop's momentum > 0
// and centered=True its momentum_buffer and grad_avg: a third more state
// to come than counted, and a fix judged enough that is not.
// Approach: _init_group makes each kind of state on a source line of its
// own, for every parameter in turn; the lines whose allocations are larger
// than a step counter, where more than the table's count, are the states
// per parameter. Only for an optimizer whose states are of the
// parameters' size (not Adafactor's factored ones).
// Limitations: a step that failed before its first parameter's states were
// all made shows fewer lines: the table's count stands.
constexpr int64_t kStepCounterBytes = 8;  // a 0-dim float32 or float64 tensor

/// The source lines of the optimizer's _init_group that allocated in
/// events [first, end): those of 0-dim tensors only (step counters, Note
/// [Step counters on the device]) and the others (kinds of state, Note
/// [States an option adds]).
struct InitGroupLines {
  int counters = 0;
  int states = 0;
  bool counters_under_default_device = false;  ///< FrameIndex::under_default_device
};

InitGroupLines init_group_lines(const std::vector<TraceEvent>& trace, const FrameIndex& frames, size_t first,
                                size_t end) {
  std::unordered_map<int64_t, int64_t> largest;  // _init_group's frame (its line) -> its largest allocation
  InitGroupLines lines;
  for (size_t i = first; i < end && i < trace.size(); ++i) {
    if (trace[i].action != TraceAction::kAlloc) continue;
    const int64_t line = frames.optimizer_init_frame(trace[i].frames);
    if (line < 0) continue;
    largest[line] = std::max(largest[line], trace[i].size);
    if (trace[i].size <= kStepCounterBytes && frames.under_default_device(trace[i].frames))
      lines.counters_under_default_device = true;
  }
  for (const auto& [line, bytes] : largest) ++(bytes <= kStepCounterBytes ? lines.counters : lines.states);
  return lines;
}

/// ", and one more its _init_group made (max_exp_avg_sq too with
/// amsgrad=True)" for states an option adds; "" for none.
std::string added_states(const OptimizerKind& optimizer, int added) {
  if (added <= 0) return "";
  return fmt::format(", and {} more its _init_group made{}", count_word(added),
                     optimizer.options.empty() ? "" : fmt::format(" ({})", optimizer.options));
}

/// The temporaries `implementation` holds at its peak, in gradients' bytes
/// (foreach) or the largest parameter's (single tensor); -1: not modelled.
/// Adam's figures where no table row names the optimizer but its
/// torch/optim/ frames show the implementation.
int optimizer_temporaries(const OptimizerKind* optimizer, OptimizerImplementation implementation) {
  switch (implementation) {
    case OptimizerImplementation::kForeach:
      return optimizer ? optimizer->foreach_temporaries : 1;
    case OptimizerImplementation::kSingleTensor:
      return optimizer ? optimizer->single_tensor_temporaries : 2;
    case OptimizerImplementation::kFused:
      return 0;
    case OptimizerImplementation::kUnknown:
      break;
  }
  return -1;
}

/// The largest parameter's bytes: the largest allocation of parameters in
/// the trace, else of gradients (parameters made before recording); 0.
int64_t largest_parameter_bytes(const std::vector<TraceEvent>& trace, const Attribution& attr) {
  int64_t parameters = 0, gradients = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    if (trace[i].action != TraceAction::kAlloc) continue;
    if (attr.event_category[i] == Category::kParameters) parameters = std::max(parameters, trace[i].size);
    if (attr.event_category[i] == Category::kGradients) gradients = std::max(gradients, trace[i].size);
  }
  return parameters > 0 ? parameters : gradients;
}

/// Bytes events [first, end) leave above where they began: allocations
/// add their requested bytes, frees subtract theirs.
int64_t net_growth(const std::vector<TraceEvent>& trace, size_t first, size_t end) {
  int64_t grown = 0;
  for (size_t i = first; i < end; ++i) {
    if (trace[i].action == TraceAction::kAlloc) grown += trace[i].size;
    if (trace[i].action == TraceAction::kFreeRequested) grown -= trace[i].size;
  }
  return grown;
}

/// Bytes of the allocations in events [first, end) that `counted(i)`
/// selects and that were not freed by `end`.
template <typename Counted>
int64_t bytes_alive(const std::vector<TraceEvent>& trace, size_t first, size_t end, Counted counted) {
  std::unordered_map<int64_t, int64_t> alive;  // addr -> bytes
  for (size_t i = first; i < end && i < trace.size(); ++i) {
    const TraceEvent& e = trace[i];
    if (e.action == TraceAction::kAlloc && counted(i))
      alive[e.addr] = e.size;
    else if (e.action == TraceAction::kFreeRequested)
      alive.erase(e.addr);
  }
  int64_t bytes = 0;
  for (const auto& [addr, size] : alive) bytes += size;
  return bytes;
}

/// Bytes the optimizer's arithmetic (FrameIndex::runs_optimizer_math)
/// allocated in events [first, end) and had not freed by `end`.
int64_t arithmetic_bytes_alive(const std::vector<TraceEvent>& trace, const FrameIndex& frames, size_t first,
                               size_t end) {
  return bytes_alive(trace, first, end, [&](size_t i) { return frames.runs_optimizer_math(trace[i].frames); });
}

/// Note [Phase need] rule 2: a first step's states still to make (where
/// the optimizer makes any), then the temporaries its arithmetic holds at
/// its peak less those alive; a later step's temporaries alone. False
/// where neither is known (no gradients or parameters alive; an optimizer
/// whose first step makes no state, or whose temporaries are not modelled,
/// for a later step).
bool optimizer_step(const NeedQuery& q, const PhaseRun& run, const std::vector<TraceEvent>& trace,
                    const Attribution& attr, const FrameIndex& frames, bool first_step, PhaseNeed& need) {
  const InitGroupLines lines = init_group_lines(trace, frames, run.first_event, q.oom_event);
  const int table_states = q.optimizer ? q.optimizer->states_per_parameter : 2;
  const int states = table_states > 0 && q.optimizer ? std::max(table_states, lines.states) : table_states;
  const int64_t grads = q.live[static_cast<size_t>(Category::kGradients)];
  const int64_t params = q.live[static_cast<size_t>(Category::kParameters)];
  const int64_t base = grads > 0 ? grads : params;
  const int64_t state_alive = q.live[static_cast<size_t>(Category::kOptimizerState)];
  const OptimizerImplementation seen = implementation_seen(trace, frames, q.oom_event);
  // Where no frame shows it, for a torch.optim optimizer: Hugging Face
  // Trainer's default, fused AdamW, under the Trainer; PyTorch's default on
  // CUDA, foreach, elsewhere. An optimizer no torch.optim frame names
  // (bitsandbytes', DeepSpeed's, a custom one) runs arithmetic of its own:
  // not modelled.
  const bool trainer = q.oom_event < trace.size() && frames.runs_hf_trainer(trace[q.oom_event].frames);
  // Note [Step counters on the device]: once states are made, the counters say where they are.
  const bool states_made = q.optimizer && q.optimizer->fused_on_cuda && lines.states > 0;
  const ImplementationBasis basis = seen != OptimizerImplementation::kUnknown ? ImplementationBasis::kFrames
                                    : !q.optimizer                            ? ImplementationBasis::kNone
                                    : states_made
                                        ? (lines.counters == 0 ? ImplementationBasis::kHostStepCounters
                                           : lines.counters_under_default_device ? ImplementationBasis::kDefaultDevice
                                                                                 : ImplementationBasis::kStepCounters)
                                    : trainer ? ImplementationBasis::kHfTrainer
                                              : ImplementationBasis::kDefault;
  const OptimizerImplementation implementation =
      basis == ImplementationBasis::kFrames ? seen
      : basis == ImplementationBasis::kNone ? OptimizerImplementation::kUnknown
      : basis == ImplementationBasis::kDefault || basis == ImplementationBasis::kHostStepCounters ||
              basis == ImplementationBasis::kDefaultDevice
          ? OptimizerImplementation::kForeach
          : OptimizerImplementation::kFused;
  const int per = optimizer_temporaries(q.optimizer, implementation);
  if (base <= 0 || (first_step ? states <= 0 : per < 0)) return false;

  need.method = first_step ? NeedMethod::kOptimizerFirstStep : NeedMethod::kOptimizerStep;
  need.states_per_parameter = first_step ? states : 0;
  need.states_added_by_options = first_step ? states - table_states : 0;
  need.state_total_bytes = first_step ? states * base : 0;
  need.implementation = implementation;
  need.implementation_basis = basis;
  const int64_t unit =
      implementation == OptimizerImplementation::kSingleTensor ? largest_parameter_bytes(trace, attr) : base;
  need.temporaries_modelled = per >= 0;
  need.temporaries_total_bytes = std::max(per, 0) * unit;
  const int64_t math_alive = arithmetic_bytes_alive(trace, frames, run.first_event, q.oom_event);
  need.temporaries_left_bytes = std::max<int64_t>(0, need.temporaries_total_bytes - math_alive);
  const int64_t states_left = first_step ? std::max<int64_t>(0, need.state_total_bytes - state_alive) : 0;
  need.still_needed_bytes = std::max(q.rounded_bytes, states_left + need.temporaries_left_bytes);

  std::string how = implementation_name(implementation);
  if (implementation == OptimizerImplementation::kUnknown)
    how = "no torch.optim frame names the optimizer or shows how it runs";
  else if (basis == ImplementationBasis::kStepCounters)
    how =
        "fused, assumed: its step counters are on the device, where fused (or capturable) optimizers make them; "
        "no frame shows the implementation yet";
  else if (basis == ImplementationBasis::kHostStepCounters)
    how =
        "foreach, PyTorch's default on CUDA, assumed: its states were made with no step counter on the device, "
        "so not fused; no frame shows the implementation yet";
  else if (basis == ImplementationBasis::kDefaultDevice)
    how =
        "foreach, PyTorch's default on CUDA, assumed: its step counters are on the device, but they were made under "
        "a default device (torch.device as a context, torch.set_default_device), which puts foreach's there too; no "
        "frame shows the implementation yet";
  else if (basis == ImplementationBasis::kHfTrainer)
    how =
        "fused, Hugging Face Trainer's default optim adamw_torch_fused with torch 2.8 or later, assumed: no frame "
        "shows the implementation";
  else if (basis == ImplementationBasis::kDefault)
    how = "foreach, PyTorch's default on CUDA, assumed: no frame shows the implementation";
  std::string temporaries;
  if (!need.temporaries_modelled) {
    temporaries = fmt::format("its arithmetic's temporaries ({}) are not counted", how);
  } else if (per == 0) {
    temporaries = fmt::format("{}its arithmetic ({}) makes no temporaries of the parameters' size",
                              first_step ? "then " : "", how);
  } else {
    temporaries =
        fmt::format("{}its arithmetic's temporaries ({}): {} x {} of {} = {} at their peak, of which {} alive",
                    first_step ? "then " : "", how, per, format_bytes(unit),
                    implementation == OptimizerImplementation::kSingleTensor ? "the largest parameter" : "gradients",
                    format_bytes(need.temporaries_total_bytes),
                    format_bytes(need.temporaries_total_bytes - need.temporaries_left_bytes));
  }
  const std::string name = q.optimizer ? std::string(q.optimizer->name) : std::string("optimizer");
  if (!first_step) {
    need.estimate =
        fmt::format("{} step after its first (its states exist: {}): {}", name, format_bytes(state_alive), temporaries);
    return true;
  }
  const std::string per_parameter =
      q.optimizer ? fmt::format("first {} step: {} per parameter ({}{})", name, count_states(states),
                                q.optimizer->states, added_states(*q.optimizer, need.states_added_by_options))
                  : std::string(
                        "first optimizer step, no torch.optim frame names it: Adam's and AdamW's two states per "
                        "parameter assumed");
  need.estimate = fmt::format("{}, {} x {} of {} = {}, of which {} existed; {}", per_parameter, states,
                              format_bytes(base), grads > 0 ? "gradients" : "parameters",
                              format_bytes(need.state_total_bytes), format_bytes(state_alive), temporaries);
  return true;
}

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

/// How the model's parameters lie, from their allocations (Note [Blocks
/// from the parameters]): its blocks (0 when they show none), the bytes of
/// the parameters before the first block (its stem: embeddings) and, for
/// Note [A language model's head], the stem's largest parameter (the token
/// embedding, vocabulary x d) and its depth in the model where it was
/// moved with .to() (FrameIndex::module_apply_depth; 0 where made on the
/// device), one block's parameter sizes, the most common first (the
/// smaller on a tie), and the parameters after the blocks (the final norm,
/// a head), in allocation order: their sizes and depths.
struct ParameterLayout {
  bool loaded = false;  ///< Note [Blocks from loaded weights]: from the sizes' counts, not their order
  int64_t blocks = 0;
  int64_t block_bytes = 0;  ///< one block's parameters
  int64_t stem_bytes = 0;
  int64_t embedding_bytes = 0;
  int embedding_depth = 0;
  std::vector<int64_t> block_sizes_by_count;
  std::vector<int64_t> tail_sizes;
  std::vector<int> tail_depths;
  /// A parameter after the blocks of the embedding's size was freed: the
  /// head's weight, replaced by the embedding's when tied to it.
  bool head_weight_freed = false;

  /// A head of the embedding's size of its own after the blocks.
  bool has_head_weight() const {
    return embedding_bytes > 0 && std::find(tail_sizes.begin(), tail_sizes.end(), embedding_bytes) != tail_sizes.end();
  }
  /// Moved with .to() and nothing after the blocks shallower than the
  /// embedding: no head of its own (Note [A language model's head]).
  bool moved_without_head() const {
    return embedding_depth > 0 && !tail_depths.empty() && !has_head_weight() &&
           std::all_of(tail_depths.begin(), tail_depths.end(), [&](int depth) { return depth >= embedding_depth; });
  }
  /// The head's weight is the embedding's (Note [Blocks in backward]).
  bool head_tied() const { return head_weight_freed || moved_without_head(); }
};

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

/// Note [Phase need] rule 3: the block pattern of the activations kept so
/// far; the model's blocks and head from `layout` (parameter_layout).
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

}  // namespace

const char* implementation_basis_name(ImplementationBasis basis) {
  switch (basis) {
    case ImplementationBasis::kNone:
      return "none";
    case ImplementationBasis::kFrames:
      return "frames";
    case ImplementationBasis::kStepCounters:
      return "step_counters";
    case ImplementationBasis::kHostStepCounters:
      return "host_step_counters";
    case ImplementationBasis::kDefaultDevice:
      return "default_device";
    case ImplementationBasis::kHfTrainer:
      return "hf_trainer";
    case ImplementationBasis::kDefault:
      return "default";
  }
  return "none";
}

const char* need_method_name(NeedMethod method) {
  switch (method) {
    case NeedMethod::kTrace:
      return "trace";
    case NeedMethod::kOptimizerFirstStep:
      return "optimizer_first_step";
    case NeedMethod::kOptimizerStep:
      return "optimizer_step";
    case NeedMethod::kForwardBlocks:
      return "forward_blocks";
    case NeedMethod::kInferenceBlocks:
      return "inference_blocks";
    case NeedMethod::kBackwardBlocks:
      return "backward_blocks";
    case NeedMethod::kRecomputedBlock:
      return "recomputed_block";
    case NeedMethod::kRequest:
      return "request";
  }
  return "request";
}

const char* need_covers(const PhaseNeed& need) {
  switch (need.method) {
    case NeedMethod::kRecomputedBlock:
      return need.blocks_after > 0 ? "the recomputations of the blocks still to come"
                                   : "the rest of the block's recomputation";
    case NeedMethod::kBackwardBlocks:
      return "the rest of backward's blocks";
    case NeedMethod::kForwardBlocks:
      return "the rest of the current block";
    case NeedMethod::kInferenceBlocks:
      return need.blocks_after > 0 ? "the blocks still to run" : "the rest of the current block";
    case NeedMethod::kTrace:
      return need.later_peak_bytes > 0 ? "the rest of the iteration's need" : "the rest of the phase's need";
    case NeedMethod::kOptimizerFirstStep:
    case NeedMethod::kOptimizerStep:
      return "the rest of the phase's need";
    case NeedMethod::kRequest:
      break;
  }
  return "";
}

const char* need_leaves_out(const PhaseNeed& need) {
  switch (need.method) {
    case NeedMethod::kRequest:
      return "what the rest of the phase needs is not in the snapshot";
    case NeedMethod::kRecomputedBlock:
      return need.blocks_after > 0 ? "each block's backward beyond its recomputation is not counted"
                                   : "the block's backward after its recomputation is not counted";
    case NeedMethod::kBackwardBlocks:
      return need.stem_gradient_bytes > 0 ? "the temporaries of backward through the embeddings are not counted"
                                          : "what backward allocates after the blocks is not counted";
    case NeedMethod::kInferenceBlocks:
      return need.model_blocks > 0 ? "what follows the model's blocks but the logits is not counted"
                                   : "the blocks after the current one are not in the snapshot";
    case NeedMethod::kForwardBlocks:
      return need.head_bytes > 0
                 ? "further copies of the logits (bf16 logits' fp32 copy, a shifted copy) are not counted"
             : need.model_blocks > 0 ? "what follows the model's blocks is not in the snapshot"
                                     : "the blocks after the current one are not in the snapshot";
    case NeedMethod::kTrace:
    case NeedMethod::kOptimizerFirstStep:
    case NeedMethod::kOptimizerStep:
      break;
  }
  return "";
}

void PhaseRunTracker::before_event(size_t index, Phase phase, bool oom, int64_t allocated_bytes) {
  if (is_training_phase(phase) && (!open_ || runs_.back().phase != phase)) {
    runs_.push_back(PhaseRun{phase, index, index, allocated_bytes, allocated_bytes, false});
    open_ = true;
  }
  if (!open_) return;
  runs_.back().end_event = index + 1;
  if (oom) {
    runs_.back().ended_by_oom = true;
    open_ = false;  // the oom ends the run; after_event still counts this event's bytes
    closing_ = true;
  }
}

void PhaseRunTracker::after_event(int64_t allocated_bytes) {
  if (open_ || closing_)
    runs_.back().peak_allocated_bytes = std::max(runs_.back().peak_allocated_bytes, allocated_bytes);
  closing_ = false;
}

std::vector<PhaseRun> PhaseRunTracker::finish(size_t events) {
  if (open_) runs_.back().end_event = events;
  open_ = false;
  return std::move(runs_);
}

namespace {

// Note [The rest of the iteration]
// Rationale: a fix judged against the failing phase alone can leave the
// step still failing in a phase after it. A recorded Llama (transformers'
// LlamaForCausalLM, hidden 256, scripts/record_cpu_snapshot.py --model
// llama --steps 2 --optimizer adamw --oom-in forward) peaks in backward,
// 98504712 B above where its forward began, against 94425128 B of
// forward: its untied head's gradient and the logits' come on top of what
// the forward kept. Its second forward's need by the first forward alone
// was 0.717 of what the run without the cap allocated from the failure.
// Approach: where rule 1 reads the same phase of an earlier iteration, the
// phases after that one in the same iteration (backward after forward, an
// optimizer step after either; until the next forward) are read too: the
// highest any of them rose above where the earlier phase began, when
// above that phase's own growth, is what this iteration still rises to.
// An optimizer step that made states (a first step) is left out: the
// step of this iteration makes none. Likewise a backward's gradients, up
// to those alive at the out-of-memory: kept from the step before
// (zero_grad(set_to_none=False), gradient accumulation), backward adds
// into them (compiled_step_oom.pickle: its first backward made 4 x 8 MiB
// of them and rose to 72 MiB above its forward's start; the second, with
// them alive, 40 MiB). A later phase that ran out of memory ends the
// reading.
// Limitations: the iteration is taken to run as the earlier one did (the
// same shapes; a different batch or sequence misleads rule 1 too).

/// The highest allocated bytes of run `run` up to the first event of code
/// outside it (a phase tracker's run takes the script's events between
/// phases too: what it allocates between iterations is alive now, not to
/// come), had it made none of the first `kept` bytes of gradients it made:
/// those this iteration holds already, which backward adds into
/// (AccumulateGrad's in-place add, where zero_grad(set_to_none=False) or
/// gradient accumulation keeps them).
int64_t later_run_peak(const std::vector<TraceEvent>& trace, const Attribution& attr, const PhaseRun& run,
                       int64_t kept) {
  std::unordered_set<int64_t> left_out;  // addresses of the gradients not made again
  int64_t allocated = run.start_allocated_bytes, peak = allocated;
  for (size_t i = run.first_event; i < run.end_event && i < trace.size(); ++i) {
    const Phase phase = attr.event_phase[i];
    if (phase == Phase::kOther || (is_training_phase(phase) && phase != run.phase)) break;
    const TraceEvent& e = trace[i];
    if (e.action == TraceAction::kAlloc) {
      if (attr.event_category[i] == Category::kGradients && 0 < e.size && e.size <= kept) {
        kept -= e.size;
        left_out.insert(e.addr);
        continue;
      }
      allocated += e.size;
      peak = std::max(peak, allocated);
    } else if (e.action == TraceAction::kFreeRequested && left_out.erase(e.addr) == 0) {
      allocated -= e.size;
    }
  }
  return peak;
}

/// The order of a phase in an iteration: forward, backward, optimizer; -1
/// for the others.
int iteration_order(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return 0;
    case Phase::kBackward:
      return 1;
    case Phase::kOptimizer:
      return 2;
    case Phase::kUnknown:
    case Phase::kOther:
      break;
  }
  return -1;
}

}  // namespace

std::string need_prose(const PhaseNeed& need) {
  if (need.later_peak_bytes <= 0) return phase_prose(need.phase);
  return fmt::format("{} and {} after it", phase_prose(need.phase), phase_prose(need.later_peak_phase));
}

PhaseNeed estimate_need(const NeedQuery& q, const std::vector<PhaseRun>& runs, const std::vector<TraceEvent>& trace,
                        const Attribution& attr, const FrameIndex& frames) {
  PhaseNeed need;
  need.known = true;
  need.phase = q.phase;
  need.still_needed_bytes = q.rounded_bytes;
  need.estimate = "request: only the failing request is known";
  const auto run = std::find_if(runs.rbegin(), runs.rend(), [&](const PhaseRun& r) {
    return r.first_event <= q.oom_event && q.oom_event < r.end_event;
  });
  if (run == runs.rend() || run->phase != q.phase) return need;

  const int64_t grown = q.allocated_bytes - run->start_allocated_bytes;
  const int64_t state_alive = q.live[static_cast<size_t>(Category::kOptimizerState)];
  const bool first_step = q.phase == Phase::kOptimizer &&
                          (new_state_bytes(trace, attr, run->first_event, q.oom_event) > 0 || state_alive == 0);

  // 1. trace: the same phase of an earlier iteration.
  for (auto earlier = std::next(run); earlier != runs.rend(); ++earlier) {
    if (earlier->phase != q.phase || earlier->ended_by_oom) continue;
    if (q.phase == Phase::kOptimizer &&
        (first_step || new_state_bytes(trace, attr, earlier->first_event, earlier->end_event) > 0)) {
      continue;
    }
    need.method = NeedMethod::kTrace;
    need.grown_bytes = grown;
    need.earlier_growth_bytes = earlier->peak_allocated_bytes - earlier->start_allocated_bytes;
    // Note [The rest of the iteration]
    for (auto later = earlier.base(); later != runs.end() && iteration_order(later->phase) > iteration_order(q.phase);
         ++later) {
      if (later->ended_by_oom) break;
      if (later->phase == Phase::kOptimizer && new_state_bytes(trace, attr, later->first_event, later->end_event) > 0)
        continue;
      const int64_t kept = later->phase == Phase::kBackward ? q.live[static_cast<size_t>(Category::kGradients)] : 0;
      const int64_t peak = later_run_peak(trace, attr, *later, kept);
      const int64_t rise = peak - earlier->start_allocated_bytes;
      if (rise > std::max(need.earlier_growth_bytes, need.later_peak_bytes)) {
        need.later_peak_bytes = rise;
        need.later_peak_phase = later->phase;
      }
    }
    need.still_needed_bytes =
        std::max(q.rounded_bytes, std::max(need.earlier_growth_bytes, need.later_peak_bytes) - grown);
    need.estimate = fmt::format(
        "trace: the same phase of an earlier iteration (events {} to {}) grew by {}{}; this one had grown by {} when "
        "it failed",
        earlier->first_event, earlier->end_event - 1, format_bytes(need.earlier_growth_bytes),
        need.later_peak_bytes > 0 ? fmt::format(", and {} after it rose to {} above where it began",
                                                phase_prose(need.later_peak_phase), format_bytes(need.later_peak_bytes))
                                  : "",
        format_bytes(grown));
    return need;
  }

  // 2. the optimizer step's known shape: a first step's states, then its arithmetic's temporaries.
  if (q.phase == Phase::kOptimizer && optimizer_step(q, *run, trace, attr, frames, first_step, need)) return need;

  const ParameterLayout layout = q.phase == Phase::kForward || q.phase == Phase::kBackward
                                     ? parameter_layout(trace, attr, frames)
                                     : ParameterLayout{};
  // 3. the forward's block pattern.
  if (q.phase == Phase::kForward && !q.inference) forward_blocks(q, *run, trace, attr, frames, layout, need);
  if (q.phase == Phase::kForward && q.inference) inference_blocks(q, *run, trace, attr, frames, layout, need);
  // 4. a block's turn in backward, as the previous block's ran.
  if (backward_blocks(q, *run, trace, attr, frames, layout, need)) return need;
  // 5. a checkpointed block recomputed in backward, as it ran in forward.
  recomputed_block(q, *run, trace, attr, frames, layout, need);
  return need;
}

}  // namespace oomtune::diagnose
