#include "common/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

namespace oomtune {

std::optional<int64_t> parse_cgroup_memory_limit(const std::string& text) {
  std::size_t end = text.size();
  while (end > 0 && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  if (end == 0 || end > 19) return std::nullopt;  // empty, or more digits than an int64 holds
  int64_t bytes = 0;
  for (std::size_t i = 0; i < end; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return std::nullopt;  // "max", or not a count
    const int64_t digit = text[i] - '0';
    if (bytes > (INT64_MAX - digit) / 10) return std::nullopt;
    bytes = bytes * 10 + digit;
  }
  return bytes;
}

std::optional<int64_t> machine_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return std::nullopt;
  int64_t bytes = static_cast<int64_t>(pages) * static_cast<int64_t>(page_size);
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream file(path);
    if (!file) continue;
    std::ostringstream text;
    text << file.rdbuf();
    if (const std::optional<int64_t> limit = parse_cgroup_memory_limit(text.str()); limit && *limit > 0)
      bytes = std::min(bytes, *limit);
  }
  return bytes;
}

}  // namespace oomtune
