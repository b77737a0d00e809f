// remove_tree removes what `rm -rf` would, in a process linked to libtorch.
//
// It lives in test_trial, which links libtorch, because that is where
// std::filesystem::remove_all crashed: on the GPU machine (PyTorch 2.11 wheel,
// a toolchain linking libstdc++ statically) test_trial's call bound to the
// copy libtorch.so exports (pytorch/pytorch#133437), which called a null
// function (common/remove_tree.h). The expectations are what rm -rf does.

#include "common/remove_tree.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace oomtune {
namespace {

namespace fs = std::filesystem;

fs::path fresh_folder(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("oomtune_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

TEST(RemoveTree, RemovesAFolderWithItsFilesFoldersAndLinksButNotWhatTheLinksName) {
  const fs::path outside = fresh_folder("remove_tree_outside");
  std::ofstream(outside / "kept") << "kept";
  const fs::path dir = fresh_folder("remove_tree");
  fs::create_directories(dir / "a" / "b");
  std::ofstream(dir / "a" / "b" / "file") << "x";
  std::ofstream(dir / "top") << "y";
  fs::create_symlink(outside / "kept", dir / "a" / "file_link");
  fs::create_directory_symlink(outside, dir / "folder_link");

  // dir, a, b, file, top, file_link, folder_link.
  EXPECT_EQ(remove_tree(dir.string()), 7u);
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir)));
  EXPECT_TRUE(fs::exists(outside / "kept")) << "a link was followed";

  EXPECT_EQ(remove_tree(outside.string()), 2u);
}

TEST(RemoveTree, ALoneFileIsOneEntryAndAMissingPathNone) {
  const fs::path dir = fresh_folder("remove_tree_file");
  std::ofstream(dir / "file") << "x";
  EXPECT_EQ(remove_tree((dir / "file").string()), 1u);
  EXPECT_EQ(remove_tree((dir / "file").string()), 0u);
  EXPECT_EQ(remove_tree((dir / "no" / "such").string()), 0u);
  EXPECT_EQ(remove_tree(dir.string()), 1u);
}

}  // namespace
}  // namespace oomtune
