// The floor of any one-thread pickle reader: decode each opcode of a pickle
// and skip its argument, nothing more (no values, no stack, no memo).
//
// bench/diagnose/run.sh times it on the same file as oomtune diagnose, so
// that oomtune's time reads against the least a sequential read of that
// file can cost on this machine, beside Python's. The file is read through
// a 1 MiB buffer, as diagnose/pickle_reader.cpp reads it.
//
// Argument layouts: CPython Lib/pickletools.py (protocols 0-5). Prints
// "SECONDS OPCODES"; exits 1 on an unknown opcode or a cut file.
//
// Usage: opcode_walk FILE
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

class Buffered {
 public:
  explicit Buffered(std::FILE* f) : f_(f), buf_(size_t{1} << 20) {}

  /// The next byte; false at the end of the file.
  bool byte(uint8_t* out) {
    if (pos_ == end_ && !refill()) return false;
    *out = buf_[pos_++];
    return true;
  }

  /// Reads n bytes little-endian (n <= 8); false when the file ends first.
  bool le(size_t n, uint64_t* out) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      uint8_t b = 0;
      if (!byte(&b)) return false;
      v |= uint64_t{b} << (8 * i);
    }
    *out = v;
    return true;
  }

  /// Skips n bytes; false when the file ends first.
  bool skip(uint64_t n) {
    while (n > 0) {
      if (pos_ == end_ && !refill()) return false;
      const uint64_t step = std::min<uint64_t>(n, end_ - pos_);
      pos_ += step;
      n -= step;
    }
    return true;
  }

  /// Skips through the next newline (protocol 0's text arguments).
  bool line() {
    while (true) {
      if (pos_ == end_ && !refill()) return false;
      const void* nl = std::memchr(buf_.data() + pos_, '\n', end_ - pos_);
      if (nl != nullptr) {
        pos_ = static_cast<const uint8_t*>(nl) - buf_.data() + 1;
        return true;
      }
      pos_ = end_;
    }
  }

 private:
  bool refill() {
    end_ = std::fread(buf_.data(), 1, buf_.size(), f_);
    pos_ = 0;
    return end_ > 0;
  }

  std::FILE* f_;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;
  size_t end_ = 0;
};

/// What follows an opcode (CPython Lib/pickletools.py, protocols 0-5).
enum class Arg : uint8_t { kUnknown, kNone, kFixed1, kFixed2, kFixed4, kFixed8, kLen1, kLen4, kLen8, kLine, kTwoLines };

struct ArgTable {
  Arg of[256] = {};  // kUnknown
  ArgTable() {
    const auto set = [&](const char* ops, Arg arg) {
      for (const char* c = ops; *c != 0; ++c) of[static_cast<uint8_t>(*c)] = arg;
    };
    set("(012}])dltsuaeNRboQ.", Arg::kNone);
    for (int op : {0x8f, 0x85, 0x86, 0x87, 0x90, 0x91, 0x88, 0x89, 0x94, 0x81, 0x92, 0x93, 0x97, 0x98})
      of[op] = Arg::kNone;
    set("Khq", Arg::kFixed1);            // BININT1, BINGET, BINPUT
    of[0x80] = of[0x82] = Arg::kFixed1;  // PROTO, EXT1
    set("M", Arg::kFixed2);
    of[0x83] = Arg::kFixed2;  // EXT2
    set("Jjr", Arg::kFixed4);
    of[0x84] = Arg::kFixed4;  // EXT4
    set("G", Arg::kFixed8);
    of[0x95] = Arg::kFixed8;                      // FRAME
    set("UC", Arg::kLen1);                        // SHORT_BINSTRING, SHORT_BINBYTES
    of[0x8a] = of[0x8c] = Arg::kLen1;             // LONG1, SHORT_BINUNICODE
    set("TBX", Arg::kLen4);                       // BINSTRING, BINBYTES, BINUNICODE
    of[0x8b] = Arg::kLen4;                        // LONG4
    of[0x8d] = of[0x8e] = of[0x96] = Arg::kLen8;  // BINUNICODE8, BINBYTES8, BYTEARRAY8
    set("ILFSVgpP", Arg::kLine);                  // protocol 0's text arguments
    set("ci", Arg::kTwoLines);                    // GLOBAL, INST
  }
};

/// Walks to STOP; returns the opcode count, or -1 for an unknown opcode or
/// a cut file.
int64_t walk(Buffered& in) {
  static const ArgTable table;
  int64_t ops = 0;
  uint8_t op = 0;
  uint64_t n = 0;
  while (in.byte(&op)) {
    ++ops;
    bool ok = true;
    switch (table.of[op]) {
      case Arg::kUnknown:
        return -1;
      case Arg::kNone:
        if (op == '.') return ops;  // STOP
        break;
      case Arg::kFixed1:
        ok = in.skip(1);
        break;
      case Arg::kFixed2:
        ok = in.skip(2);
        break;
      case Arg::kFixed4:
        ok = in.skip(4);
        break;
      case Arg::kFixed8:
        ok = in.skip(8);
        break;
      case Arg::kLen1:
        ok = in.le(1, &n) && in.skip(n);
        break;
      case Arg::kLen4:
        ok = in.le(4, &n) && in.skip(n);
        break;
      case Arg::kLen8:
        ok = in.le(8, &n) && in.skip(n);
        break;
      case Arg::kLine:
        ok = in.line();
        break;
      case Arg::kTwoLines:
        ok = in.line() && in.line();
        break;
    }
    if (!ok) return -1;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: opcode_walk FILE\n");
    return 2;
  }
  std::FILE* f = std::fopen(argv[1], "rb");
  if (f == nullptr) {
    std::perror(argv[1]);
    return 1;
  }
  Buffered in(f);
  const auto start = std::chrono::steady_clock::now();
  const int64_t ops = walk(in);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fclose(f);
  if (ops < 0) {
    std::fprintf(stderr, "%s: an unknown opcode or a cut file\n", argv[1]);
    return 1;
  }
  std::printf("%.3f %lld\n", seconds, static_cast<long long>(ops));
  return 0;
}
