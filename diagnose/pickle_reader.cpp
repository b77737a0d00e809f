#include "diagnose/pickle_reader.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"

namespace oomtune::diagnose {
namespace {

// ---------------------------------------------------------------- input

/// A file's bytes in chunks, read ahead of the parser on a thread of its
/// own: copying a snapshot from the page cache was a tenth of `diagnose`'s
/// time on one core (bench/diagnose). At most kChunksAhead chunks wait; a
/// chunk stays valid until the next one is taken. Where no thread can
/// start, the chunks are read on the caller's thread when taken. A short
/// read ends the file, as fread's end of file or error did before.
class ReadAhead {
 public:
  static constexpr size_t kChunkSize = size_t{1} << 20;
  static constexpr size_t kChunksAhead = 3;

  explicit ReadAhead(std::FILE* file) : file_(file) {
    for (size_t i = 0; i <= kChunksAhead; ++i) {
      buffers_.emplace_back(new char[kChunkSize]);
      free_.push_back(i);
    }
    try {
      thread_ = std::thread([this] { read_ahead(); });
    } catch (const std::system_error&) {
      // No thread: next() reads each chunk itself.
    }
  }
  ~ReadAhead() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  /// The next chunk (empty at the end of the file); the one taken before
  /// it goes back to be filled again.
  std::string_view next() {
    if (!thread_.joinable()) {
      if (done_) return {};
      const size_t n = std::fread(buffers_[0].get(), 1, kChunkSize, file_);
      done_ = n < kChunkSize;
      return {buffers_[0].get(), n};
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (in_use_ < buffers_.size()) {
      free_.push_back(in_use_);
      in_use_ = buffers_.size();
      changed_.notify_all();
    }
    changed_.wait(lock, [&] { return !filled_.empty() || done_; });
    if (filled_.empty()) return {};
    const auto [index, bytes] = filled_.front();
    filled_.pop_front();
    in_use_ = index;
    return {buffers_[index].get(), bytes};
  }

 private:
  void read_ahead() {
    for (;;) {
      size_t index = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return !free_.empty() || stop_; });
        if (stop_) return;
        index = free_.back();
        free_.pop_back();
      }
      const size_t n = std::fread(buffers_[index].get(), 1, kChunkSize, file_);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (n > 0) filled_.emplace_back(index, n);
        done_ = n < kChunkSize;
      }
      changed_.notify_all();
      if (n < kChunkSize) return;
    }
  }

  std::FILE* file_;
  std::vector<std::unique_ptr<char[]>> buffers_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<size_t> free_;                            // buffers to fill
  std::deque<std::pair<size_t, size_t>> filled_;        // (buffer, bytes), in file order
  size_t in_use_ = std::numeric_limits<size_t>::max();  // the parser's buffer; none at first
  bool done_ = false;                                   // the last chunk was read
  bool stop_ = false;
  std::thread thread_;
};

/// Bytes of a file (read ahead, ReadAhead) or of memory, with the offset of
/// every read known for error messages.
class Input {
 public:
  Input(std::string_view bytes) : data_(bytes.data()), end_(bytes.size()), total_(bytes.size()) {}
  Input(std::FILE* file, int64_t total) : file_(std::make_unique<ReadAhead>(file)), total_(total) {}

  int64_t offset() const { return base_ + static_cast<int64_t>(pos_); }
  int64_t remaining() const { return total_ - offset(); }

  /// Little-endian unsigned of n <= 8 bytes, or throws Truncated.
  uint64_t read_le(size_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (end_ - pos_ >= 8) {  // fast path: one 8-byte load, the n low bytes kept
      uint64_t word = 0;
      std::memcpy(&word, data_ + pos_, 8);
      pos_ += n;
      return n >= 8 ? word : word & ((uint64_t{1} << (8 * n)) - 1);
    }
#endif
    return read_le_slow(n);
  }

  /// One byte; false at the end of the input.
  bool next(uint8_t* byte) {
    if (pos_ == end_ && !refill()) return false;
    *byte = static_cast<uint8_t>(data_[pos_++]);
    return true;
  }

  /// The buffered bytes not read yet (never refills), to read in place;
  /// advance(n) then consumes n of them.
  const uint8_t* window(size_t* available) const {
    *available = end_ - pos_;
    return reinterpret_cast<const uint8_t*>(data_ + pos_);
  }
  void advance(size_t n) { pos_ += n; }

  /// Exactly n bytes into dst, or throws Truncated.
  void read(char* dst, size_t n) {
    if (end_ - pos_ >= n) {  // fast path: all in the buffer
      std::memcpy(dst, data_ + pos_, n);
      pos_ += n;
      return;
    }
    while (n > 0) {
      if (pos_ == end_ && !refill()) throw Truncated{n};
      const size_t take = std::min(n, end_ - pos_);
      std::memcpy(dst, data_ + pos_, take);
      pos_ += take;
      dst += take;
      n -= take;
    }
  }

