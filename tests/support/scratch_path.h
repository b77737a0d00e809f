#pragma once
// Files a test writes live in a folder of its own process. ctest runs the
// tests in parallel, each in a process of its own, and a fixed name under
// the temp folder is shared by every one of them: two tests writing
// /tmp/oomtune-step-events-16.json at once read or deleted each other's
// file (CI, stop 56, StepEvents.ThePersistentAllocationsAreTheStaticSplit:
// "cannot open the step-events file").

#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/remove_tree.h"

namespace oomtune::testing {

/// `<temp folder>/oomtune-tests-<pid>/<name>`: a path no other process
/// uses. The folder is made on first use and removed, with all it holds,
/// when this process exits.
inline std::filesystem::path scratch_path(const std::string& name) {
  struct Folder {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("oomtune-tests-" + std::to_string(::getpid()));
    Folder() { std::filesystem::create_directories(path); }
    // Not std::filesystem::remove_all: PyTorch's wheels export their own
    // copy, which crashed this at exit (common/remove_tree.h).
    ~Folder() { remove_tree(path.string()); }
  };
  static const Folder folder;
  return folder.path / name;
}

/// scratch_path(name), made as a folder.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const std::filesystem::path dir = scratch_path(name);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace oomtune::testing
