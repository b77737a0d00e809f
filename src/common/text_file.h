#pragma once
// Reading a whole input file (a job spec, a plan) with one clear error.

#include <string>

namespace oomtune {

/// The bytes of the file at `path`. `what` names the kind of file in the
/// error ("job spec", "plan file"). Throws InputError, one line naming the
/// path: "PATH: is a folder, not a WHAT", "PATH: cannot open the WHAT: REASON"
/// (the OS reason, e.g. "No such file or directory"), or "PATH: cannot read
/// the WHAT: REASON" when reading fails part-way.
std::string read_text_file(const std::string& path, const std::string& what);

}  // namespace oomtune
