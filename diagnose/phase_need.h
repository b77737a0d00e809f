#pragma once
// What the phase that ran out of memory still needed: the bytes beyond
// those allocated at the out-of-memory that the rest of the phase would
// have allocated. A fix is "enough" when it frees at least that much
// (recommendations.cpp).
//
// Note [Phase need]
// Rationale: the failing request is only the first allocation that did not
// fit; the phase goes on allocating. A fix that frees the request but not
// the rest fails one allocation later (issue #48: 42 MiB defragmented
// against gigabytes of AdamW state still to come).
// Approach, first that applies (each says which in `estimate`):
//   1. trace: the trace holds the same phase of an earlier iteration that
//      did not run out of memory (for the optimizer, a step that allocated
//      no new state, when this one is not a first step either): it grew by
//      G = its peak - its start; this one had grown by S = allocated at the
//      oom - allocated at its start; still needed = G - S, or L - S where
//      a later phase of that iteration rose L > G above that start (Note
//      [The rest of the iteration], phase_need.cpp).
//   2. optimizer first step: the optimizer's states per parameter with a
//      gradient (OptimizerKind, named by the trace's torch/optim/ frames:
//      AdamW's _init_group makes exp_avg and exp_avg_sq as zeros_like(p)
//      for every p whose grad is not None, RMSprop's square_avg; more
//      where _init_group's lines show states an option adds, Note [States
//      an option adds]; Adam's two where no frame names the optimizer,
//      whose temporaries are then not counted (bitsandbytes', DeepSpeed's:
//      their own arithmetic); not for one whose first step makes none,
//      Adagrad): states x the gradients alive (else the
//      parameters) less the optimizer state that already exists; plus the
//      temporaries its arithmetic then holds at its peak (where no frame
//      of the step shows the implementation: fused where its step counters
//      are on the device, Note [Step counters on the device], or under
//      Hugging Face's Trainer, its default; else foreach, CUDA's default:
//      Adam's _foreach_sqrt of every exp_avg_sq, 1 x the gradients) less
//      those of them alive. A later step whose trace holds no earlier
//      one (optimizer_step: recording began in the step before): those
//      temporaries alone. One parameter group is assumed: with several
//      (Hugging Face's decay and no-decay groups), each group's arithmetic
//      runs after its own states, so the temporaries are the largest
//      group's, fewer than counted.
//   3. forward blocks: the activations the forward kept, by layer, repeat
//      with a period (one block of the model) over the longest regular run
//      (the smallest period over 90% of them; else the longest run of a
//      whole block again, over two layers or more);
//      the rest of the current block is (bytes per complete block) - (bytes
//      of the current block so far, with the temporaries it has not freed
//      yet: a real GPT-2's MLP, issue #48). How many blocks remain is not
//      in the snapshot, so this is a lower bound (`lower_bound`), unless
//      the parameters' allocations show how many blocks the model has
//      (Note [Blocks from the parameters], parameter_layout.cpp): then the blocks
//      after the current one are counted too, and a language model's
//      logits and its loss's log_softmax after them (Note [A language
//      model's head]); it stays a lower bound (a head of another kind, the
//      backward after the forward, are not counted). Not for a forward
//      without autograd (generate(), evaluation):
//      it keeps a KV cache and frees each block's output after the next
//      block, so what stays per block is no block's whole pattern. Such a
//      forward whose blocks show (Note [Blocks that kept nothing]): the
//      last complete block's rise and end say what the rest of the current
//      block and each block after it add, then a language model's logits
//      (inference blocks, Note [Blocks without autograd], forward_need.cpp).
//   4. backward blocks: backward past its first block: the previous
//      block's turn (its recomputation, with checkpointing, and its
//      backward), of the same shapes, says how far this one grows and how
//      much higher each block after it starts (Note [Blocks in backward],
//      backward_need.cpp), then the gradients of the parameters before the
//      blocks (embeddings). A lower bound: their temporaries are not
//      counted.
//   5. recomputed block: the failing request was part of a checkpointed
//      block's recomputation in backward (FrameIndex::recomputes); the rest
//      of it is read from the block's first run, in forward (Note
//      [Recomputed block], backward_need.cpp), and, in backward's first
//      recomputation of a model whose layers after the blocks train, the
//      turns of the blocks after it from their parameters (Note [The turns
//      after a recomputed block]). A lower bound: each block's backward,
//      after its recomputation, is not counted.
//   6. request: only the failing request is known.
// Never below the rounded request.
// Limitations: the estimate compares bytes, not free blocks; temporaries
// of the remaining phase beyond its peak growth (trace) are not counted.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "diagnose/attribution.h"
#include "diagnose/frames.h"
#include "diagnose/nothing_saved.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// Which rule of Note [Phase need] gave the estimate.
enum class NeedMethod : uint8_t {
  kTrace,
  kOptimizerFirstStep,
  kOptimizerStep,
  kForwardBlocks,
  kInferenceBlocks,
  kBackwardBlocks,
  kRecomputedBlock,
  kRequest
};

