// Tags PyTorch records beside each trace event (event_tags.h):
// torch.cuda.memory._set_memory_metadata()'s string and the torch.compile
// region of _record_memory_history(compile_context=True).
//
// tagged_step_oom.pickle (scripts/make_snapshot_fixtures.py) is
// compiled_step_oom's run tagged by its script; what each tag holds at the
// out-of-memory is known by construction: "load" the 4 parameters of
// 8 MiB, "train step 0" the 4 gradients of 8 MiB its backward made,
// "train step 1" the 3 activations of 16 MiB its forward kept, those
// inside "Torch-Compiled Region: 0/0", the rest outside any region.

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/byte_size.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

const char* const kRegion = "Torch-Compiled Region: 0/0";

struct Expected {
  std::string tag;
  int64_t bytes;
  int64_t blocks;
};

void expect_tags(const std::vector<TagBytes>& got, const std::vector<Expected>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tag, want[i].tag) << i;
    EXPECT_EQ(got[i].bytes, want[i].bytes) << want[i].tag;
    EXPECT_EQ(got[i].blocks, want[i].blocks) << want[i].tag;
  }
}

TEST(EventTags, TheBytesAliveAtTheOutOfMemoryByTheTagsTheyWereAllocatedUnder) {
  const Diagnosis d = testing::diagnose_file(testing::synthetic_fixture("tagged_step_oom.pickle"));
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].user_metadata, "train step 1");
  EXPECT_EQ(d.ooms[0].compile_context, kRegion);
  // Ties keep the tags' alphabetical order.
  expect_tags(d.oom_tags.user_metadata,
              {{"train step 1", 48 * kMiB, 3}, {"load", 32 * kMiB, 4}, {"train step 0", 32 * kMiB, 4}});
  expect_tags(d.oom_tags.compile_contexts, {{kNoTag, 64 * kMiB, 8}, {kRegion, 48 * kMiB, 3}});
  // The tags add up to what was allocated, as the categories do.
  int64_t tagged = 0;
  for (const TagBytes& b : d.oom_tags.user_metadata) tagged += b.bytes;
  EXPECT_EQ(tagged, d.ooms[0].allocated_bytes);
  // Every allocation ran under user metadata; the forwards' 5 + 3 in the region.
  EXPECT_EQ(d.trace.alloc_events_with_user_metadata, d.trace.alloc_events);
  EXPECT_EQ(d.trace.alloc_events_in_compiled_regions, 8);
  // The peak is the moment before the out-of-memory.
  expect_tags(d.peak.tags.compile_contexts, {{kNoTag, 64 * kMiB, 8}, {kRegion, 48 * kMiB, 3}});

  // The script's record_function marks: "train_step" > "forward" at the
  // failing call; the activations made in "forward", the gradients in
  // "backward", the parameters outside both.
  EXPECT_EQ(d.ooms[0].record_functions, (std::vector<std::string>{"train_step", "forward"}));
  expect_tags(d.oom_tags.record_functions,
              {{"forward", 48 * kMiB, 3}, {kNoTag, 32 * kMiB, 4}, {"backward", 32 * kMiB, 4}});

  const std::string text = render_text(d);
  EXPECT_NE(text.find("tagged: user metadata \"train step 1\"; in torch.compile region \"Torch-Compiled Region: "
                      "0/0\"; inside record_function \"train_step\" > \"forward\""),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("alive at the last out-of-memory, by user metadata"), std::string::npos) << text;
  const nlohmann::json j = nlohmann::json::parse(render_json(d));
  EXPECT_EQ(j["ooms"][0]["user_metadata"], "train step 1");
  EXPECT_EQ(j["oom_tags"]["user_metadata"][0]["tag"], "train step 1");
  EXPECT_EQ(j["oom_tags"]["compile_contexts"][1]["bytes"], 48 * kMiB);
}

