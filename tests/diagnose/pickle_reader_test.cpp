#include "diagnose/pickle_reader.h"

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "support/scratch_path.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

using std::string_literals::operator""s;

std::string error_of(const std::string& bytes) {
  try {
    read_pickle_bytes(bytes, "t.pickle");
  } catch (const SnapshotError& e) {
    return e.what();
  }
  return "(no error)";
}

ValueRef at(const ValueStore& s, ValueRef dict, const char* key) {
  ValueRef v;
  EXPECT_TRUE(s.find(dict, key, &v)) << key;
  return v;
}

std::vector<ValueRef> items(const ValueStore& s, ValueRef list) {
  std::vector<ValueRef> out;
  s.for_each_item(list, [&](ValueRef v) { out.push_back(v); });
  return out;
}

// pickle.dumps({'a': 1, 'b': ([-1, 2**32, -2**40, 1.5, True, False, None, b'xy', 70000], 'a'),
//               'c': {3, 4}, 'd': frozenset([5])}, protocol=4) by CPython 3.11.
const std::string kProtocol4 =
    "\x80\x04\x95\x56\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x01\x61\x94\x4b\x01\x8c\x01\x62\x94\x5d\x94\x28"
    "\x4a\xff\xff\xff\xff\x8a\x05\x00\x00\x00\x00\x01\x8a\x06\x00\x00\x00\x00\x00\xff\x47\x3f\xf8\x00\x00\x00\x00"
    "\x00\x00\x88\x89\x4e\x43\x02\x78\x79\x94\x4a\x70\x11\x01\x00\x65\x68\x01\x86\x94\x8c\x01\x63\x94\x8f\x94\x28"
    "\x4b\x03\x4b\x04\x90\x8c\x01\x64\x94\x28\x4b\x05\x91\x94\x75\x2e"s;

TEST(PickleReader, ReadsEveryDataOpcodeOfProtocol4) {
  const PickleDocument doc = read_pickle_bytes(kProtocol4);
  const ValueStore& s = doc.store;
  EXPECT_EQ(doc.protocol, 4);
  EXPECT_EQ(doc.bytes_read, 97);
  ASSERT_EQ(s.kind(doc.root), ValueKind::kDict);
  EXPECT_EQ(s.size(doc.root), 4u);
  EXPECT_EQ(s.as_int(at(s, doc.root, "a")), 1);
  const ValueRef b = at(s, doc.root, "b");
  ASSERT_EQ(s.kind(b), ValueKind::kTuple);
  const auto tuple = items(s, b);
  ASSERT_EQ(tuple.size(), 2u);
  EXPECT_EQ(s.as_text(tuple[1]), "a");
  const auto list = items(s, tuple[0]);
  ASSERT_EQ(list.size(), 9u);
  EXPECT_EQ(s.as_int(list[0]), -1);
  EXPECT_EQ(s.as_int(list[1]), int64_t{1} << 32);
  EXPECT_EQ(s.as_int(list[2]), -(int64_t{1} << 40));
  EXPECT_DOUBLE_EQ(s.as_float(list[3]), 1.5);
  EXPECT_EQ(s.kind(list[4]), ValueKind::kBool);
  EXPECT_TRUE(s.as_bool(list[4]));
  EXPECT_FALSE(s.as_bool(list[5]));
  EXPECT_EQ(s.kind(list[6]), ValueKind::kNone);
  EXPECT_EQ(s.kind(list[7]), ValueKind::kBytes);
  EXPECT_EQ(s.as_text(list[7]), "xy");
  EXPECT_EQ(s.as_int(list[8]), 70000);
  // The set and the frozenset are read as lists.
  const auto set = items(s, at(s, doc.root, "c"));
  ASSERT_EQ(set.size(), 2u);
  EXPECT_EQ(s.as_int(set[0]) + s.as_int(set[1]), 7);
  EXPECT_EQ(s.as_int(items(s, at(s, doc.root, "d"))[0]), 5);
  // The memoized 'a' key is the same value as the tuple's second item.
  ValueRef key_a;
  s.for_each_pair(doc.root, [&](ValueRef k, ValueRef) {
    if (s.as_text(k) == "a") key_a = k;
  });
  EXPECT_EQ(key_a, tuple[1]);
}

TEST(PickleReader, Protocol5IsReadLikeProtocol4) {
  std::string p5 = kProtocol4;
  p5[1] = '\x05';
  const PickleDocument doc = read_pickle_bytes(p5);
  EXPECT_EQ(doc.protocol, 5);
  EXPECT_EQ(doc.store.size(doc.root), 4u);
}

