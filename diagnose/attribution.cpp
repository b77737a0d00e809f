#include "diagnose/attribution.h"

#include <unordered_map>

namespace oomtune::diagnose {
namespace {

bool is_training_phase(Phase p) { return p == Phase::kForward || p == Phase::kBackward || p == Phase::kOptimizer; }

}  // namespace

const char* category_name(Category category) {
  switch (category) {
    case Category::kParameters:
      return "parameters";
    case Category::kGradients:
      return "gradients";
    case Category::kOptimizerState:
      return "optimizer_state";
    case Category::kActivations:
      return "activations";
    case Category::kTemporaries:
      return "temporaries";
    case Category::kUnattributed:
      return "unattributed";
    case Category::kEvalOutputs:
      return "eval_outputs";
  }
  return "unattributed";
}

Category category_before_recording(StackId frames, const FrameIndex& index) {
  if (frames == 0) return Category::kUnattributed;
  if (index.allocates_parameters(frames)) return Category::kParameters;
  if (index.concatenates_eval_outputs(frames)) return Category::kEvalOutputs;
  switch (index.phase(frames)) {
    case Phase::kOptimizer:
      return index.runs_optimizer_math(frames) ? Category::kTemporaries : Category::kOptimizerState;
    case Phase::kBackward:
      return index.recomputes(frames) ? Category::kActivations : Category::kGradients;
    case Phase::kForward:
      return Category::kActivations;
    default:
      return Category::kUnattributed;
  }
}

Attribution attribute(const std::vector<TraceEvent>& trace, const FrameIndex& frames,
                      const std::vector<PhaseSpan>& marked) {
  Attribution out;
  const size_t n = trace.size();
  out.event_phase.assign(n, Phase::kUnknown);
  out.event_category.assign(n, Category::kTemporaries);

  // One pass (a 10^7-event trace: no per-event side tables but the outputs).
  // An allocation is retained when a phase boundary comes after it and no
  // later than its free (free_requested, or free_completed alone), or it is
  // never freed. Boundaries are numbered as they come: `epoch` counts those
  // at or before the current event, so a boundary lies in (alloc, free]
  // exactly when the epoch grew between the two.
  struct Open {
    size_t event;
    uint64_t epoch;
  };
  std::unordered_map<int64_t, Open> open;  // addr -> its last alloc not yet freed
  // The oomtune mark an event lies in (nullptr: none, or no time).
  auto marked_span = [&](const TraceEvent& e) -> const PhaseSpan* {
    return marked.empty() || e.time_us == 0 ? nullptr : span_at(marked, e.time_us);
  };
  auto categorize = [&](size_t i, bool retained) {
    Category c = Category::kTemporaries;
    const PhaseSpan* span = retained ? marked_span(trace[i]) : nullptr;
    if (frames.allocates_parameters(trace[i].frames) || (span && span->load)) {
      c = Category::kParameters;
    } else if (frames.concatenates_eval_outputs(trace[i].frames)) {
      c = Category::kEvalOutputs;
    } else if (retained) {
      switch (out.event_phase[i]) {
        case Phase::kOptimizer:
          // An optimizer's arithmetic makes temporaries only, alive at an out-of-memory or not.
          c = frames.runs_optimizer_math(trace[i].frames) ? Category::kTemporaries : Category::kOptimizerState;
          break;
        case Phase::kBackward:
          c = frames.recomputes(trace[i].frames) ? Category::kActivations : Category::kGradients;
          break;
        case Phase::kForward:
          c = Category::kActivations;
          break;
        default:
          c = Category::kUnattributed;
          break;
      }
    }
    out.event_category[i] = c;
  };

  Phase last_framed = Phase::kUnknown;
  bool seen_forward = false;
  bool seen_after_forward = false;  // a backward/optimizer event since the last iteration start
  Phase current = Phase::kUnknown;  // the training phase run we are in (kUnknown after an oom)
  uint64_t epoch = 0;
  for (size_t i = 0; i < n; ++i) {
    const TraceEvent& e = trace[i];
    // Phase: oomtune's marks first, then frames, then trace order for
    // frameless events.
    Phase p = frames.phase(e.frames);
    const bool alloc = e.action == TraceAction::kAlloc;
    // No Python frames, none of the autograd engine's either: stack 0, or
    // C++ frames alone (any Python frame gives a phase, frames.h).
    const bool frameless = p == Phase::kUnknown;
    if (alloc && frameless) {
      ++out.alloc_events_without_frames;
      out.bytes_without_frames += e.size;
    }
    const PhaseSpan* span = marked_span(e);
    if (span && span->source == MarkSource::kOptimizerStep && !frameless) span = nullptr;  // its frames say
    if (span) {
      p = span->phase;
      if (alloc && span->source == MarkSource::kOomtune) ++out.alloc_events_in_marked_phases;
      if (alloc && span->source == MarkSource::kOptimizerStep) ++out.frameless_in_optimizer_marks;
    } else if (frameless) {
      if (last_framed == Phase::kOptimizer) {
        p = Phase::kOptimizer;
      } else if (seen_forward) {
        p = Phase::kBackward;
      }
      if (alloc) {
        if (p == Phase::kBackward) ++out.frameless_inferred_backward;
        if (p == Phase::kOptimizer) ++out.frameless_inferred_optimizer;
      }
    } else if (is_training_phase(p)) {
      last_framed = p;
    }
    if (alloc) ++out.alloc_events;
    if (alloc && p == Phase::kForward) {
      ++out.forward_alloc_events;
      if (frames.checkpointed(e.frames)) ++out.checkpointed_forward_allocs;
    }
    if (alloc && p == Phase::kBackward && frames.recomputes(e.frames)) ++out.recomputed_backward_allocs;
    if (p == Phase::kForward) {
      if (!seen_forward || seen_after_forward) out.iteration_starts.push_back(i);
      seen_forward = true;
      seen_after_forward = false;
    } else if (p == Phase::kBackward || p == Phase::kOptimizer) {
      seen_after_forward = seen_forward;
    }
    out.event_phase[i] = p;

    // A phase boundary: an event that starts a different training phase
    // run, or an oom.
    const bool oom = e.action == TraceAction::kOom;
    if (oom || (is_training_phase(p) && current != Phase::kUnknown && p != current)) ++epoch;
    if (is_training_phase(p)) current = p;
    if (oom) current = Phase::kUnknown;

    if (e.action == TraceAction::kAlloc) {
      auto [it, inserted] = open.try_emplace(e.addr, Open{i, epoch});
      if (!inserted) {  // the earlier alloc at this address is never freed
        categorize(it->second.event, true);
        it->second = Open{i, epoch};
      }
    } else if (e.action == TraceAction::kFreeRequested || e.action == TraceAction::kFreeCompleted) {
      auto it = open.find(e.addr);
      if (it != open.end()) {
        categorize(it->second.event, epoch > it->second.epoch);
        open.erase(it);
      }
    }
  }
  for (const auto& [addr, o] : open) categorize(o.event, true);
  return out;
}

}  // namespace oomtune::diagnose
