#include "common/text_file.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/file_magic.h"

namespace oomtune {

std::string read_text_file(const std::string& path, const std::string& what, const std::string& if_binary) {
  // An ifstream opens a folder without complaint on Linux and reads it as
  // empty, which would surface later as "missing required key".
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored))
    throw InputError(fmt::format("{}: is a folder, not a {}", path, what));
  errno = 0;
  std::ifstream file(path, std::ios::binary);
  if (!file) throw InputError(fmt::format("{}: cannot open the {}: {}", path, what, std::strerror(errno)));
  std::stringstream buffer;
  buffer << file.rdbuf();
  if (file.bad()) throw InputError(fmt::format("{}: cannot read the {}: {}", path, what, std::strerror(errno)));
  std::string text = buffer.str();
  if (const std::string kind = binary_format(text); !kind.empty() || text.find('\0') != std::string::npos) {
    throw InputError(fmt::format("{}: is {}, not a {}{}{}", path, kind.empty() ? "a binary file" : kind, what,
                                 if_binary.empty() ? "" : "; ", if_binary));
  }
  return text;
}

}  // namespace oomtune