TEST(PickleReader, ReadsProtocol2AndProtocol0) {
  // pickle.dumps({'a': 1, 'b': ([-1, 2**32, 1.5, True, None, 300], 'a')}, protocol=2)
  const std::string p2 =
      "\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x4b\x01\x58\x01\x00\x00\x00\x62\x71\x02\x5d\x71\x03"
      "\x28\x4a\xff\xff\xff\xff\x8a\x05\x00\x00\x00\x00\x01\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x88\x4e\x4d\x2c\x01"
      "\x65\x68\x01\x86\x71\x04\x75\x2e"s;
  const PickleDocument doc = read_pickle_bytes(p2);
  const ValueStore& s = doc.store;
  const auto list = items(s, items(s, at(s, doc.root, "b"))[0]);
  ASSERT_EQ(list.size(), 6u);
  EXPECT_EQ(s.as_int(list[1]), int64_t{1} << 32);
  EXPECT_EQ(s.as_int(list[5]), 300);
  // Protocol 0 integers, floats and memo (its V strings are refused, see below).
  const PickleDocument p0 = read_pickle_bytes("(lp0\nI-1\naL4294967296L\naF1.5\naI01\nag0\na."s);
  const auto l0 = items(p0.store, p0.root);
  ASSERT_EQ(l0.size(), 5u);
  EXPECT_EQ(p0.store.as_int(l0[0]), -1);
  EXPECT_EQ(p0.store.as_int(l0[1]), int64_t{1} << 32);
  EXPECT_DOUBLE_EQ(p0.store.as_float(l0[2]), 1.5);
  EXPECT_TRUE(p0.store.as_bool(l0[3]));
  EXPECT_EQ(l0[4], p0.root);  // the list contains itself through the memo
}

TEST(PickleReader, RefusesGlobalOsSystemWithoutRunningIt) {
  const std::string marker = "/tmp/oomtune_test_pwned_marker";
  std::remove(marker.c_str());
  const std::string cmd = "touch " + marker;
  std::string bytes =
      "\x80\x02"
      "cos\nsystem\nX"s;
  const uint32_t n = static_cast<uint32_t>(cmd.size());
  bytes += std::string(reinterpret_cast<const char*>(&n), 4) + cmd + "\x85R."s;
  const std::string error = error_of(bytes);
  EXPECT_NE(error.find("t.pickle: pickle: opcode GLOBAL (0x63) at byte 2 refused"), std::string::npos) << error;
  EXPECT_NE(error.find("'os.system'"), std::string::npos) << error;
  EXPECT_FALSE(testing::exists(marker));
}