  /// Skips n bytes (throws Truncated).
  void skip(size_t n) {
    char scratch[256];
    while (n > 0) {
      const size_t take = std::min(n, sizeof scratch);
      read(scratch, take);
      n -= take;
    }
  }

  /// A text line without its '\n' (protocol 0 arguments), at most `limit`
  /// bytes; throws Truncated at the end, LineTooLong past the limit.
  std::string line(size_t limit) {
    std::string out;
    uint8_t c = 0;
    while (true) {
      if (!next(&c)) throw Truncated{1};
      if (c == '\n') return out;
      if (out.size() >= limit) throw LineTooLong{};
      out.push_back(static_cast<char>(c));
    }
  }

  struct Truncated {
    size_t missing;
  };
  struct LineTooLong {};

 private:
  /// read_le byte by byte (near the end of the buffer, or big-endian hosts).
  uint64_t read_le_slow(size_t n) {
    unsigned char b[8] = {};
    if (end_ - pos_ >= n) {
      std::memcpy(b, data_ + pos_, n);
      pos_ += n;
    } else {
      read(reinterpret_cast<char*>(b), n);
    }
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | b[i];
    return v;
  }

  bool refill() {
    if (file_ == nullptr) return false;
    base_ += static_cast<int64_t>(end_);
    pos_ = 0;
    const std::string_view chunk = file_->next();
    data_ = chunk.data();
    end_ = chunk.size();
    return end_ > 0;
  }

  std::unique_ptr<ReadAhead> file_;  // nullptr: the bytes are in memory
  const char* data_ = nullptr;
  size_t pos_ = 0;
  size_t end_ = 0;
  int64_t base_ = 0;  // offset of data_[0] in the input
  int64_t total_ = 0;
};

// ---------------------------------------------------------------- opcodes

// Names and values from CPython Lib/pickletools.py.
struct OpName {
  uint8_t code;
  const char* name;
};
constexpr OpName kOpNames[] = {
    {'(', "MARK"},
    {'.', "STOP"},
    {'0', "POP"},
    {'1', "POP_MARK"},
    {'2', "DUP"},
    {'F', "FLOAT"},
    {'I', "INT"},
    {'J', "BININT"},
    {'K', "BININT1"},
    {'L', "LONG"},
    {'M', "BININT2"},
    {'N', "NONE"},
    {'P', "PERSID"},
    {'Q', "BINPERSID"},
    {'R', "REDUCE"},
    {'S', "STRING"},
    {'T', "BINSTRING"},
    {'U', "SHORT_BINSTRING"},
    {'V', "UNICODE"},
    {'X', "BINUNICODE"},
    {'a', "APPEND"},
    {'b', "BUILD"},
    {'c', "GLOBAL"},
    {'d', "DICT"},
    {'}', "EMPTY_DICT"},
    {'e', "APPENDS"},
    {'g', "GET"},
    {'h', "BINGET"},
    {'i', "INST"},
    {'j', "LONG_BINGET"},
    {'l', "LIST"},
    {']', "EMPTY_LIST"},
    {'o', "OBJ"},
    {'p', "PUT"},
    {'q', "BINPUT"},
    {'r', "LONG_BINPUT"},
    {'s', "SETITEM"},
    {'t', "TUPLE"},
    {')', "EMPTY_TUPLE"},
    {'u', "SETITEMS"},
    {'G', "BINFLOAT"},
    {0x80, "PROTO"},
    {0x81, "NEWOBJ"},
    {0x82, "EXT1"},
    {0x83, "EXT2"},
    {0x84, "EXT4"},
    {0x85, "TUPLE1"},
    {0x86, "TUPLE2"},
    {0x87, "TUPLE3"},
    {0x88, "NEWTRUE"},
    {0x89, "NEWFALSE"},
    {0x8a, "LONG1"},
    {0x8b, "LONG4"},
    {'B', "BINBYTES"},
    {'C', "SHORT_BINBYTES"},
    {0x8c, "SHORT_BINUNICODE"},
    {0x8d, "BINUNICODE8"},
    {0x8e, "BINBYTES8"},
    {0x8f, "EMPTY_SET"},
    {0x90, "ADDITEMS"},
    {0x91, "FROZENSET"},
    {0x92, "NEWOBJ_EX"},
    {0x93, "STACK_GLOBAL"},
    {0x94, "MEMOIZE"},
    {0x95, "FRAME"},
    {0x96, "BYTEARRAY8"},
    {0x97, "NEXT_BUFFER"},
    {0x98, "READONLY_BUFFER"},
};

const char* op_name(uint8_t code) {
  for (const auto& op : kOpNames) {
    if (op.code == code) return op.name;
  }
  return nullptr;
}

/// Printable form of a short untrusted text for messages.
std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 80)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\'') {
      out.push_back(c);
    } else {
      out += fmt::format("\\x{:02x}", u);
    }
  }
  if (text.size() > 80) out += "...";
  return out;
}

