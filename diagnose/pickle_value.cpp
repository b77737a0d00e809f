#include "diagnose/pickle_value.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace oomtune::diagnose {
namespace {

// ValueRef layout: low 3 bits tag, high 29 bits payload.
enum Tag : uint32_t {
  kTagSpecial = 0,                              // payload: 0 None, 1 False, 2 True, 3 huge int
  kTagSmallInt = 1,                             // payload: 29-bit two's complement
  kTagInt = 2,                                  // payload: index in ints_
  kTagFloat = 3,                                // payload: index in floats_
  kTagText = 4,                                 // payload: index in texts_
  kTagContainer = ValueRef::kContainerTag,      // payload: index in containers_
  kTagPlaceholder = ValueRef::kPlaceholderTag,  // payload: a reader's id (never stored)
  kTagTransient = ValueRef::kTransientTag,      // payload: index in transients_ (never stored)
};
constexpr uint32_t kTagBits = ValueRef::kTagBits;
constexpr uint32_t kTagMask = ValueRef::kTagMask;
constexpr int64_t kSmallIntLimit = int64_t{1} << 28;  // |v| < 2^28 is immediate
constexpr uint16_t kMaxHeight = UINT16_MAX;

uint32_t tag_of(ValueRef v) { return v.bits() & kTagMask; }
uint32_t payload_of(ValueRef v) { return v.bits() >> kTagBits; }
ValueRef make_ref(uint32_t tag, uint32_t payload) { return ValueRef::from_bits((payload << kTagBits) | tag); }

void check_room(size_t size) {
  if (size >= ValueStore::kMaxEntries) throw std::length_error("pickle holds more than 2^29 values of one kind");
}

}  // namespace

void* allocate_piece(size_t bytes, bool huge) {
  constexpr size_t kAlign = size_t{2} << 20;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge) madvise(p, rounded, MADV_HUGEPAGE);
#else
  (void)huge;
#endif
  return p;
}

void free_piece(void* piece) { std::free(piece); }

const char* kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::kNone:
      return "None";
    case ValueKind::kBool:
      return "bool";
    case ValueKind::kInt:
      return "int";
    case ValueKind::kHugeInt:
      return "int (over 64 bits)";
    case ValueKind::kFloat:
      return "float";
    case ValueKind::kString:
      return "str";
    case ValueKind::kBytes:
      return "bytes";
    case ValueKind::kList:
      return "list";
    case ValueKind::kTuple:
      return "tuple";
    case ValueKind::kDict:
      return "dict";
  }
  return "?";
}

ValueRef ValueStore::make_bool(bool value) const { return make_ref(kTagSpecial, value ? 2 : 1); }
ValueRef ValueStore::make_huge_int() const { return make_ref(kTagSpecial, 3); }

ValueRef ValueStore::make_int(int64_t value) {
  if (value > -kSmallIntLimit && value < kSmallIntLimit) {
    return make_ref(kTagSmallInt, static_cast<uint32_t>(value) & ((1u << 29) - 1));
  }
  // Equal large ints share one entry (device addresses repeat: the caching
  // allocator hands the same blocks out again); a direct-mapped cache.
  const size_t slot = (static_cast<uint64_t>(value) * 0x9E3779B97F4A7C15ull) >> (64 - kIntCacheBits);
  CachedInt& cached = int_cache_[slot];
  if (cached.ref != 0 && cached.value == value) return make_ref(kTagInt, cached.ref - 1);
  check_room(ints_.size());
  ints_.push_back(value);
  cached = CachedInt{value, static_cast<uint32_t>(ints_.size())};
  return make_ref(kTagInt, static_cast<uint32_t>(ints_.size() - 1));
}

ValueRef ValueStore::make_transient_int(int64_t value) {
  if ((value > -kSmallIntLimit && value < kSmallIntLimit) || transients_.size() >= kMaxEntries) return make_int(value);
  transients_.push_back(value);
  return make_ref(kTagTransient, static_cast<uint32_t>(transients_.size() - 1));
}

ValueRef ValueStore::make_float(double value) {
  check_room(floats_.size());
  floats_.push_back(value);
  return make_ref(kTagFloat, static_cast<uint32_t>(floats_.size() - 1));
}