TEST(PickleReader, RefusesEveryCodeOpcodeWithItsOffset) {
  struct Case {
    std::string bytes;
    const char* expected;
  };
  const Case cases[] = {
      {"\x80\x02N)R."s, "opcode REDUCE (0x52) at byte 4 refused"},
      {"\x80\x04\x8c\x02os\x8c\x06system\x93."s, "opcode STACK_GLOBAL (0x93) at byte 14 refused"},
      {"\x80\x02}Nb."s, "opcode BUILD (0x62) at byte 4 refused"},
      {"\x80\x02N)\x81."s, "opcode NEWOBJ (0x81) at byte 4 refused"},
      {"\x80\x04N)}\x92."s, "opcode NEWOBJ_EX (0x92) at byte 5 refused"},
      {"\x80\x02Pid\n."s, "opcode PERSID (0x50) at byte 2 refused"},
      {"\x80\x02NQ."s, "opcode BINPERSID (0x51) at byte 3 refused"},
      {"\x80\x02(ios\nsystem\n."s, "opcode INST (0x69) at byte 3 refused"},
      {"\x80\x02(No."s, "opcode OBJ (0x6f) at byte 4 refused"},
      {"\x80\x02\x82\x01."s, "opcode EXT1 (0x82) at byte 2 refused"},
      {"\x80\x05\x97."s, "opcode NEXT_BUFFER (0x97) at byte 2 refused"},
      {"\x80\x02\xff."s, "unknown opcode 0xff at byte 2"},
  };
  for (const Case& c : cases) {
    const std::string error = error_of(c.bytes);
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
}

TEST(PickleReader, BrokenInputsGiveClearErrors) {
  // A real snapshot cut in half.
  const std::string path = testing::real_fixture("oom_gpt_activations.pickle");
  SKIP_IF_MISSING(path);
  const std::string whole = testing::read_all(path);
  const std::string half = whole.substr(0, whole.size() / 2);
  EXPECT_NE(error_of(half).find("t.pickle: pickle: truncated: FRAME at byte 2 announces 49743 bytes but only"),
            std::string::npos)
      << error_of(half);
  // Without frames the opcodes themselves run out.
  EXPECT_EQ(error_of("\x80\x02J\x01\x02"s),
            "t.pickle: pickle: truncated: the input ends at byte 5 while BININT needed 2 more bytes");
  EXPECT_EQ(error_of("\x80\x02X\x05\x00\x00\x00"
                     "ab"s),
            "t.pickle: pickle: BINUNICODE at byte 2 declares a length of 5 bytes but only 2 bytes remain");
  EXPECT_NE(error_of("\x80\x02h\x05."s).find("BINGET at byte 2 refers to memo entry 5, which was never stored"),
            std::string::npos);
  const std::string huge = "\x80\x04\x8d"s + "\x00\x00\x00\x00\x00\x00\x00\x10"s + "abc."s;  // 2^60 bytes
  EXPECT_NE(error_of(huge).find("declares a length of 1152921504606846976 bytes but only 4 bytes remain"),
            std::string::npos)
      << error_of(huge);
  const std::string deep = "\x80\x02"s + std::string(2000, ']') + std::string(1999, 'a') + ".";
  EXPECT_NE(error_of(deep).find("nested deeper than 256 levels"), std::string::npos) << error_of(deep);
  EXPECT_NE(error_of("\x80\x02(((((((((("s).find("truncated"), std::string::npos);
  EXPECT_NE(error_of("\x80\x02."s).find("STOP at byte 2: stack underflow"), std::string::npos);
  EXPECT_NE(error_of("\x80\x02K\x01u."s).find("SETITEMS at byte 4: no MARK to close"), std::string::npos);
  EXPECT_NE(error_of("\x80\x02]K\x01K\x02s."s).find("target is a list, not a dict"), std::string::npos);
  EXPECT_NE(error_of("\x80\x02S'x'\n."s).find("protocol-0 quoted strings are not supported"), std::string::npos);
  EXPECT_NE(error_of("\x80\x06N."s).find("protocol 6 is newer than 5"), std::string::npos);
}

TEST(PickleReader, IntegersPastSixtyFourBitsAreKeptAsHuge) {
  // LONG1 of 9 bytes: 2^64 (does not fit) and -1 with sign padding (fits).
  const PickleDocument doc = read_pickle_bytes(
      "\x80\x02(\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff\x8a\x00l."s);
  const auto v = items(doc.store, doc.root);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(doc.store.kind(v[0]), ValueKind::kHugeInt);
  EXPECT_EQ(doc.store.as_int(v[1]), -1);
  EXPECT_EQ(doc.store.as_int(v[2]), 0);
}

TEST(PickleReader, ReadsTheRealSnapshotsFromFiles) {
  const std::string path = testing::real_fixture("oom_fragmentation.pickle");
  SKIP_IF_MISSING(path);
  const PickleDocument doc = read_pickle_file(path);
  EXPECT_EQ(doc.protocol, 4);
  EXPECT_EQ(doc.bytes_read, 116465);  // the whole file, STOP last
  ValueRef segments;
  ASSERT_TRUE(doc.store.find(doc.root, "segments", &segments));
  EXPECT_EQ(doc.store.size(segments), 203u);
}

TEST(PickleReader, RunsOfMemoFetchesReadAcrossTheFileBuffer) {
  // BINGET / LONG_BINGET runs are read in place from the 1 MiB buffer: a run
  // longer than the buffer, with an argument cut by its end somewhere.
  std::string bytes = "\x80\x02]q\x00("s;
  const int kGets = 400001;
  for (int i = 0; i < kGets; ++i) bytes += i % 3 == 0 ? "j\x00\x00\x00\x00"s : "h\x00"s;
  bytes += "e.";
  ASSERT_GT(bytes.size(), size_t{1} << 20);
  const std::string path = oomtune::testing::scratch_path("memo_runs.pickle").string();
  {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
    ASSERT_TRUE(f);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f.get()), bytes.size());
  }
  const PickleDocument doc = read_pickle_file(path);
  std::remove(path.c_str());
  const auto list = items(doc.store, doc.root);
  ASSERT_EQ(list.size(), static_cast<size_t>(kGets));
  for (const ValueRef v : list) ASSERT_EQ(v, doc.root);
  // A bad index inside a run names its own opcode and offset.
  EXPECT_EQ(error_of("\x80\x02Nq\x00h\x00h\x00j\x00\x00\x00\x00h\x05."s),
            "t.pickle: pickle: BINGET at byte 14 refers to memo entry 5, which was never stored");
  EXPECT_EQ(error_of("\x80\x02Nq\x00h\x00j\x07\x00\x00\x00h\x00."s),
            "t.pickle: pickle: LONG_BINGET at byte 7 refers to memo entry 7, which was never stored");
  EXPECT_EQ(error_of("\x80\x02Nq\x00h\x00j\x00\x00"s),
            "t.pickle: pickle: truncated: the input ends at byte 10 while LONG_BINGET needed 2 more bytes");
}

