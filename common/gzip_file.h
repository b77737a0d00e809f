#pragma once
// Reading a gzip-compressed input file whole (zlib): memory snapshots are
// often shared compressed (a 1 GB snapshot pickle gzips to a few hundred MB).

#include <string>

namespace oomtune {

/// The decompressed content of the gzip file at `path` (all members, RFC
/// 1952), in memory. Throws InputError naming the file when it cannot be
/// opened, is corrupt or is truncated ("unexpected end of file"), or when
/// oomtune was built without zlib (then saying how to decompress it).
std::string read_gzip_file(const std::string& path);

}  // namespace oomtune