/// Marker stored in memo slots that were never PUT.
constexpr ValueRef kUnset = ValueRef::from_bits((7u << 3) | 0u);
/// Text argument lines (INT, GET, GLOBAL...) longer than this are refused.
constexpr size_t kMaxLine = 4096;
/// Open MARKs deeper than this are refused (each container needs at most one).
constexpr size_t kMaxMarks = 4 * kMaxPickleDepth;
/// Dense memo grows by at most this past its end; further indices go sparse.
constexpr uint64_t kDenseMemoSlack = uint64_t{1} << 20;

// ---------------------------------------------------------------- machine

class Machine {
 public:
  Machine(Input& in, std::string name, ItemSink* sink) : in_(in), name_(std::move(name)), sink_(sink) {}

  PickleDocument run() {
    try {
      return run_inner();
    } catch (const NotInStore& e) {  // only with a sink: a placeholder or taken list used as stored
      abandon(e.what());
    } catch (const Input::Truncated& t) {
      fail(fmt::format("truncated: the input ends at byte {} while {} needed {} more byte{}", in_.offset(),
                       current_name(), t.missing, t.missing == 1 ? "" : "s"));
    } catch (const Input::LineTooLong&) {
      fail(fmt::format("{} at byte {}: text argument longer than {} bytes", current_name(), op_offset_, kMaxLine));
    } catch (const std::length_error& e) {
      fail(fmt::format("at byte {}: {}", op_offset_, e.what()));
    } catch (const std::bad_alloc&) {
      fail(fmt::format("at byte {}: out of memory while reading", op_offset_));
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw SnapshotError(fmt::format("{}: pickle: {}", name_, what));
  }

  std::string current_name() const {
    const char* n = op_name(op_);
    return n ? std::string(n) : fmt::format("opcode 0x{:02x}", op_);
  }

  [[noreturn]] void refuse(const std::string& why) const {
    fail(
        fmt::format("opcode {} (0x{:02x}) at byte {} refused: {}; oomtune reads only plain data "
                    "(dicts, lists, strings, numbers) and never runs code from a pickle",
                    current_name(), op_, op_offset_, why));
  }

  uint64_t read_le(int n) { return in_.read_le(static_cast<size_t>(n)); }

  /// A length argument checked against what is left of the input.
  size_t checked_length(uint64_t length) {
    const int64_t left = in_.remaining();
    if (length > static_cast<uint64_t>(std::max<int64_t>(left, 0))) {
      fail(fmt::format("{} at byte {} declares a length of {} bytes but only {} byte{} remain", current_name(),
                       op_offset_, length, left, left == 1 ? "" : "s"));
    }
    return static_cast<size_t>(length);
  }

  void push(ValueRef v) { stack_.push_back(v); }

  ValueRef pop() {
    if (stack_.size() <= floor()) fail(fmt::format("{} at byte {}: stack underflow", current_name(), op_offset_));
    ValueRef v = stack_.back();
    stack_.pop_back();
    return v;
  }

  ValueRef& top() {
    if (stack_.size() <= floor()) fail(fmt::format("{} at byte {}: stack underflow", current_name(), op_offset_));
    return stack_.back();
  }

  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }

  /// Index of the first item above the last MARK; pops the mark.
  size_t pop_mark() {
    if (marks_.empty()) fail(fmt::format("{} at byte {}: no MARK to close", current_name(), op_offset_));
    size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }

  void check_depth(ValueRef container) {
    if (doc_.store.height(container) > kMaxPickleDepth) {
      fail(fmt::format("{} at byte {}: containers nested deeper than {} levels", current_name(), op_offset_,
                       kMaxPickleDepth));
    }
  }

  ValueRef make_tuple(size_t first) {
    ValueRef t = doc_.store.make_container(ValueKind::kTuple);
    doc_.store.append_children(t, stack_.data() + first, stack_.size() - first);
    stack_.resize(first);
    check_depth(t);
    return t;
  }

  // ---- streaming into the sink (ItemSink in pickle_reader.h)

  [[noreturn]] void abandon(const std::string& why) const {
    throw SinkAbandoned(fmt::format("{}: streaming stopped at byte {}: {}", name_, op_offset_, why));
  }

  /// EMPTY_LIST made `list` (not pushed yet): offers it to the sink when it
  /// is an item of the list under a key of the top-level dict being filled:
  /// stack = dict, MARK, key, value, ..., key, outer list[, MARK, items]
  /// (keys at odd positions, the outer list at an even one).
  void offer(ValueRef list) {
    const ValueStore& s = doc_.store;
    if (marks_.empty() || marks_.size() > 2 || marks_[0] != 1 || s.kind(stack_[0]) != ValueKind::kDict) return;
    const size_t outer = marks_.size() == 2 ? marks_[1] - 1 : stack_.size() - 1;
    if (outer < 2 || outer % 2 != 0 || s.kind(stack_[outer]) != ValueKind::kList ||
        s.kind(stack_[outer - 1]) != ValueKind::kString) {
      return;
    }
    if (!sink_->claim(s.as_text(stack_[outer - 1]), list)) return;
    if (claimed_ && appended_ != opened_) abandon("a claimed list still misses items when the next is claimed");
    first_id_ += opened_;
    opened_ = appended_ = 0;
    filling_ = kNone;
    item_height_ = 1;
    claimed_ = true;
    claimed_list_ = list;
  }