// A file is read ahead in 1 MiB chunks, four buffers taking turns: a file
// of seven chunks, with strings cut by chunk ends and one string longer than
// two chunks, reads as the same bytes in memory do; cut short, it gives the
// same error at the same offset.
TEST(PickleReader, AFileOfManyChunksReadsAsItsBytes) {
  std::string bytes = "\x80\x04](";
  const int kStrings = 400000;
  for (int i = 0; i < kStrings; ++i) {
    const std::string text = "value-" + std::to_string(i);
    bytes += '\x8c';  // SHORT_BINUNICODE
    bytes += static_cast<char>(text.size());
    bytes += text;
  }
  const std::string long_text(size_t{5} << 19, 'x');  // 2.5 MiB
  const auto length = static_cast<uint32_t>(long_text.size());
  bytes += 'X';  // BINUNICODE, a 4-byte little-endian length
  for (int shift = 0; shift < 32; shift += 8) bytes += static_cast<char>((length >> shift) & 0xFF);
  bytes += long_text;
  bytes += "e.";
  ASSERT_GT(bytes.size(), size_t{6} << 20);
  auto write = [](const std::string& name, std::string_view content) {
    const std::string path = oomtune::testing::scratch_path(name).string();
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
    EXPECT_TRUE(f);
    if (f) {
      EXPECT_EQ(std::fwrite(content.data(), 1, content.size(), f.get()), content.size());
    }
    return path;
  };
  const std::string path = write("many_chunks.pickle", bytes);
  const PickleDocument from_file = read_pickle_file(path);
  std::remove(path.c_str());
  const PickleDocument from_bytes = read_pickle_bytes(bytes);
  EXPECT_EQ(from_file.bytes_read, static_cast<int64_t>(bytes.size()));
  const auto file_items = items(from_file.store, from_file.root);
  const auto byte_items = items(from_bytes.store, from_bytes.root);
  ASSERT_EQ(file_items.size(), static_cast<size_t>(kStrings + 1));
  ASSERT_EQ(byte_items.size(), file_items.size());
  for (size_t i = 0; i < file_items.size(); ++i)
    ASSERT_EQ(from_file.store.as_text(file_items[i]), from_bytes.store.as_text(byte_items[i])) << "item " << i;
  EXPECT_EQ(from_file.store.as_text(file_items[12345]), "value-12345");
  EXPECT_EQ(from_file.store.as_text(file_items.back()), long_text);

  const std::string cut = bytes.substr(0, bytes.size() - (size_t{1} << 20));
  const std::string cut_path = write("many_chunks_cut.pickle", cut);
  std::string file_error = "(no error)", bytes_error = "(no error)";
  try {
    read_pickle_file(cut_path);
  } catch (const SnapshotError& e) {
    file_error = e.what();
  }
  std::remove(cut_path.c_str());
  try {
    read_pickle_bytes(cut, cut_path);
  } catch (const SnapshotError& e) {
    bytes_error = e.what();
  }
  EXPECT_NE(file_error, "(no error)");
  EXPECT_EQ(file_error, bytes_error);
}

TEST(PickleReader, FileErrorsNameTheFile) {
  try {
    read_pickle_file("/nonexistent/x.pickle");
    FAIL();
  } catch (const SnapshotError& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/x.pickle: cannot open: No such file or directory");
  }
}

// A folder opens like a file on Linux; it is named for what it is rather
// than read as a pickle that ends at byte 0.
TEST(PickleReader, AFolderIsNamedAsOne) {
  const std::string folder = ::testing::TempDir();
  try {
    read_pickle_file(folder);
    FAIL();
  } catch (const SnapshotError& e) {
    EXPECT_EQ(std::string(e.what()), folder + ": is a folder, not a memory snapshot");
  }
}

}  // namespace
}  // namespace oomtune::diagnose

