#include "common/remove_tree.h"

#include <ftw.h>
#include <stdio.h>

namespace oomtune {
namespace {

// nftw(3) passes no user pointer to its callback.
thread_local std::uintmax_t removed_entries = 0;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (::remove(path) == 0) ++removed_entries;
  return 0;  // go on: remove what can be removed
}

}  // namespace

std::uintmax_t remove_tree(const std::string& path) noexcept {
  removed_entries = 0;
  // FTW_DEPTH: a folder after its contents; FTW_PHYS: links are not followed.
  // 16 open folder descriptors at most: deeper trees are walked all the same.
  ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return removed_entries;
}

}  // namespace oomtune
