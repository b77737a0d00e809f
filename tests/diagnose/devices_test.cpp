// A snapshot of one process that drove two GPUs (two_devices.pickle:
// leak.pickle's run on device 0, optimizer_oom.pickle's on device 1, by
// construction in scripts/make_snapshot_fixtures.py): each device is
// diagnosed as its own single-device file reads, the others are named, and
// --device picks one.

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/byte_size.h"
#include "common/error.h"
#include "diagnose/diagnosis.h"
#include "diagnose/render.h"
#include "support/run_oomtune.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

using oomtune::testing::run_oomtune;

// The diagnosis as JSON without what names the file and the device.
nlohmann::json without_file_and_device(const Diagnosis& d) {
  nlohmann::json j = testing::json_without_file(d);
  j.erase("other_devices");
  j["trace"].erase("device");
  return j;
}

DiagnoseOptions on_device(int device) {
  DiagnoseOptions options;
  options.device = device;
  return options;
}

// What a single-device file holds, counted from the file itself.
DeviceContent content_of(const std::string& path, int device) {
  const Snapshot s = load_snapshot(path);
  DeviceContent c;
  c.device = device;
  c.events = static_cast<int64_t>(s.device_traces.at(0).size());
  c.ooms = std::count_if(s.device_traces[0].begin(), s.device_traces[0].end(),
                         [](const TraceEvent& e) { return e.action == TraceAction::kOom; });
  for (const Segment& g : s.segments) c.reserved_bytes += g.total_size;
  return c;
}

void expect_content(const DeviceContent& got, const DeviceContent& want) {
  EXPECT_EQ(got.device, want.device);
  EXPECT_EQ(got.events, want.events);
  EXPECT_EQ(got.ooms, want.ooms);
  EXPECT_EQ(got.reserved_bytes, want.reserved_bytes);
}

TEST(DiagnoseDevices, EachDeviceReadsAsItsOwnSingleDeviceFile) {
  const std::string both = testing::synthetic_fixture("two_devices.pickle");
  const std::string leak = testing::synthetic_fixture("leak.pickle");
  const std::string oom = testing::synthetic_fixture("optimizer_oom.pickle");
  SKIP_IF_MISSING(both);

  // By default the device that ran out of memory, though device 0 has more events.
  const Diagnosis chosen = testing::diagnose_file(both);
  EXPECT_EQ(chosen.trace.device, 1);
  EXPECT_EQ(without_file_and_device(chosen), without_file_and_device(testing::diagnose_file(oom)));
  ASSERT_EQ(chosen.other_devices.size(), 1u);
  const DeviceContent leak_content = content_of(leak, 0);
  EXPECT_GT(leak_content.events, chosen.trace.events);
  EXPECT_EQ(leak_content.ooms, 0);
  expect_content(chosen.other_devices[0], leak_content);

  const Diagnosis first = testing::diagnose_file(both, on_device(0));
  EXPECT_EQ(first.trace.device, 0);
  EXPECT_EQ(without_file_and_device(first), without_file_and_device(testing::diagnose_file(leak)));
  ASSERT_EQ(first.other_devices.size(), 1u);
  const DeviceContent oom_content = content_of(oom, 1);
  EXPECT_EQ(oom_content.ooms, 1);
  expect_content(first.other_devices[0], oom_content);
  EXPECT_NE(render_text(first).find(fmt::format("  other device in the snapshot: device 1 ({} trace events, 1 "
                                                "out-of-memory, {} reserved); --device N diagnoses one\n",
                                                oom_content.events, format_bytes(oom_content.reserved_bytes))),
            std::string::npos)
      << render_text(first);

  // A single-device file names no other device.
  EXPECT_TRUE(testing::diagnose_file(oom).other_devices.empty());
  EXPECT_EQ(render_text(testing::diagnose_file(oom)).find("other device"), std::string::npos);
}

TEST(DiagnoseDevices, ADeviceTheSnapshotDoesNotHoldIsAnError) {
  const std::string both = testing::synthetic_fixture("two_devices.pickle");
  SKIP_IF_MISSING(both);
  try {
    testing::diagnose_file(both, on_device(3));
    FAIL() << "device 3 was diagnosed";
  } catch (const SnapshotError& e) {
    EXPECT_EQ(std::string(e.what()),
              both + ": device 3 has no trace events and no segments in this snapshot; it holds devices 0, 1");
  }
}

/// Bytes of device `device`'s dumped blocks in use by a tensor, all of them
/// or those that carry frames.
int64_t dumped_allocated(const Snapshot& s, int device, bool with_frames_only) {
  int64_t bytes = 0;
  for (const Segment& g : s.segments) {
    if (g.device != device) continue;
    for (const Block& b : g.blocks) {
      if (b.state == BlockState::kActiveAllocated && (!with_frames_only || b.frames != 0)) bytes += b.size;
    }
  }
  return bytes;
}