namespace oomtune::diagnose {
namespace {

// The store shares identical list runs and keeps a dict's keys apart from
// its values (pickle_value.h); what is read back must not show it.
std::vector<std::pair<std::string, int64_t>> pairs(const ValueStore& s, ValueRef dict) {
  std::vector<std::pair<std::string, int64_t>> out;
  s.for_each_pair(dict, [&](ValueRef k, ValueRef v) { out.emplace_back(std::string(s.as_text(k)), s.as_int(v)); });
  return out;
}

std::vector<int64_t> ints(const ValueStore& s, ValueRef list) {
  std::vector<int64_t> out;
  s.for_each_item(list, [&](ValueRef v) { out.push_back(s.as_int(v)); });
  return out;
}

TEST(ValueStore, SharedListRunsReadBackAsWritten) {
  ValueStore s;
  const ValueRef a = s.make_int(1), b = s.make_int(2), c = s.make_int(3), d = s.make_int(4);
  const ValueRef ab[] = {a, b};
  const ValueRef l1 = s.make_container(ValueKind::kList);
  s.append_children(l1, ab, 2);
  const ValueRef l2 = s.make_container(ValueKind::kList);
  s.append_children(l2, ab, 2);  // shares l1's run, which ends the array
  const ValueRef t = s.make_container(ValueKind::kTuple);
  s.append_children(t, ab, 2);
  uint64_t k1 = 0, k2 = 0, kt = 0;
  ASSERT_TRUE(s.items_key(l1, &k1));
  ASSERT_TRUE(s.items_key(l2, &k2));
  ASSERT_TRUE(s.items_key(t, &kt));
  EXPECT_EQ(k1, k2);
  EXPECT_EQ(k1, kt);
  EXPECT_EQ(s.kind(t), ValueKind::kTuple);
  EXPECT_EQ(s.kind(l1), ValueKind::kList);
  // l2 grows in place past the shared run; l1 must not see it.
  s.append_children(l2, &c, 1);
  EXPECT_EQ(ints(s, l2), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ints(s, l1), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ints(s, t), (std::vector<int64_t>{1, 2}));
  // l1 grows too: its run is no longer at the end, so it takes a chunk list.
  s.append_children(l1, &d, 1);
  const ValueRef cd[] = {c, d};
  s.append_children(l1, cd, 2);
  EXPECT_EQ(ints(s, l1), (std::vector<int64_t>{1, 2, 4, 3, 4}));
  EXPECT_EQ(s.size(l1), 5u);
  EXPECT_FALSE(s.items_key(l1, &k1));
  EXPECT_EQ(ints(s, l2), (std::vector<int64_t>{1, 2, 3}));
  uint64_t empty = 1;
  ASSERT_TRUE(s.items_key(s.make_container(ValueKind::kList), &empty));
  EXPECT_EQ(empty, 0u);
  EXPECT_FALSE(s.items_key(a, &empty));
}

TEST(ValueStore, DictsKeepPairOrderAcrossBatches) {
  ValueStore s;
  const ValueRef x = s.make_string("x"), y = s.make_string("y"), z = s.make_string("z");
  const ValueRef one[] = {x, s.make_int(1), y, s.make_int(2)};
  const ValueRef two[] = {x, s.make_int(10), y, s.make_int(20)};
  const ValueRef d1 = s.make_container(ValueKind::kDict);
  s.append_children(d1, one, 4);  // keys and values apart
  const ValueRef d2 = s.make_container(ValueKind::kDict);
  s.append_children(d2, two, 4);  // same keys, stored once
  using P = std::vector<std::pair<std::string, int64_t>>;
  EXPECT_EQ(pairs(s, d1), (P{{"x", 1}, {"y", 2}}));
  EXPECT_EQ(pairs(s, d2), (P{{"x", 10}, {"y", 20}}));
  EXPECT_EQ(items(s, d1).size(), 4u);
  EXPECT_EQ(s.as_text(items(s, d1)[2]), "y");
  EXPECT_EQ(s.as_int(items(s, d1)[3]), 2);
  // A second batch (SETITEMS again, or SETITEM): pairs stay in order.
  const ValueRef more[] = {z, s.make_int(3)};
  s.append_children(d1, more, 2);
  const ValueRef again[] = {x, s.make_int(5), z, s.make_int(6)};
  s.append_children(d1, again, 4);
  EXPECT_EQ(pairs(s, d1), (P{{"x", 1}, {"y", 2}, {"z", 3}, {"x", 5}, {"z", 6}}));
  EXPECT_EQ(s.size(d1), 5u);
  ValueRef v;
  ASSERT_TRUE(s.find(d1, "x", &v));  // the first key wins, as before
  EXPECT_EQ(s.as_int(v), 1);
  ASSERT_TRUE(s.find(d1, "z", &v));
  EXPECT_EQ(s.as_int(v), 3);
  EXPECT_EQ(pairs(s, d2), (P{{"x", 10}, {"y", 20}}));
  // A one-pair dict, then more pairs.
  const ValueRef d3 = s.make_container(ValueKind::kDict);
  s.append_children(d3, more, 2);
  s.append_children(d3, one, 4);
  EXPECT_EQ(pairs(s, d3), (P{{"z", 3}, {"x", 1}, {"y", 2}}));
  // Heights still count nested containers.
  const ValueRef outer = s.make_container(ValueKind::kList);
  const ValueRef ds[] = {d1, d2};
  s.append_children(outer, ds, 2);
  EXPECT_EQ(s.height(outer), 2);
  const ValueRef nested[] = {x, outer, y, s.make_int(0)};
  const ValueRef d4 = s.make_container(ValueKind::kDict);
  s.append_children(d4, nested, 4);
  EXPECT_EQ(s.height(d4), 3);
}

TEST(ValueStore, RepeatedFramesListsAreStoredOnce) {
  // One frames list per event, as PyTorch writes them: the items are kept
  // once, the lists read back whole.
  const int kLists = 200000;
  auto fill = [&](bool same) {
    auto s = std::make_unique<ValueStore>();
    std::vector<ValueRef> frames;
    for (int i = 0; i < 16; ++i) frames.push_back(s->make_container(ValueKind::kDict));
    ValueRef last;
    for (int i = 0; i < kLists; ++i) {
      last = s->make_container(ValueKind::kList);
      if (!same) frames[0] = s->make_int(i);
      s->append_children(last, frames.data(), frames.size());
    }
    EXPECT_EQ(s->size(last), 16u);
    EXPECT_EQ(s->height(last), 2);
    return s->bytes();
  };
  EXPECT_LT(fill(true) + (size_t{8} << 20), fill(false));
}

TEST(ValueStore, PlaceholdersAndTakenItemsAreNeverReadAsStored) {
  ValueStore s;
  uint32_t id = 0;
  const ValueRef p = ValueStore::placeholder(12345);
  ASSERT_TRUE(ValueStore::is_placeholder(p, &id));
  EXPECT_EQ(id, 12345u);
  EXPECT_FALSE(ValueStore::is_placeholder(s.make_int(7), &id));
  EXPECT_FALSE(ValueStore::is_placeholder(s.make_container(ValueKind::kList), &id));
  // A placeholder is never stored as a child.
  const ValueRef list = s.make_container(ValueKind::kList);
  const ValueRef with_p[] = {s.make_int(1), p};
  EXPECT_THROW(s.append_children(list, with_p, 2), NotInStore);
  // Taken items: only their number (and height) is kept.
  const ValueRef taken = s.make_container(ValueKind::kList);
  EXPECT_FALSE(s.is_taken(taken));
  s.append_taken(taken, 3, 2);
  s.append_taken(taken, 2, 1);
  EXPECT_TRUE(s.is_taken(taken));
  EXPECT_EQ(s.kind(taken), ValueKind::kList);
  EXPECT_EQ(s.size(taken), 5u);
  EXPECT_EQ(s.height(taken), 3);
  uint64_t key = 0;
  EXPECT_THROW(s.for_each_item(taken, [](ValueRef) {}), NotInStore);
  EXPECT_THROW(s.items_key(taken, &key), NotInStore);
  EXPECT_THROW(s.append_children(taken, with_p, 1), NotInStore);
  // Taken and stored items never mix in one list; dicts take none.
  const ValueRef stored = s.make_container(ValueKind::kList);
  s.append_children(stored, with_p, 1);
  EXPECT_THROW(s.append_taken(stored, 1, 1), NotInStore);
  EXPECT_THROW(s.append_taken(s.make_container(ValueKind::kDict), 1, 1), NotInStore);
  EXPECT_FALSE(s.is_taken(stored));
  EXPECT_FALSE(s.is_taken(s.make_int(1)));
  // A list holding a taken list is an ordinary list.
  const ValueRef outer = s.make_container(ValueKind::kList);
  s.append_children(outer, &taken, 1);
  EXPECT_EQ(s.height(outer), 4);
  EXPECT_EQ(items(s, outer), std::vector<ValueRef>{taken});
}

TEST(ValueStore, TransientIntsAreStoredOnlyWhereKept) {
  ValueStore s;
  const int64_t big = int64_t{1} << 40;
  const ValueRef small = s.make_transient_int(5);
  const ValueRef t1 = s.make_transient_int(big);
  const ValueRef t2 = s.make_transient_int(big + 1);
  EXPECT_EQ(s.as_int(small), 5);
  EXPECT_EQ(s.kind(t1), ValueKind::kInt);
  EXPECT_EQ(s.as_int(t1), big);
  EXPECT_DOUBLE_EQ(s.as_float(t2), static_cast<double>(big + 1));
  EXPECT_EQ(s.bytes(), ValueStore().bytes());  // nothing stored yet
  // Stored as a child or made lasting, a transient int outlives the clear.
  const ValueRef list = s.make_container(ValueKind::kList);
  const ValueRef both[] = {t1, t2};
  s.append_children(list, both, 2);
  const ValueRef kept = s.lasting(t2);
  EXPECT_EQ(s.lasting(small), small);
  s.clear_transients();
  std::vector<int64_t> values;
  s.for_each_item(list, [&](ValueRef v) { values.push_back(s.as_int(v)); });
  EXPECT_EQ(values, (std::vector<int64_t>{big, big + 1}));
  EXPECT_EQ(s.as_int(kept), big + 1);
}

TEST(ValueStore, AListMadeLastCanStandInForAnEarlierEqualOne) {
  ValueStore s;
  const ValueRef frames[] = {s.make_container(ValueKind::kDict), s.make_container(ValueKind::kDict)};
  const ValueRef first = s.make_container(ValueKind::kList);
  s.append_children(first, frames, 2);
  EXPECT_EQ(s.share_list(first, 0), first);  // its run is new: nothing to share
  const size_t before = s.child_count();
  const ValueRef again = s.make_container(ValueKind::kList);
  s.append_children(again, frames, 2);  // the same run, stored once
  EXPECT_EQ(s.child_count(), before);
  EXPECT_EQ(s.share_list(again, before), first);
  // `again` is forgotten: the next container takes its place.
  EXPECT_EQ(s.make_container(ValueKind::kList), again);
  // The shared list reads as before, and takes no more items.
  EXPECT_EQ(items(s, first), (std::vector<ValueRef>{frames[0], frames[1]}));
  EXPECT_THROW(s.append_children(first, frames, 1), NotInStore);
  // Not shared: a list that is not the last made, or whose run is not older.
  const ValueRef third = s.make_container(ValueKind::kList);
  s.append_children(third, frames, 2);
  s.make_container(ValueKind::kDict);
  EXPECT_EQ(s.share_list(third, s.child_count()), third);
  const ValueRef fourth = s.make_container(ValueKind::kList);
  s.append_children(fourth, frames, 2);
  EXPECT_EQ(s.share_list(fourth, 0), fourth);
}

/// Claims the lists under `key` and records what it is given.
class RecordingSink : public ItemSink {
 public:
  explicit RecordingSink(std::string key) : key_(std::move(key)) {}
  bool claim(std::string_view key, ValueRef) override {
    offered.emplace_back(key);
    return key == key_;
  }
  void open_item(int64_t bytes_left) override {
    EXPECT_GT(bytes_left, 0);
    items.emplace_back();
  }
  void set_items(const ValueStore& store, size_t item, const ValueRef* pairs, size_t count) override {
    ASSERT_LT(item, items.size());
    for (size_t i = 0; i + 1 < count; i += 2) {
      items[item].emplace_back(std::string(store.as_text(pairs[i])), store.as_int(pairs[i + 1]));
    }
  }
  std::vector<std::string> offered;
  std::vector<std::vector<std::pair<std::string, int64_t>>> items;

