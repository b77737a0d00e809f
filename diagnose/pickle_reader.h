#pragma once
// A pickle reader that never executes anything.
//
// Rules (what is read, what is refused):
//   - Read: the opcodes that build plain data in protocols 0–5 (CPython
//     Lib/pickletools.py): PROTO, FRAME, STOP, MARK, POP, POP_MARK, DUP;
//     EMPTY_DICT/LIST/TUPLE, DICT, LIST, TUPLE, TUPLE1–3, EMPTY_SET,
//     ADDITEMS, FROZENSET (sets are read as lists); SETITEM(S), APPEND(S);
//     INT, BININT, BININT1, BININT2, LONG, LONG1, LONG4; FLOAT, BINFLOAT;
//     BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, BINSTRING, SHORT_BINSTRING,
//     BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8; NONE, NEWTRUE,
//     NEWFALSE; MEMOIZE, PUT, BINPUT, LONG_BINPUT, GET, BINGET, LONG_BINGET.
//   - Refused, with the opcode's name and byte offset: everything that can
//     import or call Python code or reach outside the stream — GLOBAL,
//     STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID,
//     BINPERSID, EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER — and unknown bytes.
//     Nothing is ever looked up or called: refusing is the only behaviour.
//   - Limits: a length past the end of the input, a GET of a memo entry
//     never stored, a stack underflow, more than kMaxDepth nested containers
//     and integers over 64 bits used as lengths are errors, never crashes
//     or huge allocations. Memory grows with what the file really holds.
//   - Streaming: a file is read in 1 MiB chunks, up to three ahead of the
//     parser on a thread of their own (no mmap, no second copy of the
//     file), straight into a compact ValueStore; the items of chosen lists
//     can go to an ItemSink instead (below).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "diagnose/pickle_value.h"

namespace oomtune::diagnose {

/// Containers nested deeper than this are refused (Python's own unpickler
/// recurses only in repr; real snapshots nest 6 levels).
constexpr int kMaxPickleDepth = 256;

/// The result of reading one pickle: its values and the top-level one.
struct PickleDocument {
  ValueStore store;
  ValueRef root;
  int protocol = 0;        ///< from PROTO; 0 when the stream had none
  int64_t bytes_read = 0;  ///< bytes consumed up to and including STOP
};

/// Thrown by read_pickle_* when reading into an ItemSink had to stop: read
/// the input again without a sink (that read says what is wrong, if
/// anything).
class SinkAbandoned : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Takes the items of chosen lists while a pickle is read, so that the
/// ValueStore never holds them. A trace of 10^7 event dicts costs ~60 bytes
/// an event in the store, and the snapshot model then copies it into 32-byte
/// records: a sink makes each record as its dict is read.
///
/// Which lists: while the top-level dict is being filled (the stack is that
/// dict, MARK, key, value, key, ...), a list opened by EMPTY_LIST as an item
/// of the list under a key is offered to claim(). Dicts then opened by
/// EMPTY_DICT inside an APPENDS batch of the claimed list are not made in
/// the store: the reader pushes a placeholder (ValueStore::placeholder),
/// hands the dict's pairs to set_items() (one SETITEM or SETITEMS, before
/// the next item is opened) and records the list's items as taken
/// (ValueStore::append_taken). Anything else done with such a dict (stored
/// in another container, appended twice or out of order or never, filled
/// twice, the pickle's result) throws SinkAbandoned, as does a sink that
/// cannot take an item; so does an earlier claimed list still missing items
/// when the next one is claimed. The pickle is never read differently: what
/// the sink is not given, the store holds as before.
class ItemSink {
 public:
  virtual ~ItemSink() = default;
  /// An empty list `list` is opened as an item of the list under `key` in
  /// the top-level dict. True claims it (its dict items come here).
  virtual bool claim(std::string_view key, ValueRef list) = 0;
  /// The next item of the list claimed last is a dict (item 0, 1, ...);
  /// `bytes_left` of the input remain after it (for reserving room).
  virtual void open_item(int64_t bytes_left) = 0;
  /// The key/value pairs (`count` refs: key, value, ...; no placeholder
  /// among them) of item `item` of the list claimed last, at most once an
  /// item. Throws SinkAbandoned when it cannot take them.
  virtual void set_items(const ValueStore& store, size_t item, const ValueRef* pairs, size_t count) = 0;
};

/// Reads the pickle in `path`. Throws SnapshotError "PATH: is a folder, not a
/// memory snapshot", "PATH: cannot open: REASON", and "PATH: pickle: ..." for
/// an empty file, a refused opcode ("opcode GLOBAL (0x63) at byte 2
/// refused: it would import Python code 'os system'"), truncation, a bad
/// memo index, an absurd length or too deep nesting. With a `sink`, may
/// throw SinkAbandoned (see ItemSink).
PickleDocument read_pickle_file(const std::string& path, ItemSink* sink = nullptr);

/// Same, from bytes in memory; `name` prefixes error messages.
PickleDocument read_pickle_bytes(std::string_view bytes, const std::string& name = "<bytes>", ItemSink* sink = nullptr);

}  // namespace oomtune::diagnose