// Dumped without _record_memory_history: the device with the most reserved
// bytes, what was alive at the dump, and no claim that nothing went wrong.
TEST(DiagnoseDevices, ASnapshotWithoutATraceShowsTheDumpedState) {
  const std::string both = testing::synthetic_fixture("two_devices.pickle");
  SKIP_IF_MISSING(both);
  Snapshot s = load_snapshot(both);
  for (auto& trace : s.device_traces) trace.clear();
  for (Segment& g : s.segments) {  // without recording, no block has a stack
    g.frames = 0;
    for (Block& b : g.blocks) b.frames = 0;
  }
  const Diagnosis d = diagnose(s, both, {});
  const DeviceContent leak_content = content_of(testing::synthetic_fixture("leak.pickle"), 0);
  const DeviceContent oom_content = content_of(testing::synthetic_fixture("optimizer_oom.pickle"), 1);
  ASSERT_GT(leak_content.reserved_bytes, oom_content.reserved_bytes);
  EXPECT_EQ(d.trace.device, 0);
  EXPECT_EQ(d.trace.events, 0);
  EXPECT_TRUE(d.verdicts.empty());
  EXPECT_EQ(d.peak.reserved_bytes, leak_content.reserved_bytes);
  const std::string text = render_text(d);
  EXPECT_NE(text.find("  No trace events on device 0: the snapshot was dumped without "
                      "torch.cuda.memory._record_memory_history"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("No out-of-memory and no leak found"), std::string::npos) << text;
  EXPECT_NE(text.find(") when the snapshot was dumped (no trace events)\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("at event -1"), std::string::npos) << text;
}

// torch.cuda.memory_snapshot(), the public function, returns a bare list of
// segments in every version (PyTorch 1.13's whole snapshot layout; 2.x's
// blocks with their frames): segments only, with no claim about 1.13.
TEST(DiagnoseDevices, ASegmentListOfAnyVersionReadsAsSegmentsOnly) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  testing::PickleWriter w;
  w.ops("](}(").pair("device", 0).pair("address", 4096).pair("total_size", 2 * kMiB).pair("stream", 0);
  w.str("segment_type").str("large").str("blocks").ops("](}(");
  w.pair("address", 4096).pair("size", kMiB).pair("requested_size", kMiB).str("state").str("active_allocated");
  w.str("frames").ops("](}(").str("filename").str("train.py").str("name").str("main").pair("line", 9).ops("ue");
  w.ops("u}(").pair("address", 4096 + kMiB).pair("size", kMiB).pair("requested_size", kMiB);
  w.str("state").str("inactive").ops("u").ops("e").ops("u").ops("e");
  const Snapshot s = load_snapshot_bytes(w.done(), "list.pickle");
  EXPECT_EQ(s.layout, SnapshotLayout::kV1_13);
  const Diagnosis d = diagnose(s, "list.pickle", {});
  EXPECT_FALSE(d.trace.layout_has_traces);
  EXPECT_EQ(d.peak.allocated_bytes, kMiB);
  EXPECT_EQ(d.peak.reserved_bytes, 2 * kMiB);
  EXPECT_EQ(d.trace.allocated_before_trace_with_frames_bytes, kMiB);
  const std::string text = render_text(d);
  EXPECT_NE(text.find("snapshot layout: segment list (torch.cuda.memory_snapshot(), any version)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("No trace events on device 0: torch.cuda.memory_snapshot() holds segments only"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("1.13"), std::string::npos) << text;
}

// _record_memory_history(enabled="state") keeps the stacks of live blocks
// and no alloc/free history: the report says so, counts those blocks as
// allocated while recording, and asks for the history.
TEST(DiagnoseDevices, BlocksWithStacksAndNoHistoryAreAStateOnlyRecording) {
  const std::string both = testing::synthetic_fixture("two_devices.pickle");
  SKIP_IF_MISSING(both);
  Snapshot s = load_snapshot(both);
  for (auto& trace : s.device_traces) trace.clear();
  const int64_t with_frames = dumped_allocated(s, 0, true);
  ASSERT_GT(with_frames, 0);
  const Diagnosis d = diagnose(s, both, {});
  EXPECT_EQ(d.trace.events, 0);
  EXPECT_EQ(d.trace.allocated_before_recording_bytes, dumped_allocated(s, 0, false));
  EXPECT_EQ(d.trace.allocated_before_trace_with_frames_bytes, with_frames);
  const std::string text = render_text(d);
  EXPECT_NE(text.find("  No trace events on device 0: its blocks carry stacks but it holds no alloc/free history "
                      "(recorded with _record_memory_history(enabled=\"state\")"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(fmt::format("{} were allocated while recording but have no alloc event in the trace",
                                  format_bytes(with_frames))),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("holds no history (enabled=\"state\" keeps none"), std::string::npos) << text;
  EXPECT_EQ(text.find("dumped without torch.cuda.memory._record_memory_history"), std::string::npos) << text;
  EXPECT_EQ(nlohmann::json::parse(render_json(d))["trace"]["allocated_before_trace_with_frames_bytes"], with_frames);
}

// A ring buffer (max_entries) keeps the last events only: a block still
// alive whose alloc event was dropped carries its stack; it was allocated
// while recording, not before.
TEST(DiagnoseDevices, LiveBlocksWhoseAllocFellOutOfTheRingBufferWereRecorded) {
  const std::string both = testing::synthetic_fixture("two_devices.pickle");
  SKIP_IF_MISSING(both);
  Snapshot s = load_snapshot(both);
  auto& trace = s.device_traces.at(0);
  const auto kept_from = static_cast<std::ptrdiff_t>(trace.size() / 2);
  trace.erase(trace.begin(), trace.begin() + kept_from);
  // Expected: the dumped allocated blocks with stacks that no kept alloc
  // event explains.
  std::vector<int64_t> kept_allocs;
  for (const TraceEvent& e : trace) {
    if (e.action == TraceAction::kAlloc) kept_allocs.push_back(e.addr);
  }
  int64_t expected = 0;
  for (const Segment& g : s.segments) {
    if (g.device != 0) continue;
    for (const Block& b : g.blocks) {
      if (b.state == BlockState::kActiveAllocated && b.frames != 0 &&
          std::find(kept_allocs.begin(), kept_allocs.end(), b.address) == kept_allocs.end()) {
        expected += b.size;
      }
    }
  }
  ASSERT_GT(expected, 0);
  const Diagnosis d = diagnose(s, both, on_device(0));
  EXPECT_GT(d.trace.events, 0);
  EXPECT_EQ(d.trace.allocated_before_trace_with_frames_bytes, expected);
  const std::string text = render_text(d);
  EXPECT_NE(text.find(fmt::format("{} were allocated while recording but have no alloc event in the trace: their "
                                  "blocks carry stacks, and the trace kept only later events",
                                  format_bytes(expected))),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(fmt::format("({} of it allocated while recording, with stacks)", format_bytes(expected))),
            std::string::npos)
      << text;
}

TEST(DiagnoseDevices, TheCommandLineTakesNOrCudaN) {
  const std::string both = testing::synthetic_fixture("two_devices.pickle");
  SKIP_IF_MISSING(both);
  const auto as_cuda = run_oomtune("diagnose " + both + " --device cuda:0");
  ASSERT_EQ(as_cuda.exit_code, 0) << as_cuda.err;
  EXPECT_NE(as_cuda.out.find("; device 0; "), std::string::npos) << as_cuda.out;
  EXPECT_NE(as_cuda.out.find("Memory leak across iterations [leak]"), std::string::npos) << as_cuda.out;
  const auto as_index = run_oomtune("diagnose " + both + " --device 1 --json");
  ASSERT_EQ(as_index.exit_code, 0) << as_index.err;
  const auto j = nlohmann::json::parse(as_index.out);
  EXPECT_EQ(j["trace"]["device"], 1);
  ASSERT_EQ(j["other_devices"].size(), 1u);
  EXPECT_EQ(j["other_devices"][0]["device"], 0);
  EXPECT_EQ(j["other_devices"][0]["ooms"], 0);

  const auto missing = run_oomtune("diagnose " + both + " --device 3");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.out, "");
  EXPECT_EQ(
      missing.err,
      "oomtune: " + both + ": device 3 has no trace events and no segments in this snapshot; it holds devices 0, 1\n");
  for (const std::string bad : {"gpu1", "-1", "cuda:", "1.5"}) {
    const auto r = run_oomtune("diagnose " + both + " --device " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_EQ(r.err, "oomtune diagnose: --device: expected a device index such as 1 or cuda:1, got " + bad +
                         "; see 'oomtune diagnose --help'\n");
  }
}

// Two ranks' snapshots, or two devices of one: each side says its device.
TEST(DiagnoseDevices, AComparisonNamesEachSidesDevice) {
  const std::string both = testing::synthetic_fixture("two_devices.pickle");
  const std::string oom = testing::synthetic_fixture("optimizer_oom.pickle");
  SKIP_IF_MISSING(both);
  const auto r = run_oomtune("diagnose " + both + " --compare " + oom);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("  A: " + both +
                       " (device 1 of 2 in the snapshot, at the last out-of-memory; 1 "
                       "out-of-memory event)\n  B: " +
                       oom + " (at the last out-of-memory; 1 out-of-memory event)\n"),
            std::string::npos)
      << r.out;
  // The same run on both sides: nothing grew.
  EXPECT_NE(r.out.find("allocated                 204.00 MiB    204.00 MiB           0 B"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace oomtune::diagnose
