#include "probes/device_stream.h"

namespace oomtune {

std::vector<allocsim::AllocEvent> device_stream(const std::vector<TrackedEvent>& events, std::size_t begin,
                                                std::size_t end, const std::vector<std::string>* op_names) {
  std::vector<allocsim::AllocEvent> stream;
  int64_t order = 0;
  for (std::size_t i = begin; i < end && i < events.size(); ++i) {
    const TrackedEvent& e = events[i];
    if (e.pool != MemoryPool::kDevice) continue;
    stream.push_back(e.kind == TrackedEvent::Kind::kAlloc ? allocsim::alloc_event(e.address, e.bytes, order, e.phase)
                                                          : allocsim::free_event(e.address, order, e.phase));
    if (op_names && e.op < op_names->size()) stream.back().op = (*op_names)[e.op];
    stream.back().call = e.op_call;
    ++order;
  }
  return stream;
}

}  // namespace oomtune
