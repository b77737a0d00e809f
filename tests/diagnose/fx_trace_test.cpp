// Frames of FX-generated code mapped back to the model source through
// fx_original_trace (diagnose/fx_trace.h).
//
// cpu_gpt2_compiled_backward_oom.pickle: scripts/record_cpu_snapshot.py
//   --mode step --batch 1 --seq 32 --oom-in backward --share 0.8 --compile
// (PyTorch 2.11, transformers 5.24: the GPT-2 of recorded_on_cpu_test.cpp
// under torch.compile(backend="aot_eager"), the snapshot augmented by
// torch._utils._augment_memory_snapshot_stack_traces). Read by hand with
// pickle.load: 268 distinct frames (file, name, line) of fx_generated__*.py
// code, 265 with an fx_original_trace; the failing allocation's generated
// frame (its backward graph, line 951) carries a stack whose innermost
// frames are transformers/pytorch_utils.py:119 in forward (Conv1D, a
// library file that is not a model file) and then
// transformers/models/gpt2/modeling_gpt2.py:187 in forward (the attention's
// c_attn).

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "diagnose/fx_trace.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

std::string frame_text(const Frame& f) { return f.filename + ":" + std::to_string(f.line) + " in " + f.name; }

std::vector<std::string> texts(const std::vector<Frame>& frames) {
  std::vector<std::string> out;
  for (const Frame& f : frames) out.push_back(frame_text(f));
  return out;
}

TEST(FxTrace, FramesComeInnermostFirstWithoutTheirSourceLines) {
  const std::string trace =
      "  File \"/home/u/train.py\", line 80, in forward\n"
      "    x = self.block(x)\n"
      "  File \"/home/u/model.py\", line 40, in forward\n"
      "    h = self.mlp(x)\n";
  EXPECT_EQ(texts(frames_of_fx_trace(trace)),
            (std::vector<std::string>{"/home/u/model.py:40 in forward", "/home/u/train.py:80 in forward"}));
}

TEST(FxTrace, MalformedLinesAreSkippedAndNothingThrows) {
  const std::string trace =
      "Traceback (most recent call last):\n"
      "  File \"/a.py\", line 12, in <module>\n"
      "  File \"/b.py\", line x2, in f\n"           // not a number
      "  File \"/c.py\", line 99999999999, in g\n"  // past 2^31
      "  File \"/d.py\", line 7\n"                  // no name
      "  File \"\", line 3, in h\n"                 // no path
      "  File \"/e.py\", line 5, in <lambda>\r\n";  // CRLF
  EXPECT_EQ(texts(frames_of_fx_trace(trace)),
            (std::vector<std::string>{"/e.py:5 in <lambda>", "/a.py:12 in <module>"}));
  EXPECT_TRUE(frames_of_fx_trace("").empty());
  EXPECT_TRUE(frames_of_fx_trace("File \"").empty());
  EXPECT_TRUE(frames_of_fx_trace(std::string(1000, '\n')).empty());
}

TEST(FxTrace, APathMayHoldWhatSeparatesItsFields) {
  const auto frames = frames_of_fx_trace("  File \"/odd\", line 1, in x/m.py\", line 42, in forward\n");
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].filename, "/odd\", line 1, in x/m.py");
  EXPECT_EQ(frames[0].line, 42);
  EXPECT_EQ(frames[0].name, "forward");
}

TEST(FxTrace, PastTheLimitTheOutermostFramesAreDropped) {
  std::string trace;
  for (size_t i = 0; i < kMaxFxTraceFrames + 10; ++i)
    trace += "  File \"/f.py\", line " + std::to_string(i) + ", in f\n";
  const auto frames = frames_of_fx_trace(trace);
  ASSERT_EQ(frames.size(), kMaxFxTraceFrames);
  EXPECT_EQ(frames.front().line, static_cast<int64_t>(kMaxFxTraceFrames + 9));  // the innermost kept
  EXPECT_EQ(frames.back().line, 10);
}

TEST(FxTrace, FxGeneratedFilesAreNamedSoWithoutAFolder) {
  EXPECT_TRUE(is_fx_generated_file("fx_generated__f4zudtyaoi2b73rtnad2xulcwkmchnnrwezpr4jfb25dknhj2kk.py"));
  EXPECT_FALSE(is_fx_generated_file("/home/u/fx_generated__x.py"));  // a user's file of that name
  EXPECT_FALSE(is_fx_generated_file("<eval_with_key>.5"));
  EXPECT_FALSE(is_fx_generated_file("model.py"));
}

bool names_generated_code(const std::string& site) { return site.find("fx_generated_") != std::string::npos; }

TEST(FxTrace, ACompiledModelsAllocationsGoToItsSourceLines) {
  const std::string path = testing::synthetic_fixture("cpu_gpt2_compiled_backward_oom.pickle");
  const Snapshot s = load_snapshot(path);
  EXPECT_EQ(s.fx_traced_frames, 265);
  const Diagnosis d = diagnose(s, path, {});
  EXPECT_EQ(d.trace.fx_traced_frames, 265);
  EXPECT_TRUE(d.trace.fx_frames_without_source);  // 3 of 268 have no stack
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].phase, Phase::kBackward);
  EXPECT_EQ(d.ooms[0].layer, "modeling_gpt2.py:187 in forward");
  int model_lines = 0;
  for (const auto* sites : {&d.oom_sites, &d.peak.sites}) {
    for (const SiteBytes& site : *sites) {
      EXPECT_FALSE(names_generated_code(site.site)) << site.site;
      if (site.filename.find("transformers/models/gpt2/modeling_gpt2.py") != std::string::npos &&
          site.function == "forward") {
        ++model_lines;
      }
    }
  }
  EXPECT_GE(model_lines, 4);  // gradients of c_attn, c_fc, c_proj, ... by their forward lines
  const std::string text = render_text(d);
  EXPECT_NE(text.find("265 frames of FX-generated code carry the model source's stack"), std::string::npos) << text;
  EXPECT_EQ(text.find("set torch.fx.experimental._config.enrich_profiler_metadata"), std::string::npos) << text;
}

// The same file without the stacks (the key renamed in place, same length):
// generated frames name nothing, and the report says how to get the stacks.
TEST(FxTrace, WithoutTheStacksGeneratedCodeNamesNoLayer) {
  const std::string path = testing::synthetic_fixture("cpu_gpt2_compiled_backward_oom.pickle");
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "fx_original_trace";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, key.size(), "fx_original_trac_");
  ASSERT_EQ(bytes.find(key), std::string::npos);  // memoized: the key is written once
  const Snapshot s = load_snapshot_bytes(bytes, path);
  EXPECT_EQ(s.fx_traced_frames, 0);
  const Diagnosis d = diagnose(s, path, {});
  EXPECT_TRUE(d.trace.generated_frames);
  EXPECT_TRUE(d.trace.fx_frames_without_source);
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_FALSE(names_generated_code(d.ooms[0].layer)) << d.ooms[0].layer;
  EXPECT_NE(d.ooms[0].layer, "modeling_gpt2.py:187 in forward");
  for (const SiteBytes& site : d.oom_sites) EXPECT_FALSE(names_generated_code(site.site)) << site.site;
  const std::string text = render_text(d);
  EXPECT_NE(text.find("dump with torch.cuda.memory._dump_snapshot(augment_with_fx_traces=True)"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace oomtune::diagnose
