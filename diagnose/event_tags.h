#pragma once
// Live bytes by the tags PyTorch records beside each trace event
// (Snapshot::event_tags): the string a training script set with
// torch.cuda.memory._set_memory_metadata() ("eval", "step 3 forward"...),
// and the torch.compile region that was running when it recorded with
// _record_memory_history(compile_context=True); and by the user's own
// record_function marks open when each block was allocated (the
// allocator's history keeps the record_function marks of the recording
// thread as START and END annotations: external_annotations). Each groups
// a snapshot's memory by what the user or the compiler named, where
// frames alone cannot (a C++ trial has none; inductor's generated code
// names no layer).

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
  /// By the innermost user record_function open at the allocation; empty
  /// when the device has no such mark.
  std::vector<TagBytes> record_functions;
  bool empty() const { return user_metadata.empty() && compile_contexts.empty() && record_functions.empty(); }
};

/// The user's record_function marks over a device's trace: its
/// external_annotations other than oomtune's ("oomtune:") and torch.optim's
/// ("Optimizer.", phase_marks.h), a START opening a mark and an END closing
/// the innermost open one of its name. An annotation counts for the trace
/// events at or after its time (the clock of the events' time_us).
class RecordFunctions {
 public:
  /// Reads `snapshot`'s marks of device `device` against its trace.
  RecordFunctions(const Snapshot& snapshot, int device);
  /// True when some trace event lies inside such a mark.
  bool any() const { return !runs_.empty(); }
  /// The innermost mark open at trace event `event` ("" for none).
  const std::string& innermost_at(size_t event) const;
  /// The marks open at trace event `event`, outermost first.
  std::vector<std::string> open_at(size_t event) const;

 private:
  const Snapshot& snapshot_;
  int device_ = 0;
  std::vector<const Annotation*> marks_;  // the device's, by time (file order within a microsecond)
  std::vector<std::string> names_{""};    // [0]: none
  std::vector<TagRun> runs_;              // the innermost mark (an index into names_), by event
};

/// Which tags device `device`'s trace carries at all.
struct TagPresence {
  bool user_metadata = false;
  bool compile_contexts = false;
  bool record_functions = false;
};
TagPresence tags_in_trace(const Snapshot& snapshot, int device, const RecordFunctions& marks);

/// The allocated blocks of `replay` (a replay of device `device` of
/// `snapshot`) grouped by the tags of their alloc events and by the
/// innermost record_function open then (`marks`): at most `top` entries
/// each, biggest first, the rest merged into a last "(N more)" entry. Kinds
/// `present` does not name stay empty.
TaggedBytes tagged_bytes_now(const Replay& replay, const Snapshot& snapshot, int device, const RecordFunctions& marks,
                             TagPresence present, int top);

}  // namespace oomtune::diagnose