TEST(EventTags, PyTorchsNoneReadsAsNoTag) {
  // Every event of PyTorch 2.11's recordings carries compile_context "N/A"
  // and user_metadata "": no tag, no table, the report as before.
  const Snapshot s = load_snapshot(testing::synthetic_fixture("compiled_step_oom.pickle"));
  EXPECT_FALSE(s.has_event_tags());
  const Diagnosis d = testing::diagnose_file(testing::synthetic_fixture("compiled_step_oom.pickle"));
  EXPECT_TRUE(d.oom_tags.empty());
  EXPECT_TRUE(d.peak.tags.empty());
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].compile_context, "");
  const std::string text = render_text(d);
  EXPECT_EQ(text.find("tagged:"), std::string::npos);
  EXPECT_EQ(text.find("by user metadata"), std::string::npos);
}

TEST(EventTags, ARunOfEventsSharesOneTag) {
  const Snapshot s = load_snapshot(testing::synthetic_fixture("tagged_step_oom.pickle"));
  // A run per change, each a tag of its own besides the empty one: "load";
  // "train step 0" in the region (forward), then outside it (backward);
  // "train step 1" in the region, where it runs out of memory.
  ASSERT_EQ(s.tag_runs.size(), 1u);
  const auto& trace = s.device_traces[0];
  EXPECT_EQ(s.event_tags[s.tag_of(0, 0)].user_metadata, "load");
  EXPECT_EQ(s.event_tags[s.tag_of(0, trace.size() - 1)].user_metadata, "train step 1");
  EXPECT_EQ(s.event_tags[s.tag_of(0, trace.size() - 1)].compile_context, kRegion);
  EXPECT_EQ(s.event_tags.size(), 5u);
  EXPECT_EQ(s.tag_runs[0].size(), 4u);
  EXPECT_EQ(s.tag_of(1, 0), 0u);  // no such device
}

TEST(EventTags, RecordFunctionMarksOpenAtEachEvent) {
  // Events at t = 10, 20, ..., 80 on device 0; marks by hand.
  Snapshot s;
  s.device_traces.emplace_back();
  for (int i = 1; i <= 8; ++i) {
    TraceEvent e;
    e.action = TraceAction::kAlloc;
    e.addr = i * 1024;
    e.size = 512;
    e.time_us = 10 * i;
    s.device_traces[0].push_back(e);
  }
  auto mark = [&](const std::string& name, const std::string& stage, int64_t time_us, int64_t device = 0) {
    s.annotations.push_back(Annotation{name, stage, device, time_us});
  };
  mark("step", "START", 15);
  mark("inner", "START", 25);  // events 2 (t 30) and 3 (t 40) inside both
  mark("step", "END", 45);     // closes "step" below "inner": "inner" stays open
  mark("inner", "END", 55);
  mark("Optimizer.step#AdamW.step", "START", 58);  // torch.optim's: not the user's
  mark("oomtune:forward", "START", 59);            // oomtune's: not the user's
  mark("other device", "START", 5, 1);
  mark("late", "START", 80);  // at the last event's time: it is inside
  const RecordFunctions marks(s, 0);
  ASSERT_TRUE(marks.any());
  EXPECT_EQ(marks.innermost_at(0), "");
  EXPECT_EQ(marks.innermost_at(1), "step");
  EXPECT_EQ(marks.innermost_at(2), "inner");
  EXPECT_EQ(marks.open_at(3), (std::vector<std::string>{"step", "inner"}));
  EXPECT_EQ(marks.open_at(4), (std::vector<std::string>{"inner"}));
  EXPECT_EQ(marks.innermost_at(5), "");
  EXPECT_EQ(marks.innermost_at(6), "");
  EXPECT_EQ(marks.innermost_at(7), "late");
  EXPECT_FALSE(RecordFunctions(s, 1).any());  // device 1 has a mark but no trace
}

}  // namespace
}  // namespace oomtune::diagnose
