#pragma once
// Writing output files so that no reader ever sees half a file and no old
// file is lost to a failed write.

#include <string>

namespace oomtune {

/// Writes `contents` to `path` atomically: into "path.tmp.<pid>" in the same
/// directory, flushed and fsync'ed, then rename(2)d over `path`. Creates no
/// directories. Throws OutputError naming the path and the OS reason; on
/// failure the old file (if any) is untouched and the temporary is removed.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace oomtune
