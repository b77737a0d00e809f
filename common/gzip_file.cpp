#include "common/gzip_file.h"

#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>
#ifdef OOMTUNE_WITH_ZLIB
#include <zlib.h>
#endif

#include "common/error.h"

namespace oomtune {

#ifdef OOMTUNE_WITH_ZLIB
namespace {

/// zlib's error message for `file`, without the "PATH: " zlib puts first.
std::string zlib_error(gzFile file, const std::string& path, int* code) {
  std::string message = gzerror(file, code);
  if (message.rfind(path + ": ", 0) == 0) message.erase(0, path.size() + 2);
  return *code == Z_ERRNO ? std::strerror(errno) : message;
}

}  // namespace

std::string read_gzip_file(const std::string& path) {
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), &gzclose);
  if (!file) throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  gzbuffer(file.get(), 1 << 20);
  std::string out;
  constexpr unsigned kChunk = 16u << 20;
  for (;;) {
    const std::size_t at = out.size();
    out.resize(at + kChunk);
    const int n = gzread(file.get(), out.data() + at, kChunk);
    if (n < 0) {
      int code = 0;
      throw InputError(fmt::format("{}: gzip: {}", path, zlib_error(file.get(), path, &code)));
    }
    out.resize(at + static_cast<std::size_t>(n));
    if (n == 0) break;
  }
  int code = 0;
  const std::string message = zlib_error(file.get(), path, &code);  // a truncated member shows here
  if (code != Z_OK) throw InputError(fmt::format("{}: gzip: {} (truncated or corrupt file)", path, message));
  return out;
}
#else
std::string read_gzip_file(const std::string& path) {
  throw InputError(
      fmt::format("{}: gzip-compressed, and this oomtune was built without zlib: decompress it first "
                  "(gunzip -k {})",
                  path, path));
}
#endif

}  // namespace oomtune
