#include "diagnose/snapshot.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "diagnose/pickle_reader.h"
#include "snapshot_dump.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

using std::string_literals::operator""s;

std::string load_error(const std::string& path) {
  try {
    load_snapshot(path);
  } catch (const SnapshotError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Snapshot, RealFixtureHasItsRecordedShape) {
  const std::string path = testing::real_fixture("oom_fragmentation.pickle");
  SKIP_IF_MISSING(path);
  const Snapshot s = load_snapshot(path);
  EXPECT_EQ(s.layout, SnapshotLayout::kV2_5);
  ASSERT_EQ(s.segments.size(), 203u);
  ASSERT_EQ(s.device_traces.size(), 1u);
  EXPECT_EQ(s.device_traces[0].size(), 1025u);
  // The first segment, as pickle.load shows it.
  const Segment& seg = s.segments[0];
  EXPECT_EQ(seg.address, 139606536224768);
  EXPECT_EQ(seg.total_size, 20971520);
  EXPECT_EQ(seg.allocated_size, 9961472);
  EXPECT_TRUE(seg.is_large);
  ASSERT_EQ(seg.blocks.size(), 2u);
  EXPECT_EQ(seg.blocks[1].address, 139606546186240);
  EXPECT_EQ(seg.blocks[1].size, 11010048);
  EXPECT_EQ(seg.blocks[1].requested_size, 9961472);
  EXPECT_EQ(seg.blocks[1].state, BlockState::kInactive);
  const auto& frames = s.stack(seg.blocks[0].frames);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(s.frames[frames[0]].name, "scenario_snap_fragmentation");
  EXPECT_EQ(s.frames[frames[0]].line, 194);
  // The last event is the 512 MiB oom; device_free lands in addr.
  const TraceEvent& oom = s.device_traces[0].back();
  EXPECT_EQ(oom.action, TraceAction::kOom);
  EXPECT_EQ(oom.size, 536870912);
  EXPECT_EQ(oom.addr, 80207872000);
  EXPECT_EQ(oom.time_us, 1795411784246799);
  EXPECT_TRUE(s.allocator_settings.present);
  EXPECT_FALSE(s.allocator_settings.expandable_segments);
  EXPECT_EQ(s.allocator_settings.max_split_size, -1);
}

TEST(Snapshot, EveryLayoutReadsToTheSameState) {
  const std::string reference_path = testing::synthetic_fixture("layout_v2_11.pickle");
  SKIP_IF_MISSING(reference_path);
  const Snapshot reference = load_snapshot(reference_path);
  struct Case {
    const char* file;
    SnapshotLayout layout;
    bool has_trace;
    bool has_times;
  };
  const Case cases[] = {
      {"layout_v1_13.pickle", SnapshotLayout::kV1_13, false, false},
      {"layout_v2_0.pickle", SnapshotLayout::kV2_0, true, false},
      {"layout_v2_1.pickle", SnapshotLayout::kV2_1, true, false},
      {"layout_v2_2.pickle", SnapshotLayout::kV2_2, true, true},
      {"layout_v2_4.pickle", SnapshotLayout::kV2_4, true, true},
      {"layout_v2_11_protocol5.pickle", SnapshotLayout::kV2_5, true, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    const Snapshot s = load_snapshot(testing::synthetic_fixture(c.file));
    EXPECT_EQ(s.layout, c.layout);
    ASSERT_EQ(s.segments.size(), reference.segments.size());
    for (size_t i = 0; i < s.segments.size(); ++i) {
      ASSERT_EQ(s.segments[i].blocks.size(), reference.segments[i].blocks.size());
      for (size_t j = 0; j < s.segments[i].blocks.size(); ++j) {
        const Block& a = s.segments[i].blocks[j];
        const Block& b = reference.segments[i].blocks[j];
        EXPECT_EQ(a.address, b.address);  // 1.13/2.0: rebuilt from the sizes before it
        EXPECT_EQ(a.size, b.size);
        EXPECT_EQ(a.state, b.state);
        if (a.state == BlockState::kActiveAllocated) {
          EXPECT_EQ(a.requested_size, b.requested_size);
        }
      }
    }
    if (!c.has_trace) {
      EXPECT_TRUE(s.device_traces.empty());
      continue;
    }
    ASSERT_EQ(s.device_traces[0].size(), reference.device_traces[0].size());
    const TraceEvent& oom = s.device_traces[0].back();
    EXPECT_EQ(oom.action, TraceAction::kOom);
    EXPECT_EQ(oom.size, 64 << 20);
    EXPECT_EQ(oom.addr, int64_t{70} << 30);  // device_free
    EXPECT_EQ(oom.time_us != 0, c.has_times);
  }
}

TEST(Snapshot, WrongTypesNameTheirPath) {
  const std::string path = testing::synthetic_fixture("bad_type.pickle");
  SKIP_IF_MISSING(path);
  EXPECT_EQ(load_error(path), path + ": segments[1].blocks[0].size: expected int, got str");
  const PickleDocument list_of_ints = read_pickle_bytes(
      "\x80\x02]K\x01"
      "a."s);
  try {
    snapshot_from_pickle(list_of_ints.store, list_of_ints.root, "x.pickle");
    FAIL();
  } catch (const SnapshotError& e) {
    EXPECT_EQ(std::string(e.what()), "x.pickle: <segments>[0]: expected dict, got int");
  }
  const PickleDocument no_segments = read_pickle_bytes("\x80\x02}."s);
  try {
    snapshot_from_pickle(no_segments.store, no_segments.root, "y.pickle");
    FAIL();
  } catch (const SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("y.pickle: no 'segments' key"), std::string::npos);
  }
}

TEST(Snapshot, MissingOptionalKeysTakeDefaults) {
  // {'segments': [{'address': 4096, 'total_size': 2097152, 'blocks': [{'size': 2097152, 'state': 'inactive'}]}]}
  const PickleDocument doc = read_pickle_bytes(
      "\x80\x02}(X\x08\x00\x00\x00segments]}(X\x07\x00\x00\x00"
      "addressM\x00\x10X\x0a\x00\x00\x00total_size"
      "J\x00\x00\x20\x00X\x06\x00\x00\x00"
      "blocks]}(X\x04\x00\x00\x00sizeJ\x00\x00\x20\x00X\x05\x00\x00\x00state"
      "X\x08\x00\x00\x00inactiveuauau."s);
  const Snapshot s = snapshot_from_pickle(doc.store, doc.root, "m.pickle");
  ASSERT_EQ(s.segments.size(), 1u);
  EXPECT_EQ(s.segments[0].address, 4096);
  EXPECT_EQ(s.segments[0].blocks[0].address, 4096);
  EXPECT_EQ(s.segments[0].blocks[0].requested_size, 2097152);
  EXPECT_EQ(s.segments[0].stream, 0);
  EXPECT_TRUE(s.device_traces.empty());
  EXPECT_FALSE(s.allocator_settings.present);
}

// ---- load_snapshot streams trace events (TraceStream, an ItemSink): the
// result and every error must be those of a plain read.

/// read_pickle_bytes + snapshot_from_pickle: every field, or the error.
std::string plain_read(const std::string& bytes, const std::string& name) {
  try {
    const PickleDocument doc = read_pickle_bytes(bytes, name);
    Snapshot s = snapshot_from_pickle(doc.store, doc.root, name);
    s.file_bytes = doc.bytes_read;
    return testing::snapshot_dump(s);
  } catch (const SnapshotError& e) {
    return std::string("error: ") + e.what();
  }
}

/// load_snapshot_bytes: every field, or the error; whether it streamed.
std::string streamed_read(const std::string& bytes, const std::string& name, bool* streamed) {
  *streamed = false;
  try {
    return testing::snapshot_dump(load_snapshot_bytes(bytes, name, streamed));
  } catch (const SnapshotError& e) {
    return std::string("error: ") + e.what();
  }
}

TEST(Snapshot, StreamingReadsEveryFixtureAsAPlainRead) {
  std::vector<std::string> files;
  for (const std::string& dir : {testing::synthetic_fixture(""), testing::real_fixture("")}) {
    if (!std::filesystem::is_directory(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().extension() == ".pickle") files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 19u);
  int streamed_files = 0;
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    const std::string bytes = testing::read_all(path);
    const std::string plain = plain_read(bytes, path);
    bool streamed = false;
    EXPECT_EQ(streamed_read(bytes, path, &streamed), plain);
    // Every snapshot with trace events streams them (none needs the fallback).
    const bool has_events =
        plain.find("trace 0: 0 events") == std::string::npos && plain.find("\ntrace 0: ") != std::string::npos;
    EXPECT_EQ(streamed, has_events);
    streamed_files += streamed ? 1 : 0;
  }
  EXPECT_GE(streamed_files, 10);
}

/// A snapshot written opcode by opcode: {'device_traces': [...], 'segments':
/// [one segment]} as pickle.dump writes it (the trace first: frames are
/// numbered in reading order). `traces` writes the device_traces list's items
/// (the list is open: MARK ... APPENDS); memo entries 0-9 are free.
std::string snapshot_with(const std::function<void(testing::PickleWriter&)>& traces) {
  testing::PickleWriter w;
  w.ops("}").put(100).ops("(").str("device_traces").ops("]").put(101).ops("(");
  traces(w);
  w.ops("e").str("segments").ops("](}(").pair("device", 0).pair("address", 4096).pair("total_size", 2 << 20);
  w.str("stream").num(7).str("frames").ops("](}(").str("filename").str("seg.py").str("name").str("alloc");
  w.pair("line", 9).ops("ueu").ops("eu");
  return w.done();
}

/// One trace event dict (EMPTY_DICT, MARK, pairs, SETITEMS); `frames`
/// writes the frames value.
void event(testing::PickleWriter& w, const std::string& action, int64_t addr, int64_t stream,
           const std::function<void(testing::PickleWriter&)>& frames) {
  w.ops("}(").str("action").str(action).pair("addr", addr).pair("size", 512).pair("stream", stream);
  w.pair("time_us", 1000 + addr).str("compile_context").str("N/A").str("frames");
  frames(w);
  w.ops("u");
}

void frames_list(testing::PickleWriter& w, int line) {
  w.ops("](}(").str("filename").str("/home/u/train.py").str("name").str("forward").pair("line", line).ops("ue");
}

TEST(Snapshot, StreamedTracesKeepAPlainReadsNumbering) {
  // Two devices; frames lists shared through the memo (as PyTorch's alloc
  // and segment_alloc share one); streams 5 and 0; an oom with device_free;
  // an event without frames, one with frames None, one with no keys at all.
  const std::string bytes = snapshot_with([](testing::PickleWriter& w) {
    w.ops("](");  // device 0
    event(w, "segment_alloc", 4096, 5, [](testing::PickleWriter& x) {
      frames_list(x, 20);
      x.put(1);
    });
    event(w, "alloc", 4096, 5, [](testing::PickleWriter& x) { x.get(1); });
    event(w, "free_requested", 4096, 0, [](testing::PickleWriter& x) { frames_list(x, 30); });
    event(w, "annotate", 0, 5, [](testing::PickleWriter& x) { x.ops("N"); });
    w.ops("}(").str("action").str("oom").pair("device_free", 123).pair("size", 1 << 20).ops("u");
    w.ops("}");
    w.ops("e](");  // device 1: ']' then its batch
    event(w, "alloc", 8192, 0, [](testing::PickleWriter& x) { frames_list(x, 40); });
    event(w, "alloc", 8704, 5, [](testing::PickleWriter& x) { x.get(1); });
    w.ops("e");
  });
  const std::string plain = plain_read(bytes, "s.pickle");
  ASSERT_EQ(plain.find("error"), std::string::npos) << plain;
  bool streamed = false;
  EXPECT_EQ(streamed_read(bytes, "s.pickle", &streamed), plain);
  EXPECT_TRUE(streamed);
  const Snapshot s = load_snapshot_bytes(bytes, "s.pickle");
  ASSERT_EQ(s.device_traces.size(), 2u);
  ASSERT_EQ(s.device_traces[0].size(), 6u);
  EXPECT_EQ(s.device_traces[0][4].action, TraceAction::kOom);
  EXPECT_EQ(s.device_traces[0][4].addr, 123);
  EXPECT_EQ(s.device_traces[0][3].frames, 0u);
  EXPECT_EQ(s.device_traces[0][0].frames, s.device_traces[0][1].frames);
  EXPECT_EQ(s.streams, (std::vector<int64_t>{5, 0}));
  EXPECT_EQ(s.layout, SnapshotLayout::kV2_2);  // time_us seen in a streamed trace
}

TEST(Snapshot, StreamingFallsBackToAPlainReadWordForWord) {
  using W = testing::PickleWriter;
  auto frames = [](W& x) { frames_list(x, 20); };
  struct Case {
    const char* what;
    std::function<void(W&)> traces;
  };
  const Case cases[] = {
      {"a size that is a str",
       [&](W& w) {
         w.ops("](");
         event(w, "alloc", 4096, 0, frames);
         w.ops("}(").str("action").str("alloc").str("size").str("big").ops("u");
         w.ops("e");
       }},
      {"a negative time_us", [&](W& w) { w.ops("](}(").str("action").str("alloc").pair("time_us", -1).ops("u}e"); }},
      {"a frame whose line is a str",
       [&](W& w) {
         w.ops("](");
         event(w, "alloc", 4096, 0, [](W& x) {
           x.ops("](}(").str("filename").str("a.py").str("name").str("f").str("line").str("x").ops("ue");
         });
         w.ops("e");
       }},
      {"frames given twice",
       [&](W& w) {
         w.ops("](}(").str("action").str("alloc").str("frames");
         frames_list(w, 1);
         w.str("frames");
         frames_list(w, 2);
         w.ops("u}e");
       }},
      {"an event filled by two batches",
       [&](W& w) { w.ops("](}(").str("action").str("alloc").ops("u(").pair("addr", 4096).ops("u}e"); }},
      {"an event dropped before its APPENDS",
       [&](W& w) {
         w.ops("](");
         event(w, "alloc", 4096, 0, frames);
         w.ops("}0");
         event(w, "free_requested", 4096, 0, frames);
         w.ops("e");
       }},
      {"an event fetched from the memo into another list",
       [&](W& w) {
         w.ops("](");
         event(w, "alloc", 4096, 0, frames);
         w.put(2).ops("e").ops("](").get(2).ops("e");  // device 1 holds device 0's event
       }},
      {"an event appended twice",
       [&](W& w) {
         w.ops("](");
         event(w, "alloc", 4096, 0, frames);
         w.ops("2e");
       }},
      {"one trace listed twice",
       [&](W& w) {
         w.ops("](");
         event(w, "alloc", 4096, 0, frames);
         w.ops("e").put(3).get(3);
       }},
      {"a shared frames list appended to afterwards",
       [&](W& w) {
         w.ops("](");
         event(w, "alloc", 4096, 0, [](W& x) { frames_list(x, 20); });
         event(w, "alloc", 8192, 0, [](W& x) {
           frames_list(x, 20);
           x.put(2);
         });                                  // equal: shared
         w.ops("e").get(2).num(5).ops("a0");  // only the second event's list grows
       }},
      {"a stored dict among streamed ones",
       [&](W& w) {
         w.ops("](");
         event(w, "alloc", 4096, 0, frames);
         w.ops("(").str("action").str("alloc").ops("de");
       }},
      {"a list of one event (APPEND, not streamed)",
       [&](W& w) {
         w.ops("]");
         event(w, "alloc", 4096, 0, frames);
         w.ops("a");
       }},
      {"events that are not dicts", [&](W& w) { w.ops("](").num(1).num(2).ops("e"); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string bytes = snapshot_with(c.traces);
    const std::string plain = plain_read(bytes, "f.pickle");
    bool streamed = true;
    EXPECT_EQ(streamed_read(bytes, "f.pickle", &streamed), plain);
    EXPECT_FALSE(streamed);
  }
}

}  // namespace
}  // namespace oomtune::diagnose
