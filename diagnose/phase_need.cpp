#include "diagnose/phase_need.h"

#include <algorithm>
#include <iterator>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/byte_size.h"
#include "diagnose/need_rules.h"
#include "diagnose/parameter_layout.h"

namespace oomtune::diagnose {
namespace {

bool is_training_phase(Phase p) { return p == Phase::kForward || p == Phase::kBackward || p == Phase::kOptimizer; }

}  // namespace

int64_t net_growth(const std::vector<TraceEvent>& trace, size_t first, size_t end) {
  int64_t grown = 0;
  for (size_t i = first; i < end; ++i) {
    if (trace[i].action == TraceAction::kAlloc) grown += trace[i].size;
    if (trace[i].action == TraceAction::kFreeRequested) grown -= trace[i].size;
  }
  return grown;
}

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
