#include "diagnose/eval_outputs.h"

#include <algorithm>

#include "diagnose/replay.h"

namespace oomtune::diagnose {

void EvalOutputTracker::observe(const TraceEvent& e) {
  if (e.action != TraceAction::kAlloc || !frames_.concatenates_eval_outputs(e.frames)) return;
  if (e.size > largest_) {
    second_ = largest_;
    largest_ = e.size;
  } else if (e.size < largest_ && e.size > second_) {
    second_ = e.size;
  }
}

EvalOutputs EvalOutputTracker::at_oom(const TraceEvent& oom, const Replay& replay) const {
  EvalOutputs o;
  for (const auto& [address, block] : replay.live()) {
    if (block.allocated && frames_.concatenates_eval_outputs(block.frames)) o.bytes += block.size;
  }
  o.at_concat = frames_.concatenates_eval_outputs(oom.frames);
  int64_t largest = largest_;
  int64_t second = second_;
  if (o.at_concat) {
    o.request_bytes = oom.size;
    if (oom.size > largest) {
      second = largest;
      largest = oom.size;
    } else if (oom.size < largest && oom.size > second) {
      second = oom.size;
    }
  }
  if (second > 0) {
    o.step_bytes = largest - second;
    o.steps = (largest + o.step_bytes / 2) / o.step_bytes;
  }
  return o;
}

EvalAccumulation eval_accumulation(const EvalOutputs& o, int64_t needed_bytes) {
  auto frees = [&](int64_t k) {
    const int64_t kept = std::max<int64_t>(0, o.bytes - (k - 1) * o.step_bytes);
    const int64_t asked = !o.at_concat ? 0
                          : k == 1     ? o.request_bytes
                                       : std::max<int64_t>(0, o.request_bytes - k * o.step_bytes);
    return kept + asked;
  };
  EvalAccumulation best{1, frees(1)};
  if (o.step_bytes <= 0) return best;
  for (int64_t k = std::max<int64_t>(1, o.steps - 1); k > 1; --k) {
    if (frees(k) >= needed_bytes) return EvalAccumulation{k, frees(k)};
  }
  return best;
}

}  // namespace oomtune::diagnose