char* ValueStore::append_text(ValueKind kind, size_t size, ValueRef* out) {
  check_room(texts_.size());
  if (size > UINT32_MAX) throw std::length_error("string longer than 4 GiB");
  char* data = nullptr;
  if (size > kTextBlock / 4) {
    // Large strings get a block of their own; the current block stays open.
    text_blocks_.emplace_back(allocate_piece(size, false));
    data = static_cast<char*>(text_blocks_.back().get());
    if (text_blocks_.size() >= 2) std::swap(text_blocks_.back(), text_blocks_[text_blocks_.size() - 2]);
  } else {
    if (text_blocks_.empty() || text_block_used_ + size > kTextBlock) {
      text_blocks_.emplace_back(allocate_piece(kTextBlock, !text_blocks_.empty()));
      text_block_used_ = 0;
    }
    data = static_cast<char*>(text_blocks_.back().get()) + text_block_used_;
    text_block_used_ += size;
  }
  text_bytes_ += size;
  texts_.push_back(Text{data, static_cast<uint32_t>(size), kind == ValueKind::kBytes});
  *out = make_ref(kTagText, static_cast<uint32_t>(texts_.size() - 1));
  return data;
}

ValueRef ValueStore::make_string(std::string_view utf8) {
  ValueRef ref;
  char* data = append_text(ValueKind::kString, utf8.size(), &ref);
  if (!utf8.empty()) std::memcpy(data, utf8.data(), utf8.size());
  return ref;
}

ValueRef ValueStore::make_bytes(std::string_view bytes) {
  ValueRef ref;
  char* data = append_text(ValueKind::kBytes, bytes.size(), &ref);
  if (!bytes.empty()) std::memcpy(data, bytes.data(), bytes.size());
  return ref;
}

ValueRef ValueStore::make_container(ValueKind kind) {
  check_room(containers_.size());
  Container c;
  c.kind = kind;
  containers_.push_back(c);
  return make_ref(kTagContainer, static_cast<uint32_t>(containers_.size() - 1));
}

namespace {

// Run-sharing table: 4096 slots, 65536 once the store holds 2^22 children
// (a table is a cache: a slot lost to a collision only costs a copy).
constexpr size_t kSmallRunTable = size_t{1} << 12;
constexpr size_t kLargeRunTable = size_t{1} << 16;
constexpr size_t kLargeRunTableFrom = size_t{1} << 22;

uint64_t hash_run(const ValueRef* children, size_t count) {
  // Two refs a step, in two independent chains: a frames list is ~24 refs,
  // and one chain of 24 dependent multiplies was most of storing it.
  constexpr uint64_t kMul = 0xFF51AFD7ED558CCDull;
  auto two = [children](size_t i) { return uint64_t{children[i].bits()} << 32 | children[i + 1].bits(); };
  uint64_t a = 0x9E3779B97F4A7C15ull ^ count;
  uint64_t b = 0xC2B2AE3D27D4EB4Full;
  size_t i = 0;
  for (; i + 4 <= count; i += 4) {
    a = (a ^ two(i)) * kMul;
    b = (b ^ two(i + 2)) * kMul;
    a ^= a >> 29;
    b ^= b >> 29;
  }
  for (; i < count; ++i) {
    a = (a ^ children[i].bits()) * kMul;
    a ^= a >> 29;
  }
  return (a ^ (b * 0x9E3779B97F4A7C15ull)) * kMul;
}

}  // namespace

uint32_t ValueStore::find_run(const ValueRef* children, size_t count, uint64_t hash) const {
  if (!runs_) return UINT32_MAX;
  const Run& slot = runs_[hash & (run_slots_ - 1)];
  if (slot.count != count) return UINT32_MAX;
  const uint32_t* run = children_.run(slot.start, count);
  for (size_t i = 0; i < count; ++i) {
    if ((run != nullptr ? run[i] : children_[size_t{slot.start} + i]) != children[i].bits()) return UINT32_MAX;
  }
  return slot.start;
}

