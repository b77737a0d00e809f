#include "diagnose/snapshot_file.h"

#include <fmt/format.h>

#include "common/error.h"
#include "common/file_magic.h"

namespace oomtune::diagnose {

std::string non_snapshot_kind(std::string_view head) {
  // Whitespace may precede HTML and JSON, never a pickle's first opcode.
  std::string_view text = head;
  while (!text.empty() && (text.front() == ' ' || text.front() == '\n' || text.front() == '\r' || text.front() == '\t'))
    text.remove_prefix(1);
  if (head.rfind('\x80', 0) == 0) return "";  // PROTO: a pickle, maybe a snapshot
  if (std::string kind = binary_format(head); !kind.empty()) return kind;
  if (text.rfind("<", 0) == 0) return "an HTML or XML file (the memory viewer's page?)";
  if (text.rfind("{", 0) == 0 || text.rfind("[{", 0) == 0) return "a JSON file (a profiler or Chrome trace?)";
  return "";
}

void expect_a_snapshot_pickle(std::string_view head, const std::string& name) {
  const std::string kind = non_snapshot_kind(head);
  if (kind.empty()) return;
  throw SnapshotError(
      fmt::format("{}: is {}, not a memory snapshot pickle; write one with "
                  "torch.cuda.memory._record_memory_history() before the run and "
                  "torch.cuda.memory._dump_snapshot(\"snapshot.pickle\") after the out-of-memory",
                  name, kind));
}

}  // namespace oomtune::diagnose