/// "trace", "optimizer_first_step", "optimizer_step", "forward_blocks", "inference_blocks",
/// "backward_blocks", "recomputed_block", "request".
const char* need_method_name(NeedMethod method);

struct PhaseNeed;

/// What the need counts beyond the request, for a sentence: "the rest of
/// the block's recomputation", "the rest of backward's blocks", "the rest
/// of the current block" (forward blocks), "the rest of the phase's need"
/// (trace, optimizer first step); "" for the request alone.
const char* need_covers(const PhaseNeed& need);

/// The phase the need is for, for a sentence: "the forward phase", or
/// "the forward phase and the backward phase after it" where a later
/// phase of the iteration sets it (Note [The rest of the iteration]).
std::string need_prose(const PhaseNeed& need);

/// What a lower-bound or request-only need leaves out, for a sentence
/// ("what backward allocates after the blocks is not counted"); "" for a
/// need that leaves nothing out (trace, optimizer first step).
const char* need_leaves_out(const PhaseNeed& need);

/// A run of consecutive events of one training phase (other/unknown events
/// do not end a run; an oom does).
struct PhaseRun {
  Phase phase = Phase::kUnknown;
  size_t first_event = 0;             ///< index of its first event
  size_t end_event = 0;               ///< one past its last event
  int64_t start_allocated_bytes = 0;  ///< allocated just before its first event
  int64_t peak_allocated_bytes = 0;   ///< highest allocated during it
  bool ended_by_oom = false;
};

/// Cuts a trace into PhaseRuns while the replay advances.
class PhaseRunTracker {
 public:
  /// Before applying event `index`, with the replay's allocated bytes then.
  void before_event(size_t index, Phase phase, bool oom, int64_t allocated_bytes);
  /// After applying it.
  void after_event(int64_t allocated_bytes);
  /// The runs, in trace order (call once, after the last event).
  std::vector<PhaseRun> finish(size_t events);

 private:
  std::vector<PhaseRun> runs_;
  bool open_ = false;     // the last run takes the next training event of its phase
  bool closing_ = false;  // an oom just ended the last run
};

/// The out-of-memory the estimate is for.
struct NeedQuery {
  size_t oom_event = 0;
  Phase phase = Phase::kUnknown;
  int64_t rounded_bytes = 0;                   ///< the failing request, rounded
  int64_t allocated_bytes = 0;                 ///< at the oom
  std::array<int64_t, kNumCategories> live{};  ///< bytes alive at the oom, by Category
  bool inference = false;                      ///< a forward without autograd (OomReport::inference())
  /// The optimizer the trace names (Diagnosis::optimizer); nullptr: none,
  /// then Adam's two states per parameter are assumed.
  const OptimizerKind* optimizer = nullptr;
  bool generating = false;  ///< that forward is Hugging Face's generate() (InferenceKind::kGenerate)
  /// Its blocks, where Note [Blocks that kept nothing] read them already
  /// (OomReport::nothing_saved); nullptr: read them again.
  const NothingSaved* blocks = nullptr;
};

/// What told the optimizer's implementation (Note [Phase need] rule 2).
enum class ImplementationBasis : uint8_t {
  kNone,              ///< nothing: no torch.optim frame names the optimizer
  kFrames,            ///< a frame of its arithmetic (_multi_tensor_adam, ...)
  kStepCounters,      ///< fused: its step counters on the device (Note [Step counters on the device])
  kHostStepCounters,  ///< foreach: states made without step counters on the device (the same Note)
  kDefaultDevice,     ///< foreach: step counters on the device, made under a default device (the same Note)
  kHfTrainer,         ///< fused: Hugging Face Trainer's default optimizer
  kDefault,           ///< foreach: PyTorch's default on CUDA
};

/// "none", "frames", "step_counters", "host_step_counters",
/// "default_device", "hf_trainer", "default" (JSON).
const char* implementation_basis_name(ImplementationBasis basis);