void ValueStore::remember_run(uint32_t start, size_t count, uint64_t hash) {
  const size_t want = children_.size() >= kLargeRunTableFrom ? kLargeRunTable : kSmallRunTable;
  if (run_slots_ < want) {  // first use, or grown: start the cache afresh
    runs_ = std::make_unique<Run[]>(want);
    run_slots_ = want;
  }
  runs_[hash & (run_slots_ - 1)] = Run{start, static_cast<uint32_t>(count)};
}

void ValueStore::link_run(Container& c, uint32_t start, uint32_t count) {
  if (c.chunks == kNoChunk) {
    if (c.size == 0) {
      c.start = start;
      c.size = count;
      return;
    }
    if (c.start + c.size == start) {  // the run follows: extend it
      c.size += count;
      return;
    }
    // A second, separate run: move to a chunk list.
    chunks_.push_back(Chunk{c.start, c.size, kNoChunk});
    const uint32_t first = static_cast<uint32_t>(chunks_.size() - 1);
    chunks_.push_back(Chunk{start, count, kNoChunk});
    const uint32_t second = static_cast<uint32_t>(chunks_.size() - 1);
    chunks_[first].next = second;
    c.chunks = first;
    c.start = second;
    c.size += count;
    return;
  }
  Chunk& last = chunks_[c.start];
  if (last.start + last.count == start) {
    last.count += count;
  } else {
    chunks_.push_back(Chunk{start, count, kNoChunk});
    const uint32_t chunk = static_cast<uint32_t>(chunks_.size() - 1);
    chunks_[c.start].next = chunk;
    c.start = chunk;
  }
  c.size += count;
}

uint32_t ValueStore::store_run(const ValueRef* children, size_t count, bool shareable) {
  shareable = shareable && count >= kMinSharedRun;
  const uint64_t hash = shareable ? hash_run(children, count) : 0;
  uint32_t start = shareable ? find_run(children, count, hash) : UINT32_MAX;
  if (start == UINT32_MAX) {
    start = static_cast<uint32_t>(children_.size());
    for (size_t i = 0; i < count; ++i) children_.push_back(children[i].bits());
    if (shareable) remember_run(start, count, hash);
  }
  return start;
}

void ValueStore::unsplit(Container& c) {
  const size_t pairs = c.size / 2;
  const uint32_t start = static_cast<uint32_t>(children_.size());
  for (size_t i = 0; i < pairs; ++i) {
    const uint32_t key = children_[size_t{c.chunks} + i];
    const uint32_t value = children_[size_t{c.start} + i];
    children_.push_back(key);
    children_.push_back(value);
  }
  c.start = start;
  c.chunks = kNoChunk;
  c.form = Form::kRuns;
}

void ValueStore::append_children(ValueRef container, const ValueRef* children, size_t count) {
  if (count == 0) return;
  Container& c = containers_[index_of(container)];
  if (c.form == Form::kTaken) throw NotInStore("ValueStore: stored items added to a list of taken items");
  if (c.form == Form::kShared) throw NotInStore("ValueStore: items added to a list shared by others");
  const bool split = c.form == Form::kSplit;
  const size_t copied = split ? c.size : 0;  // unsplit() copies the pairs
  if (children_.size() + copied + count >= UINT32_MAX || size_t{c.size} + count >= UINT32_MAX ||
      chunks_.size() + 2 >= kMaxEntries) {
    throw std::length_error("pickle holds more than 2^32 container items");
  }
  int tallest = 0;
  bool transient = false;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t tag = tag_of(children[i]);
    if (tag == kTagContainer) {
      tallest = std::max(tallest, height(children[i]));
    } else if (tag == kTagPlaceholder) {
      throw NotInStore("ValueStore: a placeholder stored as a child");
    } else if (tag == kTagTransient) {
      transient = true;
    }
  }
  if (transient) {  // rare: a transient int stored after all
    std::vector<ValueRef> stored(children, children + count);
    for (ValueRef& v : stored) v = lasting(v);
    append_children(container, stored.data(), count);
    return;
  }
  if (tallest + 1 > c.height) c.height = static_cast<uint16_t>(std::min<int>(tallest + 1, kMaxHeight));
  if (c.kind == ValueKind::kDict) {
    if (c.size == 0 && c.chunks == kNoChunk && count >= kMinSplitDict && count % 2 == 0) {
      // The first batch of a dict: keys (shared) and values as two runs.
      // Dicts of one kind come in a row (trace events): the last key run
      // is tried before hashing.
      const size_t pairs = count / 2;
      uint32_t keys = UINT32_MAX;
      if (last_keys_.count == pairs) {
        const uint32_t* last = children_.run(last_keys_.start, pairs);
        size_t i = 0;
        if (last != nullptr) {
          while (i < pairs && last[i] == children[2 * i].bits()) ++i;
        } else {
          while (i < pairs && children_[size_t{last_keys_.start} + i] == children[2 * i].bits()) ++i;
        }
        if (i == pairs) keys = last_keys_.start;
      }
      if (keys == UINT32_MAX) {
        scratch_.clear();
        for (size_t i = 0; i < count; i += 2) scratch_.push_back(children[i]);
        keys = store_run(scratch_.data(), pairs, true);
        last_keys_ = Run{keys, static_cast<uint32_t>(pairs)};
      }
      c.start = static_cast<uint32_t>(children_.size());
      for (size_t i = 1; i < count; i += 2) children_.push_back(children[i].bits());
      c.chunks = keys;
      c.size = static_cast<uint32_t>(count);
      c.form = Form::kSplit;
      return;
    }
    if (split) unsplit(c);
  }
  const bool shareable = c.kind == ValueKind::kList || c.kind == ValueKind::kTuple;
  link_run(c, store_run(children, count, shareable), static_cast<uint32_t>(count));
}

