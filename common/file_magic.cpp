#include "common/file_magic.h"

namespace oomtune {

bool is_gzip(std::string_view head) { return head.size() >= 2 && head[0] == '\x1f' && head[1] == '\x8b'; }

bool starts_like_zip(std::string_view head) { return head.rfind("PK\x03\x04", 0) == 0; }

std::string binary_format(std::string_view head) {
  if (starts_like_zip(head)) return "a zip archive (a TorchScript model or a torch.save file?)";
  if (is_gzip(head)) return "gzip-compressed";
  if (head.rfind("SQLite format 3", 0) == 0) return "a SQLite database";
  if (head.size() >= 2 && head[0] == '\x80' && head[1] >= 2 && head[1] <= 5)
    return "a Python pickle (a memory snapshot or a torch.save file?)";
  return "";
}

}  // namespace oomtune