  /// True when EMPTY_DICT opens an item of the claimed list's APPENDS batch.
  bool opens_item() const {
    return claimed_ && !marks_.empty() && marks_.back() > 0 && stack_[marks_.back() - 1] == claimed_list_;
  }

  /// True inside the SETITEMS batch of the item being filled (the last
  /// MARK is right above its placeholder).
  bool in_item_batch() const {
    return filling_ != kNone && !marks_.empty() && marks_.back() > 0 &&
           stack_[marks_.back() - 1] == ValueStore::placeholder(first_id_ + filling_);
  }

  /// An int read from the input. In an item's batch it is transient: the
  /// sink reads it, the store need not keep it (fill_item forgets it).
  ValueRef make_int(int64_t value) {
    return in_item_batch() ? doc_.store.make_transient_int(value) : doc_.store.make_int(value);
  }

  /// APPENDS filled `list`, made in the batch of the item being filled
  /// (a trace event's frames list): when an earlier list has the same items,
  /// that one takes its place (ValueStore::share_list), so ten million
  /// frames lists cost no container each. Only when every ref to `list` is
  /// known: the stack top, and at most one memo entry.
  void share_fresh_list(ValueRef list) {
    fresh_list_ = ValueRef();
    if (fresh_item_ != filling_ || !in_item_batch() || fresh_memo_puts_ > 1) return;
    for (size_t i = marks_.back(); i + 1 < stack_.size(); ++i) {
      if (stack_[i] == list) return;  // a copy on the stack
    }
    ValueRef* memo = nullptr;
    if (fresh_memo_puts_ == 1) {
      if (fresh_memo_index_ < memo_.size()) {
        memo = &memo_[fresh_memo_index_];
      } else {
        auto it = sparse_memo_.find(fresh_memo_index_);
        if (it != sparse_memo_.end()) memo = &it->second;
      }
      if (memo == nullptr || *memo != list) return;
    }
    const ValueRef shared = doc_.store.share_list(list, fresh_children_);
    if (shared == list) return;
    stack_.back() = shared;
    if (memo != nullptr) *memo = shared;
  }

  void open_item() {
    if (first_id_ + opened_ >= ValueStore::kMaxEntries) abandon("too many items");
    sink_->open_item(in_.remaining());
    push(ValueStore::placeholder(first_id_ + opened_));
    filling_ = opened_++;
  }

  /// SETITEM(S) on a placeholder: its pairs go to the sink.
  void fill_item(uint32_t id, size_t first, bool pairs) {
    const size_t count = stack_.size() - first;
    if (count == 0 && pairs) return;  // an empty batch changes nothing
    if (!pairs || filling_ == kNone || id != first_id_ + filling_ || count % 2 != 0) {
      abandon("a streamed dict used otherwise than filled once");
    }
    int tallest = 0;
    uint32_t other = 0;
    for (size_t i = first; i < stack_.size(); ++i) {
      if (ValueStore::is_placeholder(stack_[i], &other)) abandon("a streamed dict inside a streamed dict");
      tallest = std::max(tallest, doc_.store.height(stack_[i]));
    }
    if (tallest + 1 > kMaxPickleDepth) abandon("nesting too deep");
    sink_->set_items(doc_.store, filling_, stack_.data() + first, count);
    doc_.store.clear_transients();  // the batch's ints are read; none is left on the stack
    filling_ = kNone;
    item_height_ = std::max(item_height_, tallest + 1);
    stack_.resize(first);
  }

  /// APPEND(S) of placeholders to the claimed list: they must be its items
  /// in the order opened, each once.
  void append_items(ValueRef container, size_t first) {
    const size_t count = stack_.size() - first;
    if (container != claimed_list_) abandon("a streamed dict added to another container");
    for (size_t i = 0; i < count; ++i) {
      uint32_t id = 0;
      if (!ValueStore::is_placeholder(stack_[first + i], &id) || id != first_id_ + appended_ + i) {
        abandon("the claimed list's items appended out of order");
      }
    }
    doc_.store.append_taken(container, count, item_height_);
    appended_ += static_cast<uint32_t>(count);
    stack_.resize(first);
    check_depth(container);
  }