void ValueStore::append_taken(ValueRef list, size_t count, int height) {
  if (tag_of(list) != kTagContainer) throw NotInStore("ValueStore: taken items added to a value that is no list");
  Container& c = containers_[payload_of(list)];
  if (c.kind != ValueKind::kList || (c.form != Form::kTaken && (c.size != 0 || c.chunks != kNoChunk))) {
    throw NotInStore("ValueStore: taken items added to a list of stored items");
  }
  if (size_t{c.size} + count >= UINT32_MAX) throw std::length_error("pickle holds more than 2^32 container items");
  c.form = Form::kTaken;
  c.size += static_cast<uint32_t>(count);
  if (count > 0 && height + 1 > c.height) c.height = static_cast<uint16_t>(std::min<int>(height + 1, kMaxHeight));
}

ValueRef ValueStore::share_list(ValueRef list, size_t children_before) {
  if (tag_of(list) != kTagContainer) return list;
  const Container& c = containers_[payload_of(list)];
  if (c.kind != ValueKind::kList || c.form != Form::kRuns || c.chunks != kNoChunk || c.size < kMinSharedRun) {
    return list;
  }
  if (shared_lists_.empty()) shared_lists_.assign(size_t{1} << kSharedListBits, 0);
  const uint64_t key = uint64_t{c.start} << 32 | c.size;
  uint32_t& slot = shared_lists_[(key * 0x9E3779B97F4A7C15ull) >> (64 - kSharedListBits)];
  // `list` can go when nothing else can refer to it: it is the container
  // made last, its run predates it (so the run cannot hold it), and no child
  // stored since it was made is it.
  bool can_go = payload_of(list) + size_t{1} == containers_.size() && size_t{c.start} + c.size <= children_before;
  for (size_t i = children_before; can_go && i < children_.size(); ++i) can_go = children_[i] != list.bits();
  if (slot != 0 && slot - 1 != payload_of(list) && can_go) {
    Container& other = containers_[slot - 1];
    if (other.kind == ValueKind::kList && (other.form == Form::kRuns || other.form == Form::kShared) &&
        other.chunks == kNoChunk && other.start == c.start && other.size == c.size && containers_.pop_back()) {
      other.form = Form::kShared;
      return make_ref(kTagContainer, slot - 1);
    }
  }
  slot = payload_of(list) + 1;  // the list to share the next time this run comes
  return list;
}

bool ValueStore::is_taken(ValueRef value) const {
  return tag_of(value) == kTagContainer && containers_[payload_of(value)].form == Form::kTaken;
}

void ValueStore::taken_items_read() { throw NotInStore("ValueStore: the items of a list of taken items read"); }