/// What the failing phase still needed (Note [Phase need]).
struct PhaseNeed {
  bool known = false;  ///< false without an oom
  Phase phase = Phase::kUnknown;
  NeedMethod method = NeedMethod::kRequest;
  int64_t still_needed_bytes = 0;  ///< beyond what was allocated at the oom; >= the rounded request
  /// forward blocks: not counted are the blocks after the current one (or,
  /// with model_blocks, what follows the model's blocks); backward blocks:
  /// what backward allocates after the blocks; recomputed block: the
  /// block's backward
  bool lower_bound = false;
  std::string estimate;              ///< how it was estimated, one sentence
  int64_t grown_bytes = 0;           ///< trace: what this phase had allocated since its start
  int64_t earlier_growth_bytes = 0;  ///< trace: what the earlier run grew by
  /// trace: the highest a later phase of the earlier run's iteration rose
  /// above where the earlier run began, where above its own growth (Note
  /// [The rest of the iteration], phase_need.cpp); 0 and kUnknown otherwise
  int64_t later_peak_bytes = 0;
  Phase later_peak_phase = Phase::kUnknown;
  /// optimizer first step: the states it allocates per parameter
  /// (OptimizerKind::states_per_parameter, or more where its _init_group
  /// made more; 2 where no frame names it)
  int states_per_parameter = 0;
  /// optimizer first step: of those, the states the table's default options
  /// do not make but its _init_group did (Note [States an option adds]:
  /// amsgrad's max_exp_avg_sq, ...)
  int states_added_by_options = 0;
  int64_t state_total_bytes = 0;  ///< optimizer first step: states_per_parameter x gradients (or parameters)
  /// optimizer first step: how its arithmetic runs, and what says so
  /// (implementation_basis), the temporaries it holds at its peak
  /// (OptimizerKind; temporaries_modelled false where the table has no
  /// figure) and those of them still to come at the oom
  OptimizerImplementation implementation = OptimizerImplementation::kUnknown;
  ImplementationBasis implementation_basis = ImplementationBasis::kNone;
  /// The implementation is assumed: known, but from no frame of its arithmetic.
  bool implementation_assumed() const {
    return implementation_basis != ImplementationBasis::kFrames && implementation_basis != ImplementationBasis::kNone;
  }
  bool temporaries_modelled = false;
  int64_t temporaries_total_bytes = 0;
  int64_t temporaries_left_bytes = 0;
  /// forward blocks: complete blocks before the oom; backward blocks: the
  /// blocks whose backward ran before the current one's
  int64_t blocks_done = 0;
  int64_t block_bytes = 0;  ///< forward blocks: activations kept per complete block
  /// forward blocks: of the current block; backward blocks: what the
  /// current block's turn had grown by
  int64_t block_so_far_bytes = 0;
  /// forward blocks: the logits a language model's head makes after the
  /// blocks (Note [A language model's head]); 0 when not known
  int64_t head_bytes = 0;
  /// forward blocks: the loss's log_softmax over those logits, fp32 (Note
  /// [A language model's head]); 0 when no head is known
  int64_t loss_bytes = 0;
  /// backward blocks: the bytes of the parameters before the blocks (the
  /// stem: embeddings), whose gradients backward makes after them; 0 when
  /// the parameters' allocations do not show it (Note [Blocks in backward])
  int64_t stem_gradient_bytes = 0;
  /// backward blocks: where the head is tied to the token embedding, the
  /// sum of the head's gradient and the embedding's, a new tensor of the
  /// embedding's size (Note [Blocks in backward]); 0 otherwise
  int64_t tied_gradient_sum_bytes = 0;
  /// forward blocks: the model's blocks, counted from its parameters'
  /// allocations (Note [Blocks from the parameters]); backward blocks: the
  /// blocks of this backward (done, current and after); 0 when not known.
  int64_t model_blocks = 0;
  /// forward blocks: complete blocks after the current one that the need
  /// counts (model_blocks - blocks_done - 1); backward blocks: blocks whose
  /// backward is still to come after the current one.
  int64_t blocks_after = 0;
  /// backward blocks: the previous block's peak growth from its marker (its
  /// first recomputed allocation, or its first freed forward tensor), its
  /// peak up to its last freed forward tensor (what a last block grows
  /// by), and its growth at its end (what it kept)
  int64_t block_peak_bytes = 0;
  int64_t last_block_peak_bytes = 0;
  int64_t block_net_bytes = 0;
  /// recomputed block: the allocations of the recomputation, the failing
  /// request included, found in a row in forward
  int64_t recomputed_allocs = 0;
  /// recomputed block: the forward events that ran the rest of the block,
  /// from the failing request's counterpart to the block's end; -1 when
  /// not found
  int64_t forward_first_event = -1;
  int64_t forward_last_event = -1;
};

/// Estimates what the phase of `query` still needed. `runs` from
/// PhaseRunTracker over the same `trace`.
PhaseNeed estimate_need(const NeedQuery& query, const std::vector<PhaseRun>& runs, const std::vector<TraceEvent>& trace,
                        const Attribution& attribution, const FrameIndex& frames);

}  // namespace oomtune::diagnose