  void append_to(ValueRef container, size_t first, bool pairs) {
    uint32_t id = 0;
    if (claimed_) {  // placeholders exist only then
      if (ValueStore::is_placeholder(container, &id)) return fill_item(id, first, pairs);
      if (!pairs && first < stack_.size() && ValueStore::is_placeholder(stack_[first], &id)) {
        return append_items(container, first);
      }
    }
    const ValueKind kind = doc_.store.kind(container);
    const size_t count = stack_.size() - first;
    if (pairs) {
      if (kind != ValueKind::kDict)
        fail(fmt::format("{} at byte {}: target is a {}, not a dict", current_name(), op_offset_, kind_name(kind)));
      if (count % 2 != 0)
        fail(fmt::format("{} at byte {}: odd number of items for a dict", current_name(), op_offset_));
    } else if (kind != ValueKind::kList) {
      fail(fmt::format("{} at byte {}: target is a {}, not a list", current_name(), op_offset_, kind_name(kind)));
    }
    doc_.store.append_children(container, stack_.data() + first, count);
    stack_.resize(first);
    check_depth(container);
    if (container == fresh_list_ && !pairs && !stack_.empty() && stack_.back() == container) {
      share_fresh_list(container);
    }
  }

  void memo_put(uint64_t index) {
    const ValueRef v = doc_.store.lasting(top());
    if (v == fresh_list_) {
      ++fresh_memo_puts_;
      fresh_memo_index_ = index;
    }
    if (index < memo_.size()) {
      if (memo_[index] == kUnset) ++memo_count_;
      memo_[index] = v;
    } else if (index == memo_.size()) {
      memo_.push_back(v);
      ++memo_count_;
    } else if (index < memo_.size() + kDenseMemoSlack) {
      while (memo_.size() < index) memo_.push_back(kUnset);
      memo_.push_back(v);
      ++memo_count_;
    } else {
      if (sparse_memo_.emplace(index, v).second)
        ++memo_count_;
      else
        sparse_memo_[index] = v;
    }
  }

  ValueRef memo_get(uint64_t index) {
    if (index < memo_.size() && memo_[index] != kUnset) return memo_[index];
    auto it = sparse_memo_.find(index);
    if (it != sparse_memo_.end()) return it->second;
    fail(fmt::format("{} at byte {} refers to memo entry {}, which was never stored", current_name(), op_offset_,
                     index));
  }

  /// BINGET / LONG_BINGET, then the ones right after it read in place from
  /// the buffer without going back through the dispatch: they are ~70 % of a
  /// snapshot's opcodes (dict keys, frames lists), mostly in runs. The loop
  /// stops at anything else: an opcode or argument not wholly buffered, or
  /// an index the dense memo does not hold (the dispatch then reads it, and
  /// says what is wrong).
  void get_run(uint8_t op) {
    push(memo_get(read_le(op == 'h' ? 1 : 4)));
    size_t available = 0;
    const uint8_t* p = in_.window(&available);
    const uint8_t* const end = p + available;
    const int64_t base = in_.offset();
    const uint8_t* at = p;
    while (end - at >= 2) {
      uint32_t index = at[1];
      size_t length = 2;
      if (at[0] == 'j' && end - at >= 5) {
        index = uint32_t{at[1]} | uint32_t{at[2]} << 8 | uint32_t{at[3]} << 16 | uint32_t{at[4]} << 24;
        length = 5;
      } else if (at[0] != 'h') {
        break;
      }
      if (index >= memo_.size() || memo_[index] == kUnset) break;
      op_offset_ = base + (at - p);
      op_ = at[0];
      push(memo_[index]);
      at += length;
    }
    in_.advance(static_cast<size_t>(at - p));
  }

  void read_text(ValueKind kind, uint64_t length) {
    const size_t n = checked_length(length);
    if (n <= kShortText) return push(short_text(kind, n));
    ValueRef ref;
    char* dst = doc_.store.append_text(kind, n, &ref);
    in_.read(dst, n);
    push(ref);
  }

  /// A string or bytes of at most kShortText bytes, stored once per text
  /// while a direct-mapped cache remembers it: PyTorch 2.11's _snapshot()
  /// gives every trace event a str of its own for compile_context ("N/A"
  /// unless _record_memory_history(compile_context=True)), which pickle
  /// writes out in full each time (SHORT_BINUNICODE + MEMOIZE), so a
  /// 10^7-event file held 10^7 copies of "N/A" (~20 bytes each). Values
  /// are immutable, so equal texts may share one ref.
  ValueRef short_text(ValueKind kind, size_t n) {
    char text[8] = {};  // one word: the key below reads all 8 bytes
    in_.read(text, n);
    uint64_t word = 0;
    std::memcpy(&word, text, sizeof word);
    const uint64_t key = word ^ (uint64_t{n} << 59) ^ (kind == ValueKind::kBytes ? uint64_t{1} << 58 : 0);
    // n <= 7 leaves the top byte of word zero, so (n, kind) in it keep keys apart.
    ShortText& slot = short_texts_[(key * 0x9E3779B97F4A7C15u) >> (64 - kShortTextBits)];
    if (slot.valid && slot.key == key) return slot.ref;
    ValueRef ref;
    std::memcpy(doc_.store.append_text(kind, n, &ref), text, n);
    slot = ShortText{key, ref, true};
    return ref;
  }

