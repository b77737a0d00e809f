#include "common/atomic_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "common/error.h"
#include "support/scratch_path.h"

namespace oomtune {
namespace {

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(AtomicFile, ReplacesContentsAndLeavesNoTemporary) {
  const auto dir = testing::scratch_path("atomic");
  std::filesystem::create_directories(dir);
  const auto path = dir / "out.json";
  write_file_atomically(path.string(), "first");
  write_file_atomically(path.string(), "second");
  EXPECT_EQ(read(path), "second");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator{}), 1);
}

TEST(AtomicFile, FailureNamesThePathAndKeepsNothing) {
  try {
    write_file_atomically("/nonexistent-dir/x.json", "data");
    FAIL();
  } catch (const OutputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace oomtune
