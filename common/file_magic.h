#pragma once
// Binary formats users hand to a command that reads something else (a model
// where a job spec belongs, a snapshot where a plan belongs), told apart by
// their first bytes, so that errors name what the file is.

#include <string>
#include <string_view>

namespace oomtune {

/// True when `head` (a file's first bytes) starts with the gzip magic 1f 8b
/// (RFC 1952, section 2.3.1).
bool is_gzip(std::string_view head);

/// True when `head` starts with a zip local-file header "PK\3\4" (PKWARE
/// APPNOTE.TXT, 4.3.7), as every TorchScript archive and every torch.save
/// file since PyTorch 1.6 does.
bool starts_like_zip(std::string_view head);

/// The binary format `head` starts with, as a phrase completing "PATH is
/// ...": "a zip archive (a TorchScript model or a torch.save file?)",
/// "gzip-compressed", "a SQLite database" (magic "SQLite format 3",
/// sqlite.org/fileformat.html), "a Python pickle (a memory snapshot or a
/// torch.save file?)" (PROTO 0x80 then protocol 2-5, Python's
/// Lib/pickle.py; torch.cuda.memory._dump_snapshot writes one). "" for
/// anything else.
std::string binary_format(std::string_view head);

}  // namespace oomtune
