// Snapshots recorded with stacks="all", _record_memory_history's default:
// C/C++ frames beside the Python ones (frames.h, "native"). They name no
// layer, call site or phase, but the autograd engine's mark backward; the
// diagnosis is the one a stacks="python" recording of the same run gets
// (scripts/make_snapshot_fixtures.py, stacks_all).

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "diagnose/diagnosis.h"
#include "diagnose/frames.h"
#include "diagnose/render.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

// Frames as a PyTorch 2.11 wheel's CapturedTraceback symbolizes them.
const Frame kUnwind{"??", "torch::unwind::unwind()", 0};
const Frame kGather{"", "torch::cuda::(anonymous namespace)::gather_with_cpp()", 0};
const Frame kEngineBinding{"python_engine.cpp", "THPEngine_run_backward(_object*, _object*, _object*)", 0};
const Frame kLibc{"./csu/../csu/libc-start.c", "__libc_start_main_impl", 360};
const Frame kEngine{"??", "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
                    0};

TEST(StacksAll, CppFramesNameNoLayerAndTheAutogradEngineMarksBackward) {
  const Frame model{"/home/me/model.py", "forward", 30};
  const Frame script{"/home/me/train.py", "main", 44};
  const Snapshot s = testing::with_stacks({
      {kUnwind, kGather, model, kEngineBinding, script, kLibc},  // 1: a forward allocation
      {kUnwind, kGather, kEngine},                               // 2: the engine's device thread
      {kUnwind, kGather, kLibc},                                 // 3: C++ alone, no engine
      {{"??", "dropout", 0}, {"code/__torch__.py", "forward", 18}, {"<frozen runpy>", "_run_code", 88}},  // 4
  });
  const FrameIndex index(s);
  for (uint32_t f : s.stacks[1]) {
    const bool python = s.frames[f].filename == model.filename || s.frames[f].filename == script.filename;
    EXPECT_EQ(index.origin(f), python ? Origin::kUser : Origin::kNative) << s.frames[f].filename;
  }
  EXPECT_EQ(index.layer_frame(1), 2);  // model.py, not the allocator's C++ frames
  EXPECT_EQ(index.call_frame(1), 4);   // train.py, outer to forward
  EXPECT_EQ(index.phase(1), Phase::kForward);
  EXPECT_TRUE(index.has_python_frames(1));

  EXPECT_EQ(index.phase(2), Phase::kBackward);
  EXPECT_FALSE(index.has_python_frames(2));
  EXPECT_EQ(index.layer_frame(2), -1);
  EXPECT_EQ(index.call_frame(2), -1);

  EXPECT_EQ(index.phase(3), Phase::kUnknown);  // as a stack without frames
  EXPECT_FALSE(index.has_python_frames(3));

  // A script run without its extension, a header, a shared library (addr2line off).
  const Snapshot more =
      testing::with_stacks({{{"/usr/include/c++/12/bits/shared_ptr_base.h", "f", 1},
                             {"/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so", "g", 0},
                             {"/lib/x86_64-linux-gnu/libc.so.6", "h", 0},
                             {"/home/me/bin/train", "main", 12}}});
  const FrameIndex more_index(more);
  EXPECT_EQ(more_index.origin(0), Origin::kNative);
  EXPECT_EQ(more_index.origin(1), Origin::kNative);
  EXPECT_EQ(more_index.origin(2), Origin::kNative);
  EXPECT_EQ(more_index.origin(3), Origin::kUser);
  EXPECT_EQ(more_index.layer_frame(1), 3);

  // A scripted model's frames (stacks="python"): TorchScript's builtin is
  // native, its serialized code and the frozen module are Python.
  const uint32_t builtin = s.stacks[4][0], code = s.stacks[4][1], frozen = s.stacks[4][2];
  EXPECT_EQ(index.origin(builtin), Origin::kNative);
  EXPECT_EQ(index.origin(code), Origin::kUser);
  EXPECT_EQ(index.origin(frozen), Origin::kStdlib);
  EXPECT_EQ(index.layer_frame(4), code);
  EXPECT_TRUE(index.has_cpp_frames());
  const std::vector<Frame> scripted(s.frames.begin() + builtin, s.frames.begin() + builtin + 3);
  EXPECT_FALSE(FrameIndex(testing::with_stacks({scripted})).has_cpp_frames());  // "dropout" names no C++ function
}

TEST(StacksAll, AForwardOomReadsAsWithPythonStacks) {
  SKIP_IF_MISSING(testing::synthetic_fixture("hf_bert_forward_oom_stacks_all.pickle"));
  nlohmann::json all = testing::fixture_json("hf_bert_forward_oom_stacks_all.pickle");
  nlohmann::json python = testing::fixture_json("hf_bert_forward_oom.pickle");
  EXPECT_EQ(all["trace"]["cpp_frames"], true);
  EXPECT_EQ(python["trace"]["cpp_frames"], false);
  EXPECT_NE(all["trace"]["frames_note"].get<std::string>().find("stacks=\"all\""), std::string::npos);
  for (auto* j : {&all, &python}) {
    (*j)["trace"].erase("cpp_frames");
    (*j)["trace"].erase("frames_note");
  }
  EXPECT_EQ(all, python);
  EXPECT_EQ(all["ooms"][0]["layer"], "modeling_bert.py:466 in forward");
}

// Backward's allocations have the autograd engine's frames where
// stacks="python" has none: backward by their frames, not by trace order.
TEST(StacksAll, ABackwardOomReadsAsWithPythonStacks) {
  SKIP_IF_MISSING(testing::synthetic_fixture("backward_peak_stacks_all.pickle"));
  nlohmann::json all = testing::fixture_json("backward_peak_stacks_all.pickle");
  nlohmann::json python = testing::fixture_json("backward_peak.pickle");
  EXPECT_EQ(python["trace"]["alloc_events_without_frames"], 3);
  EXPECT_EQ(python["trace"]["frameless_inferred_backward"], 3);
  EXPECT_EQ(all["trace"]["alloc_events_without_frames"], 0);
  EXPECT_EQ(all["trace"]["frameless_inferred_backward"], 0);
  EXPECT_EQ(all["ooms"][0]["phase"], "backward");
  all.erase("trace");
  python.erase("trace");
  EXPECT_EQ(all, python);
}

}  // namespace
}  // namespace oomtune::diagnose
