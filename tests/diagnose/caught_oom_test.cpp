// Out-of-memory errors a run survived (diagnose/caught_oom.h): the rule on a
// trace made by hand, the frames that say what caught one, and the two CNN
// snapshots of scripts/make_snapshot_fixtures.py, where cuDNN caught a
// convolution's workspace error and the run went on (and, in the second,
// later ran out of memory for good).

#include "diagnose/caught_oom.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/byte_size.h"
#include "diagnose/diagnosis.h"
#include "diagnose/frames.h"
#include "diagnose/render.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

TraceEvent event(TraceAction action) {
  TraceEvent e;
  e.action = action;
  return e;
}

TEST(CaughtOom, AnOomFollowedByAnAllocationWasCaught) {
  const std::vector<TraceEvent> trace = {
      event(TraceAction::kAlloc),         event(TraceAction::kOom),  // 1: caught, 2 allocations follow
      event(TraceAction::kAlloc),         event(TraceAction::kFreeCompleted), event(TraceAction::kAlloc),
      event(TraceAction::kOom),  // 5: the last allocation was before it: it ended the run
      event(TraceAction::kFreeRequested), event(TraceAction::kOom),  // 7: so did this one, after frees only
  };
  const size_t last = last_alloc_event(trace);
  EXPECT_EQ(last, 4u);
  EXPECT_TRUE(oom_caught(1, last, trace.size()));
  EXPECT_FALSE(oom_caught(5, last, trace.size()));
  EXPECT_FALSE(oom_caught(7, last, trace.size()));
  EXPECT_EQ(allocations_after(trace, 1), 2);
  EXPECT_EQ(allocations_after(trace, 5), 0);
  // Without any allocation nothing was caught.
  const std::vector<TraceEvent> no_allocs = {event(TraceAction::kOom), event(TraceAction::kFreeCompleted)};
  EXPECT_EQ(last_alloc_event(no_allocs), no_allocs.size());
  EXPECT_FALSE(oom_caught(0, last_alloc_event(no_allocs), no_allocs.size()));
}

// What may have caught one: a convolution (torch's conv.py, or cuDNN's C++
// frames in a stacks="all" snapshot) and the batch-size finders, by package.
TEST(CaughtOom, TheFramesNameAConvolutionAndABatchSizeFinder) {
  const std::string venv = "/opt/venv/lib/python3.11/site-packages";
  const Snapshot s = testing::with_stacks({
      {{venv + "/torch/nn/modules/conv.py", "_conv_forward", 549}, {"/home/u/model.py", "forward", 12}},
      {{"", "at::native::(anonymous namespace)::run_conv_plan(cudnnContext*, at::Tensor const&)", 0},
       {"", "torch::autograd::Engine::evaluate_function(...)", 0}},
      {{venv + "/torch/nn/modules/linear.py", "forward", 125},
       {"/home/u/train.py", "train", 30},
       {venv + "/accelerate/utils/memory.py", "decorator", 174},
       {"/home/u/train.py", "main", 60}},
      {{venv + "/lightning/pytorch/tuner/batch_size_scaling.py", "_run_power_scaling", 160},
       {"/home/u/tune.py", "main", 9}},
      {{"/home/u/conv.py", "forward", 3}, {"/home/u/accelerate/utils/memory.py", "decorator", 1}},
  });
  const FrameIndex index(s);
  EXPECT_TRUE(index.runs_convolution(1));
  EXPECT_TRUE(index.runs_convolution(2));
  EXPECT_FALSE(index.runs_convolution(3));
  EXPECT_EQ(index.batch_size_finder(1), BatchSizeFinder::kNone);
  EXPECT_EQ(index.batch_size_finder(3), BatchSizeFinder::kAccelerate);
  EXPECT_EQ(index.batch_size_finder(4), BatchSizeFinder::kLightning);
  // The user's own files of those names are neither.
  EXPECT_FALSE(index.runs_convolution(5));
  EXPECT_EQ(index.batch_size_finder(5), BatchSizeFinder::kNone);
}

