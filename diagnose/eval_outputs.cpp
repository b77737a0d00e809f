#include "diagnose/eval_outputs.h"

#include <algorithm>

namespace oomtune::diagnose {
namespace {

/// Keeps the largest and the largest smaller size seen.
void note_size(int64_t size, int64_t& largest, int64_t& second) {
  if (size > largest) {
    second = largest;
    largest = size;
  } else if (size < largest && size > second) {
    second = size;
  }
}

}  // namespace

void EvalOutputTracker::observe(const TraceEvent& e) {
  if (e.action == TraceAction::kAlloc && frames_.concatenates_eval_outputs(e.frames))
    note_size(e.size, largest_, second_);
}

EvalOutputs EvalOutputTracker::at_oom(const TraceEvent& oom, int64_t alive_bytes) const {
  EvalOutputs o;
  o.bytes = alive_bytes;
  o.at_concat = frames_.concatenates_eval_outputs(oom.frames);
  int64_t largest = largest_;
  int64_t second = second_;
  if (o.at_concat) {
    o.request_bytes = oom.size;
    note_size(oom.size, largest, second);
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
