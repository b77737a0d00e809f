#include "diagnose/caught_oom.h"

namespace oomtune::diagnose {

size_t last_alloc_event(const std::vector<TraceEvent>& trace) {
  for (size_t i = trace.size(); i > 0; --i) {
    if (trace[i - 1].action == TraceAction::kAlloc) return i - 1;
  }
  return trace.size();
}

int64_t allocations_after(const std::vector<TraceEvent>& trace, size_t index) {
  int64_t allocations = 0;
  for (size_t i = index + 1; i < trace.size() && trace[i].action != TraceAction::kOom; ++i) {
    if (trace[i].action == TraceAction::kAlloc) ++allocations;
  }
  return allocations;
}

}  // namespace oomtune::diagnose
