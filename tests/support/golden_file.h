#pragma once
// Golden files: a test's whole output compared with a file reviewed by hand.
// With OOMTUNE_UPDATE_GOLDEN=1 the test writes the file instead (review
// every changed line against what it should say before committing it).

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "common/atomic_file.h"

namespace oomtune::testing {

/// True when the tests should rewrite their golden files (OOMTUNE_UPDATE_GOLDEN=1).
inline bool updating_golden() {
  const char* value = std::getenv("OOMTUNE_UPDATE_GOLDEN");
  return value != nullptr && std::string(value) == "1";
}

/// The text of the file at `path` ("" when it cannot be read).
inline std::string read_golden(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

/// Expects `actual` to equal the golden file at `path` (failing when it is
/// missing), or writes it there when updating_golden().
inline void expect_golden_file(const std::filesystem::path& path, const std::string& actual) {
  if (updating_golden()) {
    std::filesystem::create_directories(path.parent_path());
    write_file_atomically(path.string(), actual);
    return;
  }
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing; run with OOMTUNE_UPDATE_GOLDEN=1";
  EXPECT_EQ(actual, read_golden(path)) << "differs from " << path;
}

}  // namespace oomtune::testing
