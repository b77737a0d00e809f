#include "trial/cublas_workspaces.h"

#include <algorithm>
#include <optional>

namespace oomtune {

std::vector<TrackedEvent> with_cublas_workspaces(const std::vector<TrackedEvent>& events, const CublasCalls& calls,
                                                 int64_t workspace_bytes, int64_t lt_workspace_bytes, uint32_t op,
                                                 std::size_t& end) {
  // Odd: every tracked block's address is a multiple of 64 (CPU blocks'
  // alignment, and the meta device's made-up addresses step by 64: Note
  // [Meta addresses]), so none is one of these.
  constexpr uint64_t kWorkspaceAddress = (0xC0B1A5ull << 40) | 1;
  struct Insert {
    CublasCall call;
    int64_t bytes;
  };
  std::vector<Insert> inserted;
  for (const std::optional<CublasCall>& call : {calls.training_thread, calls.autograd_thread})
    if (call && call->event < end && call->event <= events.size()) inserted.push_back({*call, workspace_bytes});
  if (lt_workspace_bytes > 0)
    for (const std::optional<CublasCall>& call : {calls.lt_training_thread, calls.lt_autograd_thread})
      if (call && call->event < end && call->event <= events.size()) inserted.push_back({*call, lt_workspace_bytes});
  std::stable_sort(inserted.begin(), inserted.end(),
                   [](const Insert& a, const Insert& b) { return a.call.event < b.call.event; });
  std::vector<TrackedEvent> out;
  out.reserve(events.size() + inserted.size());
  std::size_t next = 0;
  for (std::size_t i = 0; i <= events.size(); ++i) {
    for (; next < inserted.size() && inserted[next].call.event == i; ++next) {
      TrackedEvent workspace;
      workspace.kind = TrackedEvent::Kind::kAlloc;
      workspace.pool = MemoryPool::kDevice;
      workspace.phase = inserted[next].call.phase;
      workspace.address = kWorkspaceAddress + 2 * next;
      workspace.bytes = inserted[next].bytes;
      workspace.op = op;
      out.push_back(workspace);
    }
    if (i < events.size()) out.push_back(events[i]);
  }
  end += inserted.size();
  return out;
}

}  // namespace oomtune
