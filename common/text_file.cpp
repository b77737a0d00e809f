#include "common/text_file.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/file_magic.h"

namespace oomtune {
namespace {

constexpr std::size_t kMaxTextFileBytes = std::size_t{1} << 30;  // 1 GiB

}  // namespace

std::string read_text_file(const std::string& path, const std::string& what, const std::string& if_binary) {
  // An ifstream opens a folder without complaint on Linux and reads it as
  // empty, which would surface later as "missing required key".
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored))
    throw InputError(fmt::format("{}: is a folder, not a {}", path, what));
  errno = 0;
  std::ifstream file(path, std::ios::binary);
  if (!file) throw InputError(fmt::format("{}: cannot open the {}: {}", path, what, std::strerror(errno)));
  // In chunks, judged from the first: a binary file (or an endless device
  // such as /dev/zero) is refused before it is read whole.
  const auto refuse_binary = [&](const std::string& kind) {
    throw InputError(fmt::format("{}: is {}, not a {}{}{}", path, kind.empty() ? "a binary file" : kind, what,
                                 if_binary.empty() ? "" : "; ", if_binary));
  };
  std::string text;
  char chunk[1 << 16];
  bool judged = false;
  while (file.read(chunk, sizeof chunk) || file.gcount() > 0) {
    text.append(chunk, static_cast<std::size_t>(file.gcount()));
    if (!judged) {
      judged = true;
      if (const std::string kind = binary_format(text); !kind.empty() || text.find('\0') != std::string::npos)
        refuse_binary(kind);
    }
    if (text.size() > kMaxTextFileBytes)
      throw InputError(fmt::format("{}: is more than {} MiB, too large for a {}", path, kMaxTextFileBytes >> 20, what));
  }
  if (file.bad()) throw InputError(fmt::format("{}: cannot read the {}: {}", path, what, std::strerror(errno)));
  if (text.find('\0') != std::string::npos) refuse_binary("");
  return text;
}

}  // namespace oomtune
