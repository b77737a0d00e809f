#pragma once
// Reading a whole input file (a job spec, a plan) with one clear error.

#include <string>

namespace oomtune {

/// The bytes of the file at `path`. `what` names the kind of file in the
/// error ("job spec", "plan file"). Throws InputError, one line naming the
/// path: "PATH: is a folder, not a WHAT", "PATH: cannot open the WHAT: REASON"
/// (the OS reason, e.g. "No such file or directory"), "PATH: cannot read
/// the WHAT: REASON" when reading fails part-way, or "PATH: is KIND, not a
/// WHAT; INSTEAD" when the file is binary: it starts like a known binary
/// format or holds a NUL byte, which no text file has (TOML 1.0 forbids
/// control characters other than tab in every string and comment,
/// toml.io/en/v1.0.0). KIND names the format (common/file_magic.h: "a zip
/// archive (a TorchScript model or a torch.save file?)", "a Python pickle
/// (...)") or is "a binary file"; INSTEAD (`if_binary`) says what to pass,
/// and is left out when empty; binary is judged from the first 64 KiB, so
/// an endless device such as /dev/zero is refused at once. "PATH: is more
/// than 1024 MiB, too large for a WHAT" past 1 GiB.
std::string read_text_file(const std::string& path, const std::string& what, const std::string& if_binary = "");

}  // namespace oomtune
