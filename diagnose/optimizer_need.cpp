#include "diagnose/need_rules.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "common/byte_size.h"

namespace oomtune::diagnose {
namespace {

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

/// Bytes the optimizer's arithmetic (FrameIndex::runs_optimizer_math)
/// allocated in events [first, end) and had not freed by `end`.
int64_t arithmetic_bytes_alive(const std::vector<TraceEvent>& trace, const FrameIndex& frames, size_t first,
                               size_t end) {
  return bytes_alive(trace, first, end, [&](size_t i) { return frames.runs_optimizer_math(trace[i].frames); });
}

}  // namespace

int64_t new_state_bytes(const std::vector<TraceEvent>& trace, const Attribution& attr, size_t first, size_t end) {
  int64_t bytes = 0;
  for (size_t i = first; i < end && i < trace.size(); ++i) {
    if (trace[i].action == TraceAction::kAlloc && attr.event_category[i] == Category::kOptimizerState) {
      bytes += trace[i].size;
    }
  }
  return bytes;
}

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

}  // namespace oomtune::diagnose