 private:
  std::string key_;
};

TEST(PickleReader, AnItemSinkTakesTheDictsOfTheListsItClaims) {
  // {'t': [[{'a': 1, 'b': 2}, {}, {'a': 3}]], 'u': [[{'a': 4, 'b': 5}]]}
  testing::PickleWriter w;
  w.ops("}(").str("t").ops("]](}(").pair("a", 1).pair("b", 2).ops("u}}").put(0).str("a").num(3).ops("se");
  w.ops("a").str("u").ops("]](}(").pair("a", 4).pair("b", 5).ops("uea").ops("u");
  const std::string bytes = w.done();
  RecordingSink sink("t");
  const PickleDocument doc = read_pickle_bytes(bytes, "s.pickle", &sink);
  EXPECT_EQ(sink.offered, (std::vector<std::string>{"t", "u"}));
  using Pairs = std::vector<std::pair<std::string, int64_t>>;
  ASSERT_EQ(sink.items.size(), 3u);
  EXPECT_EQ(sink.items[0], (Pairs{{"a", 1}, {"b", 2}}));
  EXPECT_EQ(sink.items[1], Pairs{});
  EXPECT_EQ(sink.items[2], (Pairs{{"a", 3}}));  // a one-pair dict: SETITEM
  const ValueStore& s = doc.store;
  const ValueRef t = items(s, at(s, doc.root, "t"))[0];
  EXPECT_TRUE(s.is_taken(t));
  EXPECT_EQ(s.size(t), 3u);
  EXPECT_EQ(s.height(t), 2);
  const ValueRef u = items(s, at(s, doc.root, "u"))[0];
  EXPECT_FALSE(s.is_taken(u));
  EXPECT_EQ(pairs(s, items(s, u)[0]), (Pairs{{"a", 4}, {"b", 5}}));
  // Without a sink the same bytes read as before.
  const PickleDocument plain = read_pickle_bytes(bytes, "s.pickle");
  const auto t_items = items(plain.store, items(plain.store, at(plain.store, plain.root, "t"))[0]);
  ASSERT_EQ(t_items.size(), 3u);
  EXPECT_EQ(pairs(plain.store, t_items[2]), (Pairs{{"a", 3}}));
}

TEST(PickleReader, AStreamedDictsIntsStayReadableWhereTheyAreKept) {
  // {'t': [[{'a': 2**40, 'b': (2**40 + 1, 2**40 + 2)}]], 'v': [2**40]}: the
  // dict's ints are transient, but the memo and the tuple keep theirs.
  const int64_t big = int64_t{1} << 40;
  testing::PickleWriter w;
  w.ops("}(").str("t").ops("]](}(").str("a").num(big).put(5).str("b").num(big + 1).num(big + 2).ops("\x86");
  w.put(6).ops("uea").str("v").ops("](").get(5).ops("e").str("w").get(6).ops("u");
  RecordingSink sink("t");
  const PickleDocument doc = read_pickle_bytes(w.done(), "s.pickle", &sink);
  ASSERT_EQ(sink.items.size(), 1u);
  ASSERT_EQ(sink.items[0].size(), 2u);
  EXPECT_EQ(sink.items[0][0], (std::pair<std::string, int64_t>{"a", big}));
  const ValueStore& s = doc.store;
  EXPECT_EQ(s.as_int(items(s, at(s, doc.root, "v"))[0]), big);
  const auto tuple = items(s, at(s, doc.root, "w"));
  ASSERT_EQ(tuple.size(), 2u);
  EXPECT_EQ(s.as_int(tuple[0]), big + 1);
  EXPECT_EQ(s.as_int(tuple[1]), big + 2);
}

TEST(PickleReader, AnItemSinkIsAbandonedWhenItsDictsAreUsedOtherwise) {
  using W = testing::PickleWriter;
  auto head = [] {  // {'t': [[{  (the dict streams)
    W w;
    w.ops("}(").str("t").ops("]](}");
    return w;
  };
  struct Case {
    const char* what;
    W pickle;
  };
  const Case cases[] = {
      {"also stored under another key",
       head().put(0).ops("(").pair("a", 1).ops("uea").str("v").ops("](").get(0).ops("eu")},
      {"appended twice", head().ops("2eau")},
      {"dropped", head().ops("0}eau")},
      {"filled twice", head().ops("(").pair("a", 1).ops("u(").pair("b", 2).ops("ueau")},
      {"inside itself", head().put(0).ops("(").str("a").get(0).ops("ueau")},
      {"a key of a stored dict", head().num(1).ops("deau")},
      {"never appended, the next list claimed", W().ops("}(").str("t").ops("](](}0e](}eeu")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    RecordingSink sink("t");
    EXPECT_THROW(read_pickle_bytes(c.pickle.done(), "s.pickle", &sink), SinkAbandoned);
  }
}

TEST(PickleReader, EqualShortTextsAreStoredOnce) {
  // PyTorch 2.11 gives each trace event a str of its own for compile_context
  // ("N/A"), written out in full each time. Texts that differ in a byte, in
  // length (a trailing NUL) or in kind (str or bytes) stay apart.
  const std::vector<std::pair<std::string, bool>> texts = {
      {"N/A", false},     {"N/B", false},     {"N/A", true},      {std::string("N/A\0", 4), false},
      {"", false},        {"abcdefg", false}, {"abcdefh", false}, {"abcdefgh", false},
      {"abcdefgh", false}};
  auto list_of = [&](int repeats) {
    std::string body = "](";
    for (int r = 0; r < repeats; ++r) {
      for (const auto& [text, is_bytes] : texts) {
        body += is_bytes ? 'C' : '\x8c';  // SHORT_BINBYTES / SHORT_BINUNICODE
        body += static_cast<char>(text.size());
        body += text;
        body += '\x94';  // MEMOIZE: each its own entry, as pickle writes distinct objects
      }
    }
    return "\x80\x04" + body + "e.";
  };
  auto read = [&](int repeats) {
    PickleDocument doc = read_pickle_bytes(list_of(repeats));
    const std::vector<ValueRef> got = items(doc.store, doc.root);
    EXPECT_EQ(got.size(), texts.size() * repeats);
    for (size_t i = 0; i < got.size(); ++i) {
      const auto& [text, is_bytes] = texts[i % texts.size()];
      EXPECT_EQ(doc.store.kind(got[i]), is_bytes ? ValueKind::kBytes : ValueKind::kString) << i;
      EXPECT_EQ(doc.store.as_text(got[i]), text) << i;
    }
    return doc.store.bytes();
  };
  // 100000 repeats cost the list's children and the memo, not 900000 texts
  // (16 bytes of table each: 14 MB).
  EXPECT_LT(read(100000), read(1) + (size_t{8} << 20));
}

TEST(PickleReader, EmptyStringsFirst) {
  // Found by the fuzzer: an empty string before any other text.
  const PickleDocument doc = read_pickle_bytes(std::string("\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x00.", 12));
  EXPECT_EQ(doc.store.kind(doc.root), ValueKind::kString);
  EXPECT_EQ(doc.store.as_text(doc.root), "");
}

}  // namespace
}  // namespace oomtune::diagnose
