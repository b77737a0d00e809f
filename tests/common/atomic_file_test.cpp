#include "common/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

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
  const auto dir = testing::scratch_dir("atomic");
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

// A symbolic link stays a link: the file it points to gets the contents.
TEST(AtomicFile, FollowsASymbolicLink) {
  const auto dir = testing::scratch_dir("atomic_link");
  const auto target = dir / "target.svg";
  const auto link = dir / "link.svg";
  write_file_atomically(target.string(), "old");
  std::filesystem::create_symlink(target, link);
  write_file_atomically(link.string(), "new");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(read(target), "new");
}

// A FIFO (like a device or /dev/stdout) is written in place, not replaced
// by a regular file.
TEST(AtomicFile, WritesAFifoInPlace) {
  const auto dir = testing::scratch_dir("atomic_fifo");
  const auto fifo = dir / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string received;
  std::thread reader([&] { received = read(fifo); });
  write_file_atomically(fifo.string(), "through the pipe");
  reader.join();
  EXPECT_EQ(received, "through the pipe");
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

// Something planted under the temporary's name is never written through.
TEST(AtomicFile, ATemporaryThatExistsIsNotWrittenThrough) {
  const auto dir = testing::scratch_dir("atomic_planted");
  const auto path = dir / "out.json";
  const auto victim = dir / "victim";
  write_file_atomically(victim.string(), "keep");
  std::filesystem::create_symlink(victim, dir / ("out.json.tmp." + std::to_string(::getpid())));
  EXPECT_THROW(write_file_atomically(path.string(), "data"), OutputError);
  EXPECT_EQ(read(victim), "keep");
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace oomtune