  /// LONG1 / LONG4 body: n bytes little-endian two's complement.
  void read_long(uint64_t n_raw) {
    const size_t n = checked_length(n_raw);
    if (n == 0) {
      push(make_int(0));
      return;
    }
    if (n <= 8) {
      uint64_t v = read_le(static_cast<int>(n));
      if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
      push(make_int(static_cast<int64_t>(v)));
      return;
    }
    // Longer: fits in 64 bits only if the high bytes are sign padding.
    uint64_t low = read_le(8);
    const uint8_t pad = (low >> 63) ? 0xff : 0x00;
    bool fits = true;
    for (size_t i = 8; i < n; ++i) {
      uint8_t b = 0;
      if (!in_.next(&b)) throw Input::Truncated{n - i};
      if (b != pad) fits = false;
    }
    push(fits ? make_int(static_cast<int64_t>(low)) : doc_.store.make_huge_int());
  }

  int64_t parse_decimal(const std::string& text) {
    std::string t = text;
    if (!t.empty() && t.back() == 'L') t.pop_back();  // LONG's suffix
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (t.empty() || end != t.c_str() + t.size() || errno == ERANGE) {
      if (errno == ERANGE) return INT64_MIN;  // caller maps to huge int
      fail(fmt::format("{} at byte {}: '{}' is not an integer", current_name(), op_offset_, printable(text)));
    }
    return v;
  }

