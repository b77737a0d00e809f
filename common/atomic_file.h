#pragma once
// Writing output files so that no reader ever sees half a file and no old
// file is lost to a failed write.

#include <string>
#include <vector>

namespace oomtune {

/// Writes `contents` to `path` atomically: into "path.tmp.<pid>" in the same
/// directory (created with O_EXCL), flushed and fsync'ed, then rename(2)d
/// over `path`. A symbolic link is followed: its target is replaced, the
/// link kept. A path that is neither a regular file nor missing (a device
/// such as /dev/null, a FIFO, a terminal) is written in place, not
/// atomically: a rename would replace the node. Creates no directories.
/// Throws OutputError naming the path and the OS reason; on failure the old
/// file (if any) is untouched and the temporary is removed.
void write_file_atomically(const std::string& path, const std::string& contents);

/// Checks, before any work, that write_file_atomically(path) could write an
/// output file `flag` names (e.g. "--svg"): `path` is not a folder, its
/// folder exists and is writable. Throws OutputError naming the flag and the
/// path otherwise; InputError when `path` is one of `inputs` (the same file
/// by any name), which the output would replace.
void require_writable_output(const std::string& flag, const std::string& path,
                             const std::vector<std::string>& inputs = {});

}  // namespace oomtune
