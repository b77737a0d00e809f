#pragma once
// Live bytes by the tags PyTorch records beside each trace event
// (Snapshot::event_tags): the string a training script set with
// torch.cuda.memory._set_memory_metadata() ("eval", "step 3 forward"...),
// and the torch.compile region that was running when it recorded with
// _record_memory_history(compile_context=True). Either groups a snapshot's
// memory by what the user or the compiler named, where frames alone cannot
// (a C++ trial has none; inductor's generated code names no layer).

#include <cstdint>
#include <string>
#include <vector>

#include "diagnose/replay.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// Allocated bytes whose alloc event carries one tag text.
struct TagBytes {
  /// The text; kNoTag for blocks allocated without one, kBeforeRecording
  /// for blocks alive before the trace's first event (no alloc event).
  std::string tag;
  int64_t bytes = 0;   ///< SUM: allocated block bytes
  int64_t blocks = 0;  ///< COUNT
};
inline constexpr const char* kNoTag = "(none)";
inline constexpr const char* kBeforeRecording = "(before recording)";

/// Allocated bytes by each kind of tag, biggest first.
struct TaggedBytes {
  std::vector<TagBytes> user_metadata;     ///< empty when no event of the trace carries user metadata
  std::vector<TagBytes> compile_contexts;  ///< empty when no event of the trace carries a compile context
  bool empty() const { return user_metadata.empty() && compile_contexts.empty(); }
};

/// Which tags device `device`'s trace carries at all.
struct TagPresence {
  bool user_metadata = false;
  bool compile_contexts = false;
};
TagPresence tags_in_trace(const Snapshot& snapshot, int device);

/// The allocated blocks of `replay` (a replay of device `device` of
/// `snapshot`) grouped by the tags of their alloc events: at most `top`
/// entries each, biggest first, the rest merged into a last "(N more)"
/// entry. Kinds `present` does not name stay empty.
TaggedBytes tagged_bytes_now(const Replay& replay, const Snapshot& snapshot, int device, TagPresence present, int top);

}  // namespace oomtune::diagnose
