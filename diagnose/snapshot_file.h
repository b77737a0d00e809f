#pragma once
// What a file handed to `diagnose` is when it is not a snapshot pickle: the
// viewer's HTML, a profiler's JSON trace, a model archive... so that the
// error says so instead of "unknown opcode at byte 0".

#include <string>
#include <string_view>

namespace oomtune::diagnose {

/// For a file whose first bytes are `head` and that is not a pickle, what it
/// most likely is, as a phrase completing "PATH is ...": "a zip archive (a
/// TorchScript model or a torch.save file?)", "an HTML file (the memory
/// viewer's page?)", "a JSON file (a profiler trace?)", "a SQLite database",
/// "gzip-compressed" (common/file_magic.h names the binary ones). "" when
/// `head` may start a pickle (PROTO 0x80, or a protocol 0/1 opcode) or is
/// not recognized: the pickle reader then says what is wrong.
std::string non_snapshot_kind(std::string_view head);

/// Throws SnapshotError "NAME: is KIND, not a memory snapshot pickle; write
/// one with ..." when non_snapshot_kind(head) names something. For callers
/// (the diagnose command) to check a file's first bytes before load_snapshot,
/// which reads any bytes exactly as the plain pickle read does.
void expect_a_snapshot_pickle(std::string_view head, const std::string& name);

}  // namespace oomtune::diagnose