  PickleDocument run_inner() {
    while (true) {
      op_offset_ = in_.offset();
      uint8_t op = 0;
      if (!in_.next(&op)) {
        op_ = 0;
        fail(fmt::format("truncated: the input ends at byte {} before STOP", in_.offset()));
      }
      op_ = op;
      switch (op) {
        case 0x80: {  // PROTO
          uint8_t version = 0;
          if (!in_.next(&version)) throw Input::Truncated{1};
          if (version > 5) fail(fmt::format("PROTO at byte {}: protocol {} is newer than 5", op_offset_, version));
          doc_.protocol = version;
          break;
        }
        case 0x95: {  // FRAME: a length hint only, but a frame past the end means a cut file
          const uint64_t length = read_le(8);
          const int64_t left = in_.remaining();
          if (length > static_cast<uint64_t>(std::max<int64_t>(left, 0))) {
            fail(fmt::format("truncated: FRAME at byte {} announces {} bytes but only {} remain", op_offset_, length,
                             left));
          }
          break;
        }
        case '.': {  // STOP
          doc_.root = doc_.store.lasting(pop());
          if (!marks_.empty()) fail(fmt::format("STOP at byte {} with an unclosed MARK", op_offset_));
          uint32_t id = 0;
          if (claimed_ && (appended_ != opened_ || ValueStore::is_placeholder(doc_.root, &id))) {
            abandon("a streamed dict was not appended to its list");
          }
          doc_.bytes_read = in_.offset();
          return std::move(doc_);
        }
        case '(':
          if (marks_.size() >= kMaxMarks) {
            fail(fmt::format("MARK at byte {}: more than {} open marks (nesting too deep)", op_offset_, kMaxMarks));
          }
          marks_.push_back(stack_.size());
          break;
        case '0':
          pop();
          break;
        case '1':
          stack_.resize(pop_mark());
          break;
        case '2':
          push(top());
          break;
        // ---- containers
        case '}':
          if (opens_item()) {
            open_item();
          } else {
            push(doc_.store.make_container(ValueKind::kDict));
          }
          break;
        case ']': {
          const ValueRef list = doc_.store.make_container(ValueKind::kList);
          if (sink_ != nullptr && marks_.size() <= 2) offer(list);
          if (in_item_batch()) {  // maybe a frames list: see share_fresh_list
            fresh_list_ = list;
            fresh_item_ = filling_;
            fresh_children_ = doc_.store.child_count();
            fresh_memo_puts_ = 0;
          }
          push(list);
          break;
        }
        case 0x8f:
          push(doc_.store.make_container(ValueKind::kList));
          break;  // EMPTY_SET
        case ')':
          push(doc_.store.make_container(ValueKind::kTuple));
          break;
        case 'd': {  // DICT
          const size_t first = pop_mark();
          if ((stack_.size() - first) % 2 != 0) fail(fmt::format("DICT at byte {}: odd number of items", op_offset_));
          ValueRef d = doc_.store.make_container(ValueKind::kDict);
          doc_.store.append_children(d, stack_.data() + first, stack_.size() - first);
          stack_.resize(first);
          check_depth(d);
          push(d);
          break;
        }
        case 'l':     // LIST
        case 0x91: {  // FROZENSET
          const size_t first = pop_mark();
          ValueRef l = doc_.store.make_container(ValueKind::kList);
          doc_.store.append_children(l, stack_.data() + first, stack_.size() - first);
          stack_.resize(first);
          check_depth(l);
          push(l);
          break;
        }
        case 't': {
          const size_t first = pop_mark();
          push(make_tuple(first));
          break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {  // TUPLE1..3
          const size_t n = static_cast<size_t>(op - 0x84);
          if (stack_.size() < floor() + n)
            fail(fmt::format("{} at byte {}: stack underflow", current_name(), op_offset_));
          push(make_tuple(stack_.size() - n));
          break;
        }
        case 's': {  // SETITEM
          if (stack_.size() < floor() + 3) fail(fmt::format("SETITEM at byte {}: stack underflow", op_offset_));
          append_to(stack_[stack_.size() - 3], stack_.size() - 2, true);
          break;
        }
        case 'u': {  // SETITEMS
          const size_t first = pop_mark();
          if (first == 0 || first - 1 < floor() || first > stack_.size())
            fail(fmt::format("SETITEMS at byte {}: no dict below the MARK", op_offset_));
          append_to(stack_[first - 1], first, true);
          break;
        }
        case 'a': {  // APPEND
          if (stack_.size() < floor() + 2) fail(fmt::format("APPEND at byte {}: stack underflow", op_offset_));
          append_to(stack_[stack_.size() - 2], stack_.size() - 1, false);
          break;
        }
        case 'e':     // APPENDS
        case 0x90: {  // ADDITEMS
          const size_t first = pop_mark();
          if (first == 0 || first - 1 < floor() || first > stack_.size())
            fail(fmt::format("{} at byte {}: no list below the MARK", current_name(), op_offset_));
          append_to(stack_[first - 1], first, false);
          break;
        }
        // ---- numbers
        case 'J':
          push(make_int(static_cast<int32_t>(static_cast<uint32_t>(read_le(4)))));
          break;
        case 'K':
          push(make_int(static_cast<int64_t>(read_le(1))));
          break;
        case 'M':
          push(make_int(static_cast<int64_t>(read_le(2))));
          break;
        case 0x8a:
          read_long(read_le(1));
          break;
        case 0x8b: {
          const int64_t n = static_cast<int32_t>(static_cast<uint32_t>(read_le(4)));
          if (n < 0) fail(fmt::format("LONG4 at byte {}: negative length {}", op_offset_, n));
          read_long(static_cast<uint64_t>(n));
          break;
        }
        case 'I': {
          const std::string text = in_.line(kMaxLine);
          if (text == "00" || text == "01") {
            push(doc_.store.make_bool(text == "01"));
          } else {
            const int64_t v = parse_decimal(text);
            push(v == INT64_MIN ? doc_.store.make_huge_int() : make_int(v));
          }
          break;
        }
        case 'L': {
          const int64_t v = parse_decimal(in_.line(kMaxLine));
          push(v == INT64_MIN ? doc_.store.make_huge_int() : make_int(v));
          break;
        }
        case 'G': {
          const uint64_t raw = read_le(8);
          uint64_t bits = 0;  // big-endian on the wire
          for (int i = 0; i < 8; ++i) bits = (bits << 8) | ((raw >> (8 * i)) & 0xff);
          double d = 0;
          std::memcpy(&d, &bits, sizeof d);
          push(doc_.store.make_float(d));
          break;
        }
        case 'F': {
          const std::string text = in_.line(kMaxLine);
          char* end = nullptr;
          const double d = std::strtod(text.c_str(), &end);
          if (text.empty() || end != text.c_str() + text.size()) {
            fail(fmt::format("FLOAT at byte {}: '{}' is not a number", op_offset_, printable(text)));
          }
          push(doc_.store.make_float(d));
          break;
        }
        case 'N':
          push(doc_.store.make_none());
          break;
        case 0x88:
          push(doc_.store.make_bool(true));
          break;
        case 0x89:
          push(doc_.store.make_bool(false));
          break;
        // ---- strings and bytes
        case 'X':
          read_text(ValueKind::kString, read_le(4));
          break;
        case 0x8c:
          read_text(ValueKind::kString, read_le(1));
          break;
        case 0x8d:
          read_text(ValueKind::kString, read_le(8));
          break;
        case 'T': {
          const int64_t n = static_cast<int32_t>(static_cast<uint32_t>(read_le(4)));
          if (n < 0) fail(fmt::format("BINSTRING at byte {}: negative length {}", op_offset_, n));
          read_text(ValueKind::kString, static_cast<uint64_t>(n));
          break;
        }
        case 'U':
          read_text(ValueKind::kString, read_le(1));
          break;
        case 'B':
          read_text(ValueKind::kBytes, read_le(4));
          break;
        case 'C':
          read_text(ValueKind::kBytes, read_le(1));
          break;
        case 0x8e:
        case 0x96:
          read_text(ValueKind::kBytes, read_le(8));
          break;
        case 'S':
        case 'V':
          fail(
              fmt::format("{} at byte {}: protocol-0 quoted strings are not supported; re-save the snapshot "
                          "with torch.cuda.memory._dump_snapshot (protocol 2 or later)",
                          current_name(), op_offset_));
        // ---- memo
        case 0x94:
          memo_put(memo_count_);
          break;
        case 'q':
          memo_put(read_le(1));
          break;
        case 'r':
          memo_put(read_le(4));
          break;
        case 'p': {
          const int64_t v = parse_decimal(in_.line(kMaxLine));
          if (v < 0) fail(fmt::format("PUT at byte {}: bad memo index", op_offset_));
          memo_put(static_cast<uint64_t>(v));
          break;
        }
        case 'h':
        case 'j':
          get_run(op);
          break;
        case 'g': {
          const int64_t v = parse_decimal(in_.line(kMaxLine));
          if (v < 0) fail(fmt::format("GET at byte {}: bad memo index", op_offset_));
          push(memo_get(static_cast<uint64_t>(v)));
          break;
        }
        // ---- refused: code execution or outside references
        case 'c': {
          std::string module, name;
          try {
            module = in_.line(256);
            name = in_.line(256);
          } catch (...) {
          }
          refuse(fmt::format("it would import Python code '{}.{}'", printable(module), printable(name)));
        }
        case 0x93:
          refuse("it would import Python code named by the strings before it");
        case 'R':
          refuse("it would call a Python object");
        case 'b':
          refuse("it would run an object's __setstate__");
        case 'i':
          refuse("it would import and instantiate a Python class");
        case 'o':
          refuse("it would instantiate a Python class");
        case 0x81:
        case 0x92:
          refuse("it would instantiate a Python class");
        case 'P':
        case 'Q':
          refuse("it would load a persistent object from outside the pickle");
        case 0x82:
        case 0x83:
        case 0x84:
          refuse("it would import code through the copyreg extension registry");
        case 0x97:
        case 0x98:
          refuse("it refers to out-of-band buffers");
        default:
          fail(fmt::format("unknown opcode 0x{:02x} at byte {}: not a pickle, or a corrupt one", op, op_offset_));
      }
    }
  }

  Input& in_;
  std::string name_;
  ItemSink* sink_ = nullptr;
  // Streaming: the list claimed last, and its items by placeholder id
  // (first_id_ + item index; ids keep counting across claimed lists).
  static constexpr uint32_t kNone = UINT32_MAX;
  bool claimed_ = false;
  ValueRef claimed_list_;
  uint32_t first_id_ = 0;
  uint32_t opened_ = 0;       // items opened (EMPTY_DICT)
  uint32_t appended_ = 0;     // items appended to the list, in order
  uint32_t filling_ = kNone;  // the item whose pairs may come (the last opened, not yet filled)
  int item_height_ = 1;       // tallest item so far
  // The list made last in an item's batch (None: none), for share_fresh_list.
  ValueRef fresh_list_;
  uint32_t fresh_item_ = kNone;    // the item it was made for
  size_t fresh_children_ = 0;      // the store's child count when it was made
  int fresh_memo_puts_ = 0;        // memo entries it was put in
  uint64_t fresh_memo_index_ = 0;  // the last of them
  // short_text's cache: texts of at most kShortText bytes, by content.
  static constexpr size_t kShortText = 7;
  static constexpr int kShortTextBits = 6;
  struct ShortText {
    uint64_t key = 0;
    ValueRef ref;
    bool valid = false;
  };
  std::array<ShortText, 1 << kShortTextBits> short_texts_{};
  PickleDocument doc_;
  std::vector<ValueRef> stack_;
  std::vector<size_t> marks_;
  PagedVector<ValueRef> memo_;  // paged: no 2x copy when it grows
  std::unordered_map<uint64_t, ValueRef> sparse_memo_;
  uint64_t memo_count_ = 0;
  int64_t op_offset_ = 0;
  uint8_t op_ = 0;
};

}  // namespace

PickleDocument read_pickle_bytes(std::string_view bytes, const std::string& name, ItemSink* sink) {
  Input in(bytes);
  return Machine(in, name, sink).run();
}

PickleDocument read_pickle_file(const std::string& path, ItemSink* sink) {
  // fopen opens a folder on Linux, and ftell then reports a size it cannot read.
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored))
    throw SnapshotError(fmt::format("{}: is a folder, not a memory snapshot", path));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw SnapshotError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  if (std::fseek(file.get(), 0, SEEK_END) != 0) {
    throw SnapshotError(fmt::format("{}: cannot read: not a regular file", path));
  }
  const long size = std::ftell(file.get());
  if (size < 0) throw SnapshotError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  std::rewind(file.get());
  if (size == 0) throw SnapshotError(fmt::format("{}: pickle: the file is empty", path));
  Input in(file.get(), size);
  return Machine(in, path, sink).run();
}

}  // namespace oomtune::diagnose