// cnn_caught_oom.pickle: under a 256 MiB cap the fourth convolution's
// 112 MiB workspace failed with 160 MiB allocated (its 16 MiB cached
// workspace segment released first); cuDNN ran an engine with a 2 MiB
// workspace and the step ran to its end. Nothing ended the run: the
// verdicts are the peak's, the error is listed, not judged.
TEST(CaughtOom, AnErrorCaughtInAConvolutionIsListedNotJudged) {
  const std::string path = testing::synthetic_fixture("cnn_caught_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  EXPECT_TRUE(d.ooms.empty());
  ASSERT_EQ(d.caught_ooms.size(), 1u);
  const CaughtOom& c = d.caught_ooms[0];
  EXPECT_EQ(c.requested_bytes, 112 * kMiB);
  EXPECT_EQ(c.allocated_bytes, 160 * kMiB);  // 64 MiB of weights, four 24 MiB outputs
  EXPECT_EQ(c.reserved_bytes, 160 * kMiB);
  EXPECT_EQ(c.phase, Phase::kForward);
  EXPECT_EQ(c.layer, "train.py:23 in forward");
  EXPECT_TRUE(c.in_convolution);
  EXPECT_EQ(c.batch_size_finder, BatchSizeFinder::kNone);
  // The 2 MiB workspace, two outputs and their workspaces, the loss and four gradients.
  EXPECT_EQ(c.allocations_after, 10);
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(verdict_name(d.verdicts.front().id), std::string("backward_peak"));
  for (const Verdict& v : d.verdicts) {
    EXPECT_NE(verdict_name(v.id), std::string("activations_in_forward"));
    EXPECT_NE(verdict_name(v.id), std::string("memory_cap"));
  }
  const std::string text = render_text(d);
  EXPECT_NE(text.find("  1 out-of-memory error was caught, and the program went on allocating after it (below): it "
                      "ended nothing; it came from a convolution, whose cuDNN workspace gives way to a slower "
                      "engine.\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Out-of-memory error caught (1): the program went on allocating after it\n  event 27: "
                      "requested 112.00 MiB in the forward phase at train.py:23 in forward; 10 allocations followed"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("Out-of-memory event"), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(render_json(d));
  EXPECT_TRUE(j.at("ooms").empty());
  ASSERT_EQ(j.at("caught_ooms").size(), 1u);
  EXPECT_EQ(j.at("caught_ooms")[0].at("requested_bytes"), 112 * kMiB);
  EXPECT_EQ(j.at("caught_ooms")[0].at("in_convolution"), true);
  EXPECT_EQ(j.at("caught_ooms")[0].at("batch_size_finder"), "none");
}

// cnn_caught_then_fatal_oom.pickle: the same forward, then a seventh
// convolution's 64 MiB output does not fit (208 MiB allocated) and ends the
// run. That one is judged, as if the caught one had not been.
TEST(CaughtOom, TheErrorThatEndedTheRunIsJudgedAlone) {
  const std::string path = testing::synthetic_fixture("cnn_caught_then_fatal_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].requested_bytes, 64 * kMiB);
  EXPECT_EQ(d.ooms[0].allocated_bytes, 208 * kMiB);
  EXPECT_EQ(testing::alive_bytes(d.ooms[0], Category::kActivations), 144 * kMiB);
  ASSERT_EQ(d.caught_ooms.size(), 1u);
  EXPECT_EQ(d.caught_ooms[0].requested_bytes, 112 * kMiB);
  EXPECT_EQ(d.caught_ooms[0].allocations_after, 5);  // the 2 MiB workspace, two outputs and their workspaces
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(verdict_name(d.verdicts.front().id), std::string("activations_in_forward"));
  EXPECT_EQ(d.need.still_needed_bytes, 64 * kMiB);
  // The cap (256 MiB) refused both: 160 + 112 and 208 + 64 MiB would pass
  // it; the trace had reserved 228 MiB before (the 20 MiB workspace segment
  // beside the outputs), so it lies in [228, 272) MiB.
  EXPECT_TRUE(d.ooms[0].memory_cap);
  EXPECT_EQ(d.ooms[0].cap_low_bytes, 228 * kMiB);
  EXPECT_EQ(d.ooms[0].cap_high_bytes, 272 * kMiB);
  const nlohmann::json j = nlohmann::json::parse(render_json(d));
  EXPECT_EQ(j.at("ooms")[0].at("cap_low_bytes"), 228 * kMiB);
  EXPECT_EQ(j.at("ooms")[0].at("cap_high_bytes"), 272 * kMiB);
  EXPECT_NE(render_text(d).find("  Before the out-of-memory that ended the run, 1 out-of-memory error was caught"),
            std::string::npos);
}

}  // namespace
}  // namespace oomtune::diagnose
