// About the floor of a one-thread pickle reader: decode each opcode of a
// pickle and skip its argument, nothing more (no values, no stack, no memo).
// A tighter decode loop could go somewhat lower; no reader does less work.
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
#include <initializer_list>
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

/// What follows an opcode (CPython Lib/pickletools.py, protocols 0-5):
/// `fixed` bytes, or a little-endian length of `length` bytes and that many
/// bytes, or `lines` newline-ended lines (protocol 0's text arguments).
struct Arg {
  bool known = false;
  uint8_t fixed = 0;
  uint8_t length = 0;
  uint8_t lines = 0;
};

struct ArgTable {
  Arg of[256];
  ArgTable() {
    const auto set = [&](std::initializer_list<int> ops, Arg arg) {
      arg.known = true;
      for (int op : ops) of[op] = arg;
    };
    set({'(', '0', '1', '2',  '}',  ']',  ')',  'd',  'l',  't',  's',  'u',  'a',  'e',  'N',  'R',  'b',
         'o', 'Q', '.', 0x8f, 0x85, 0x86, 0x87, 0x90, 0x91, 0x88, 0x89, 0x94, 0x81, 0x92, 0x93, 0x97, 0x98},
        {});
    set({'K', 'h', 'q', 0x80, 0x82}, {false, 1});  // BININT1, BINGET, BINPUT, PROTO, EXT1
    set({'M', 0x83}, {false, 2});                  // BININT2, EXT2
    set({'J', 'j', 'r', 0x84}, {false, 4});        // BININT, LONG_BINGET, LONG_BINPUT, EXT4
    set({'G', 0x95}, {false, 8});                  // BINFLOAT, FRAME
    // LONG1, SHORT_BINSTRING, SHORT_BINBYTES, SHORT_BINUNICODE
    set({0x8a, 'U', 'C', 0x8c}, {false, 0, 1});
    set({0x8b, 'T', 'B', 'X'}, {false, 0, 4});  // LONG4, BINSTRING, BINBYTES, BINUNICODE
    set({0x8d, 0x8e, 0x96}, {false, 0, 8});     // BINUNICODE8, BINBYTES8, BYTEARRAY8
    set({'I', 'L', 'F', 'S', 'V', 'g', 'p', 'P'}, {false, 0, 0, 1});
    set({'c', 'i'}, {false, 0, 0, 2});  // GLOBAL, INST
  }
};

/// Walks to STOP; returns the opcode count, or -1 for an unknown opcode or
/// a cut file.
int64_t walk(Buffered& in) {
  static const ArgTable table;
  int64_t ops = 0;
  uint8_t op = 0;
  while (in.byte(&op)) {
    ++ops;
    const Arg& arg = table.of[op];
    if (!arg.known) return -1;
    if (op == '.') return ops;  // STOP
    uint64_t n = arg.fixed;
    if (arg.length != 0 && !in.le(arg.length, &n)) return -1;
    if (!in.skip(n)) return -1;
    for (int i = 0; i < arg.lines; ++i) {
      if (!in.line()) return -1;
    }
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