uint32_t ValueStore::index_of(ValueRef value) const {
  if (tag_of(value) != kTagContainer) throw std::logic_error("ValueStore: not a container");
  return payload_of(value);
}

ValueKind ValueStore::kind(ValueRef value) const {
  switch (tag_of(value)) {
    case kTagSpecial: {
      const uint32_t p = payload_of(value);
      return p == 0 ? ValueKind::kNone : p == 3 ? ValueKind::kHugeInt : ValueKind::kBool;
    }
    case kTagSmallInt:
    case kTagInt:
      return ValueKind::kInt;
    case kTagFloat:
      return ValueKind::kFloat;
    case kTagText:
      return texts_[payload_of(value)].is_bytes ? ValueKind::kBytes : ValueKind::kString;
    case kTagContainer:
      return containers_[payload_of(value)].kind;
    case kTagTransient:
      return ValueKind::kInt;
    default:
      return ValueKind::kNone;
  }
}

bool ValueStore::is_container(ValueRef value) const { return tag_of(value) == kTagContainer; }

bool ValueStore::as_bool(ValueRef value) const { return value == make_bool(true); }

int64_t ValueStore::as_int(ValueRef value) const {
  switch (tag_of(value)) {
    case kTagSmallInt: {
      // Sign-extend the 29-bit payload.
      const int32_t raw = static_cast<int32_t>(value.bits()) >> kTagBits;
      return raw;
    }
    case kTagInt:
      return ints_[payload_of(value)];
    case kTagTransient:
      return transients_[payload_of(value)];
    case kTagSpecial:
      return payload_of(value) == 2 ? 1 : 0;
    default:
      return 0;
  }
}

double ValueStore::as_float(ValueRef value) const {
  if (tag_of(value) == kTagFloat) return floats_[payload_of(value)];
  return static_cast<double>(as_int(value));
}

std::string_view ValueStore::as_text(ValueRef value) const {
  if (tag_of(value) != kTagText) return {};
  const Text& t = texts_[payload_of(value)];
  return std::string_view(t.data, t.size);
}

size_t ValueStore::size(ValueRef container) const {
  if (tag_of(container) != kTagContainer) return 0;
  const Container& c = containers_[payload_of(container)];
  return c.kind == ValueKind::kDict ? c.size / 2 : c.size;
}

bool ValueStore::find(ValueRef dict, std::string_view key, ValueRef* value) const {
  if (kind(dict) != ValueKind::kDict) return false;
  bool found = false;
  for_each_pair(dict, [&](ValueRef k, ValueRef v) {
    if (!found && tag_of(k) == kTagText && as_text(k) == key) {
      *value = v;
      found = true;
    }
  });
  return found;
}

void ValueStore::gather(const Container& c, std::vector<uint32_t>* out) const {
  out->clear();
  out->reserve(c.size);
  if (c.form == Form::kSplit) {
    for (size_t i = 0; i < c.size / 2; ++i) {
      out->push_back(children_[size_t{c.chunks} + i]);
      out->push_back(children_[size_t{c.start} + i]);
    }
    return;
  }
  auto add = [out](ValueRef v) { out->push_back(v.bits()); };
  if (c.chunks == kNoChunk) {
    for_each_in_run(c.start, c.size, add);
    return;
  }
  for (uint32_t chunk = c.chunks; chunk != kNoChunk; chunk = chunks_[chunk].next) {
    for_each_in_run(chunks_[chunk].start, chunks_[chunk].count, add);
  }
}

bool ValueStore::items_key(ValueRef container, uint64_t* key) const {
  if (tag_of(container) != kTagContainer) return false;
  const Container& c = containers_[payload_of(container)];
  if (c.form == Form::kTaken) taken_items_read();
  if (c.chunks != kNoChunk || c.form == Form::kSplit) return false;
  *key = c.size == 0 ? 0 : (uint64_t{c.start} << 32 | c.size);
  return true;
}

size_t ValueStore::bytes() const {
  return ints_.bytes() + floats_.bytes() + texts_.bytes() + text_blocks_.size() * kTextBlock + containers_.bytes() +
         chunks_.bytes() + children_.bytes() + run_slots_ * sizeof(Run);
}

}  // namespace oomtune::diagnose
