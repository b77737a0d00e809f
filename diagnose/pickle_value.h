#pragma once
// The values a data-only pickle can hold, stored compactly.
//
// A memory snapshot of 10^6 trace events is ~10^7 small values (dicts of a
// few ints and shared strings). Holding each as a heap object would cost
// several times the file size, so values live in one ValueStore:
//   - a ValueRef is 32 bits: a 3-bit tag and a 29-bit payload. Small ints
//     (|v| < 2^28), None and booleans are immediate; other ints, floats,
//     strings and containers are indices into the store's tables;
//   - a container's children are appended in runs (one per APPENDS /
//     SETITEMS batch) to one paged array, so no per-container allocation and
//     no reallocation spikes; a container whose children form one run (the
//     usual case) keeps it inline, with no chunk record;
//   - a list or tuple whose new run equals a run stored before shares it
//     (the array is append-only, so a stored run never changes): PyTorch
//     writes one frames list per allocation, the same frames over and over;
//   - a dict filled by one batch keeps its keys and its values as two runs,
//     and the key run is shared like a list's: every trace event has the
//     same 8 keys, stored once;
//   - equal large ints share an entry when a small cache still has the
//     value (addresses repeat);
//   - a memoized value fetched again (pickle's BINGET) is the same ValueRef,
//     so shared frames and strings are stored once;
//   - a list's items can be held outside the store ("taken": a reader's
//     ItemSink converted them as they were read, pickle_reader.h): the store
//     keeps only their number, and a placeholder ValueRef stands for such an
//     item while it is read. Using either as stored values throws NotInStore.
//     The large ints of such an item (a trace event's time) are transient:
//     kept only until the sink has read them.
// Source of the pickle data model: CPython Lib/pickle.py and
// Lib/pickletools.py (protocols 0–5).

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace oomtune::diagnose {

/// What a value is. Sets and frozensets are read as kList.
enum class ValueKind : uint8_t { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict, kHugeInt };

/// "int", "str", ... as Python names them (for error messages).
const char* kind_name(ValueKind kind);

/// Thrown when a value the store does not hold is used as if it did: a
/// placeholder given as a child, an item added to a list of taken items (or
/// a taken item to a list of stored ones), the items of a taken list read.
/// A reader streaming into an ItemSink turns it into SinkAbandoned.
class NotInStore : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// A handle to one value in a ValueStore. Default: None.
class ValueRef {
 public:
  /// Layout: the low 3 bits a tag, the high 29 a payload (pickle_value.cpp
  /// lists the tags; the two here let hot readers inline).
  static constexpr uint32_t kTagBits = 3;
  static constexpr uint32_t kTagMask = (1u << kTagBits) - 1;
  static constexpr uint32_t kContainerTag = 5;    ///< payload: index in the store's containers
  static constexpr uint32_t kPlaceholderTag = 6;  ///< payload: a reader's id
  static constexpr uint32_t kTransientTag = 7;    ///< payload: index in the store's transient ints

  constexpr ValueRef() = default;
  /// The raw 32 bits (tag in the low 3 bits).
  constexpr uint32_t bits() const { return bits_; }
  static constexpr ValueRef from_bits(uint32_t bits) { return ValueRef(bits); }
  constexpr bool operator==(ValueRef other) const { return bits_ == other.bits_; }
  constexpr bool operator!=(ValueRef other) const { return bits_ != other.bits_; }

 private:
  constexpr explicit ValueRef(uint32_t bits) : bits_(bits) {}
  uint32_t bits_ = 0;  // tag kSpecial, payload 0 = None
};

/// Raw memory in 2 MiB-aligned pieces; from the second piece of a table on,
/// the kernel is asked for transparent huge pages (one fault per 2 MiB
/// instead of 512: page faults were a fifth of the time reading a 1 GB
/// snapshot). Small inputs stay small: their first piece is not advised.
void* allocate_piece(size_t bytes, bool huge);
void free_piece(void* piece);

struct PieceDeleter {
  void operator()(void* p) const { free_piece(p); }
};

/// A table that grows in fixed pages of 2 MiB: appending never moves
/// earlier elements or copies the whole table (no 2x spike as std::vector
/// has). T must be trivially copyable.
template <typename T>
class PagedVector {
 public:
  static constexpr size_t kPageBytes = size_t{2} << 20;
  static constexpr size_t kPageSize = kPageBytes / sizeof(T);
  size_t size() const { return size_; }
  void push_back(const T& value) {
    if (size_ == limit_) grow();
    tail_[size_ - base_] = value;
    ++size_;
  }
  /// Drops the last element when it lies in the last page (true), else
  /// keeps it (false): a page, once taken, stays.
  bool pop_back() {
    if (size_ == base_) return false;
    --size_;
    return true;
  }
  T& operator[](size_t i) { return page(i / kPageSize)[i % kPageSize]; }
  const T& operator[](size_t i) const { return page(i / kPageSize)[i % kPageSize]; }
  /// The elements [i, i + n) as one array when they lie in one page (n > 0),
  /// else nullptr.
  const T* run(size_t i, size_t n) const {
    return i / kPageSize == (i + n - 1) / kPageSize ? &page(i / kPageSize)[i % kPageSize] : nullptr;
  }
  /// Bytes held (for memory accounting in tests and the benchmark).
  size_t bytes() const { return pages_.size() * kPageBytes; }

 private:
  T* page(size_t p) const { return static_cast<T*>(pages_[p].get()); }
  void grow() {
    pages_.emplace_back(allocate_piece(kPageBytes, !pages_.empty()));
    tail_ = page(pages_.size() - 1);
    base_ = size_;
    limit_ = size_ + kPageSize;
  }
  std::vector<std::unique_ptr<void, PieceDeleter>> pages_;
  T* tail_ = nullptr;
  size_t size_ = 0;
  size_t base_ = 0;
  size_t limit_ = 0;
};

/// Owner of all values of one pickle. Not thread-safe; move-only.
class ValueStore {
 public:
  /// Largest number of entries in any one table (2^29, the payload width).
  static constexpr uint32_t kMaxEntries = (uint32_t{1} << 29) - 1;

  ValueStore() = default;
  ValueStore(ValueStore&&) = default;
  ValueStore& operator=(ValueStore&&) = default;

  // ---- building (used by the pickle reader) ----
  ValueRef make_none() const { return ValueRef(); }
  ValueRef make_bool(bool value) const;
  ValueRef make_int(int64_t value);
  /// An integer that does not fit in 64 bits; only its kind is kept.
  ValueRef make_huge_int() const;
  ValueRef make_float(double value);
  ValueRef make_string(std::string_view utf8);
  ValueRef make_bytes(std::string_view bytes);
  /// Appends `size` bytes for a string/bytes value and returns where to
  /// write them (so a reader can copy from its input without a temporary).
  char* append_text(ValueKind kind, size_t size, ValueRef* out);
  /// An empty list, tuple or dict.
  ValueRef make_container(ValueKind kind);
  /// Appends children to a list/tuple (values) or dict (key, value pairs).
  /// Throws std::length_error past kMaxEntries.
  void append_children(ValueRef container, const ValueRef* children, size_t count);
  /// Nesting height of a container (1 + the tallest child), 0 for scalars.
  int height(ValueRef value) const {
    if ((value.bits() & ValueRef::kTagMask) != ValueRef::kContainerTag) return 0;
    return containers_[value.bits() >> ValueRef::kTagBits].height;
  }

  // ---- items held outside the store (see ItemSink, pickle_reader.h)
  /// A stand-in for a value that a reader keeps outside the store; `id`
  /// (< 2^29) is the reader's. The store never makes one itself and refuses
  /// one as a child (append_children throws NotInStore); kind() and the
  /// other readers see None.
  static ValueRef placeholder(uint32_t id) {
    return ValueRef::from_bits(id << ValueRef::kTagBits | ValueRef::kPlaceholderTag);
  }
  /// True, with its id, when `value` is a placeholder.
  static bool is_placeholder(ValueRef value, uint32_t* id) {
    if ((value.bits() & ValueRef::kTagMask) != ValueRef::kPlaceholderTag) return false;
    *id = value.bits() >> ValueRef::kTagBits;
    return true;
  }
  /// Appends `count` items held outside the store to a list, of nesting
  /// height `height` at most: only their number is kept. Throws NotInStore
  /// when the list already has stored items (or `list` is no list), as
  /// append_children does on a list with taken items.
  void append_taken(ValueRef list, size_t count, int height);
  /// True for a list whose items are taken. Reading its items (for_each_item,
  /// items_key) throws NotInStore; kind, size and height answer as usual.
  bool is_taken(ValueRef value) const;
  /// An int kept only until clear_transients(): a value a reader hands to an
  /// ItemSink, which reads it at once, so the store need not keep it. kind()
  /// and as_int() read it like any int; append_children stores it as
  /// make_int would, lasting() gives the stored equivalent.
  ValueRef make_transient_int(int64_t value);
  /// `value`, or for a transient int the same int stored.
  ValueRef lasting(ValueRef value) {
    if ((value.bits() & ValueRef::kTagMask) != ValueRef::kTransientTag) return value;
    return make_int(transients_[value.bits() >> ValueRef::kTagBits]);
  }
  /// Forgets the transient ints; a ref to one must not be used afterwards.
  void clear_transients() { transients_.clear(); }
  /// Number of children stored so far (see share_list).
  size_t child_count() const { return children_.size(); }
  /// For a list just filled with one run (made when child_count() was
  /// `children_before`): an earlier list with the same run, when there is
  /// one and `list` is the container made last with a run stored before it
  /// (PyTorch writes one frames list per trace event, the same frames over
  /// and over); else `list`, remembered for the next list with its run.
  /// When it returns another list, `list` is forgotten (the caller replaces
  /// every ref to it) and the list returned is frozen: adding to it
  /// afterwards throws NotInStore, as it now stands for both.
  ValueRef share_list(ValueRef list, size_t children_before);

  // ---- reading ----
  ValueKind kind(ValueRef value) const;
  bool is_container(ValueRef value) const;
  bool as_bool(ValueRef value) const;              ///< kBool only
  int64_t as_int(ValueRef value) const;            ///< kInt (and kBool as 0/1)
  double as_float(ValueRef value) const;           ///< kFloat, or kInt converted
  std::string_view as_text(ValueRef value) const;  ///< kString / kBytes
  /// Number of children: items of a list/tuple, pairs of a dict.
  size_t size(ValueRef container) const;
  /// Calls fn(child) for list/tuple items, fn(key, value) for dicts.
  template <typename Fn>
  void for_each_item(ValueRef container, Fn&& fn) const;
  template <typename Fn>
  void for_each_pair(ValueRef dict, Fn&& fn) const;
  /// Finds the value of the first key equal to the string `key`; false
  /// when absent (or `dict` is not a dict).
  bool find(ValueRef dict, std::string_view key, ValueRef* value) const;
  /// For a container whose children are one stored run: a key such that
  /// two containers with the same key hold the same children (they share
  /// the run; all empty containers have key 0). False for scalars and for
  /// containers built from several runs. Lets a reader cache what it made
  /// of a list by content instead of by identity.
  bool items_key(ValueRef container, uint64_t* key) const;

  /// Bytes held by the store's tables (approximate heap use).
  size_t bytes() const;

 private:
  // A container's children (Form::kRuns): one run children_[start, start +
  // size) while `chunks` is kNoChunk; else the chunk list from `chunks`, and
  // `start` holds the last chunk's index (where the next run is linked). A
  // split dict (Form::kSplit) has its size / 2 values at `start` and its keys
  // at `chunks`. A list of taken items (Form::kTaken) has only its size. A
  // list that stands for others with its run (Form::kShared, share_list) is
  // one run and takes no more items.
  static constexpr uint32_t kNoChunk = UINT32_MAX;
  enum class Form : uint8_t { kRuns, kSplit, kTaken, kShared };  // kShared: kRuns, frozen
  struct Container {
    uint32_t start = 0;
    uint32_t size = 0;  // children (items, or keys + values)
    uint32_t chunks = kNoChunk;
    uint16_t height = 1;
    ValueKind kind = ValueKind::kList;
    Form form = Form::kRuns;
  };
  struct Chunk {
    uint32_t start = 0;
    uint32_t count = 0;
    uint32_t next = kNoChunk;
  };
  struct Text {
    const char* data = nullptr;
    uint32_t size = 0;
    bool is_bytes = false;
  };
  /// A list/tuple run remembered for sharing (direct-mapped by content hash).
  struct Run {
    uint32_t start = 0;
    uint32_t count = 0;  // 0: empty slot
  };
  static constexpr uint32_t kMinSharedRun = 2;           // shorter runs are not looked up
  static constexpr size_t kMinSplitDict = 4;             // children (2 pairs) before a dict is split
  static constexpr size_t kTextBlock = size_t{2} << 20;  // bytes per text arena block
  uint32_t index_of(ValueRef value) const;
  /// Where `count` children equal to `children` are already stored, or
  /// UINT32_MAX; remember_run() records a new run for later lookups.
  uint32_t find_run(const ValueRef* children, size_t count, uint64_t hash) const;
  void remember_run(uint32_t start, size_t count, uint64_t hash);
  /// Adds the run children_[start, start + count) to container c.
  void link_run(Container& c, uint32_t start, uint32_t count);
  /// Stores `count` children (shared with an equal run when `shareable`);
  /// returns where they start.
  uint32_t store_run(const ValueRef* children, size_t count, bool shareable);
  /// A split dict gets a second batch: its pairs are copied into one run.
  void unsplit(Container& c);
  template <typename Fn>
  void for_each_in_run(uint32_t start, uint32_t count, Fn& fn) const;
  [[noreturn]] static void taken_items_read();

  /// Copies a dict's children, in order, into `out` (for_each_pair on a
  /// dict that is not split, or whose runs cross a page).
  void gather(const Container& c, std::vector<uint32_t>* out) const;

  PagedVector<int64_t> ints_;
  PagedVector<double> floats_;
  PagedVector<Text> texts_;
  std::vector<std::unique_ptr<void, PieceDeleter>> text_blocks_;
  size_t text_block_used_ = kTextBlock;  // bytes used in the last block
  size_t text_bytes_ = 0;
  PagedVector<Container> containers_;
  PagedVector<Chunk> chunks_;
  PagedVector<uint32_t> children_;
  std::unique_ptr<Run[]> runs_;  // run-sharing table, made on first use
  size_t run_slots_ = 0;
  std::vector<ValueRef> scratch_;    // a dict batch's keys
  std::vector<int64_t> transients_;  // transient ints, by payload
  static constexpr int kSharedListBits = 12;
  std::vector<uint32_t> shared_lists_;  // by run: 1 + index of a list with that run, 0: none
  /// A cached large int: its value is kept here, so a miss (most of them:
  /// timestamps never repeat) does not read the ints table.
  struct CachedInt {
    int64_t value = 0;
    uint32_t ref = 0;  // 1 + index in ints_, 0: none
  };
  static constexpr int kIntCacheBits = 12;
  std::vector<CachedInt> int_cache_ = std::vector<CachedInt>(size_t{1} << kIntCacheBits);
  Run last_keys_;  // the last split dict's key run
};

template <typename Fn>
void ValueStore::for_each_in_run(uint32_t start, uint32_t count, Fn& fn) const {
  size_t i = start;
  const size_t end = size_t{start} + count;
  while (i < end) {  // contiguous pieces within one page
    const uint32_t* run = &children_[i];
    const size_t in_page = PagedVector<uint32_t>::kPageSize - i % PagedVector<uint32_t>::kPageSize;
    const size_t n = std::min(end - i, in_page);
    for (size_t j = 0; j < n; ++j) fn(ValueRef::from_bits(run[j]));
    i += n;
  }
}

template <typename Fn>
void ValueStore::for_each_item(ValueRef container, Fn&& fn) const {
  const Container& c = containers_[index_of(container)];
  if (c.form == Form::kTaken) taken_items_read();
  if (c.form == Form::kSplit) {  // key, value, key, value ... from the two runs
    const size_t pairs = c.size / 2;
    for (size_t i = 0; i < pairs; ++i) {
      fn(ValueRef::from_bits(children_[size_t{c.chunks} + i]));
      fn(ValueRef::from_bits(children_[size_t{c.start} + i]));
    }
    return;
  }
  if (c.chunks == kNoChunk) {
    for_each_in_run(c.start, c.size, fn);
    return;
  }
  for (uint32_t chunk = c.chunks; chunk != kNoChunk; chunk = chunks_[chunk].next) {
    const Chunk& k = chunks_[chunk];
    for_each_in_run(k.start, k.count, fn);
  }
}

template <typename Fn>
void ValueStore::for_each_pair(ValueRef dict, Fn&& fn) const {
  // One loop, one call site (so fn is inlined): a split dict's two runs
  // read in place, any other layout gathered first (rare: a one-pair dict,
  // or one filled by several batches).
  const Container& c = containers_[index_of(dict)];
  if (c.form == Form::kTaken) taken_items_read();
  const size_t pairs = c.size / 2;
  if (pairs == 0) return;
  const uint32_t* keys = nullptr;
  const uint32_t* values = nullptr;
  size_t stride = 1;
  std::vector<uint32_t> gathered;
  if (c.form == Form::kSplit) {
    keys = children_.run(c.chunks, pairs);
    values = children_.run(c.start, pairs);
  }
  if (keys == nullptr || values == nullptr) {
    gather(c, &gathered);
    keys = gathered.data();
    values = gathered.data() + 1;
    stride = 2;
  }
  for (size_t i = 0; i < pairs; ++i) fn(ValueRef::from_bits(keys[i * stride]), ValueRef::from_bits(values[i * stride]));
}

}  // namespace oomtune::diagnose
