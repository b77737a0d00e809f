#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"

namespace oomtune {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw OutputError(fmt::format("{}: cannot {}: {}", path, what, std::strerror(err)));
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& contents) {
  const std::string temporary = fmt::format("{}.tmp.{}", path, ::getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "create a temporary file", errno);
  const char* data = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    ssize_t written = ::write(fd, data, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      fail(path, "write", err);
    }
    data += written;
    left -= static_cast<std::size_t>(written);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(temporary.c_str());
    fail(path, "flush", err);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(temporary.c_str());
    fail(path, "rename into place", err);
  }
}

}  // namespace oomtune
