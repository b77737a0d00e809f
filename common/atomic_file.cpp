#include "common/atomic_file.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include <fmt/format.h>

#include "common/error.h"

namespace oomtune {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw OutputError(fmt::format("{}: cannot {}: {}", path, what, std::strerror(err)));
}

/// Writes all of `contents` to `fd`; returns 0 or the errno of the failure.
int write_all(int fd, const std::string& contents) {
  const char* data = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    const ssize_t written = ::write(fd, data, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += written;
    left -= static_cast<std::size_t>(written);
  }
  return 0;
}

/// The file a path names once its symbolic links are followed ("" when the
/// path or its target does not exist yet: then the path itself is written).
std::string resolved(const std::string& path) {
  std::unique_ptr<char, decltype(&std::free)> real(::realpath(path.c_str(), nullptr), &std::free);
  return real ? std::string(real.get()) : std::string();
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& contents) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    // A device, a FIFO or a terminal (/dev/null, /dev/stdout): written in
    // place; renaming over it would replace the node with a regular file.
    if (S_ISDIR(st.st_mode)) fail(path, "write", EISDIR);
    const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) fail(path, "open", errno);
    const int err = write_all(fd, contents);
    if (::close(fd) != 0 && err == 0) fail(path, "write", errno);
    if (err != 0) fail(path, "write", err);
    return;
  }
  // A symbolic link keeps pointing where it did: its target is replaced.
  const std::string real = resolved(path);
  const std::string& target = real.empty() ? path : real;
  // O_EXCL: never write through a link or file planted under the temporary's name.
  const std::string temporary = fmt::format("{}.tmp.{}", target, ::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "create a temporary file", errno);
  if (const int err = write_all(fd, contents); err != 0) {
    ::close(fd);
    ::unlink(temporary.c_str());
    fail(path, "write", err);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(temporary.c_str());
    fail(path, "flush", err);
  }
  if (::rename(temporary.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(temporary.c_str());
    fail(path, "rename into place", err);
  }
}

void require_writable_output(const std::string& flag, const std::string& path, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code error;
  for (const std::string& input : inputs) {
    if (!input.empty() && fs::equivalent(path, input, error))
      throw InputError(
          fmt::format("{} {}: is the input {}, which it would replace; write to another file", flag, path, input));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw OutputError(fmt::format("{} {}: is a folder", flag, path));
    if (!S_ISREG(st.st_mode)) return;  // a device or a FIFO, written in place
  }
  const std::string real = resolved(path);
  fs::path folder = fs::path(real.empty() ? path : real).parent_path();
  if (folder.empty()) folder = ".";
  if (!fs::is_directory(folder, error))
    throw OutputError(fmt::format("{} {}: cannot write it: {} is not a folder", flag, path, folder.string()));
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    throw OutputError(fmt::format("{} {}: cannot write it: {}", flag, path, std::strerror(errno)));
}

}  // namespace oomtune
