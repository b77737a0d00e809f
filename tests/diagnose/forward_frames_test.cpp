// Frames that run in forward although they lie in torch/autograd/ or
// torch/utils/checkpoint.py (checkpoint(), a custom Function's apply:
// flash-attn, bitsandbytes, AOTAutograd), and code torch.compile generated
// (frames.h). The stacks are those PyTorch 2.11 records (sys.setprofile on
// the CPU); the fixtures are scripts/make_snapshot_fixtures.py's.

#include <algorithm>
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

const std::string kTorch = "/venv/lib/python3.11/site-packages/torch";

Frame torch_frame(const std::string& path, const std::string& name, int64_t line) {
  return {kTorch + "/" + path, name, line};
}

// One stack, innermost first, and its phase.
Phase phase_of(const std::vector<Frame>& stack) {
  const Snapshot s = testing::with_stacks({stack});
  return FrameIndex(s).phase(1);
}

TEST(ForwardFrames, CheckpointAndFunctionApplyAreForwardWhereTheyRunInForward) {
  const Frame layer{"/home/me/model.py", "forward", 15};
  const Frame model{"/home/me/model.py", "forward", 20};
  const Frame script{"/home/me/train.py", "<module>", 33};
  const Frame user_backward{"/home/me/model.py", "backward", 10};
  const std::vector<Frame> call = {torch_frame("nn/modules/module.py", "_call_impl", 1790),
                                   torch_frame("nn/modules/module.py", "_wrapped_call_impl", 1779)};
  // checkpoint(use_reentrant=False) in forward.
  EXPECT_EQ(phase_of(testing::join_frames(
                {{layer},
                 call,
                 {torch_frame("utils/checkpoint.py", "checkpoint", 512),
                  torch_frame("_dynamo/eval_frame.py", "_fn", 1263), torch_frame("_compile.py", "inner", 54), model},
                 call,
                 {script}})),
            Phase::kForward);
  // checkpoint(use_reentrant=True) in forward: CheckpointFunction.apply.
  EXPECT_EQ(phase_of(testing::join_frames(
                {{layer},
                 call,
                 {torch_frame("utils/checkpoint.py", "forward", 268), torch_frame("autograd/function.py", "apply", 596),
                  torch_frame("utils/checkpoint.py", "checkpoint", 505), model},
                 call,
                 {script}})),
            Phase::kForward);
  // A @torch.no_grad() helper in forward.
  EXPECT_EQ(phase_of({{"/home/me/model.py", "rotary", 5},
                      torch_frame("autograd/grad_mode.py", "decorate_context", 116),
                      layer,
                      script}),
            Phase::kForward);

  // Recomputation in backward, called from the engine's thread (its
  // outermost Python frame is the unpack hook).
  EXPECT_EQ(phase_of(testing::join_frames(
                {{layer},
                 call,
                 {torch_frame("utils/checkpoint.py", "recompute_fn", 1607),
                  torch_frame("utils/checkpoint.py", "_run_fn_with_dynamo_disabled", 1139),
                  torch_frame("_dynamo/eval_frame.py", "_fn", 1263), torch_frame("_compile.py", "inner", 54),
                  torch_frame("utils/checkpoint.py", "unpack_hook", 1173)}})),
            Phase::kBackward);
  // A custom Function's backward on the engine's thread: BackwardCFunction.apply outermost.
  EXPECT_EQ(phase_of({user_backward, torch_frame("autograd/function.py", "apply", 317)}), Phase::kBackward);
  // The same on the calling thread (CPU): loss.backward() below it.
  EXPECT_EQ(phase_of({user_backward, torch_frame("autograd/function.py", "apply", 317),
                      torch_frame("autograd/graph.py", "_engine_run_backward", 869),
                      torch_frame("autograd/__init__.py", "backward", 381), torch_frame("_tensor.py", "backward", 631),
                      script}),
            Phase::kBackward);
  // Reentrant checkpoint's backward.
  EXPECT_EQ(phase_of(testing::join_frames({{layer},
                                           call,
                                           {torch_frame("utils/checkpoint.py", "backward", 308),
                                            torch_frame("autograd/function.py", "apply", 317)}})),
            Phase::kBackward);
}

// What a stack says about recomputation: only a forward frame inner to
// checkpoint.py's backward-time frames reruns a block (FrameIndex::recomputes).
TEST(ForwardFrames, OnlyAForwardRerunInsideCheckpointsBackwardRecomputes) {
  const Frame layer{"/home/me/model.py", "forward", 15};
  const Frame op = torch_frame("nn/modules/linear.py", "forward", 125);
  auto recomputes = [](const std::vector<Frame>& stack) {
    const Snapshot s = testing::with_stacks({stack});
    return FrameIndex(s).recomputes(1);
  };
  // use_reentrant=False: the unpack hook on the engine's thread reruns the layer.
  EXPECT_TRUE(recomputes({op, layer, torch_frame("utils/checkpoint.py", "recompute_fn", 1607),
                          torch_frame("utils/checkpoint.py", "unpack_hook", 1173)}));
  // use_reentrant=True: CheckpointFunction.backward reruns it ...
  EXPECT_TRUE(recomputes({op, layer, torch_frame("utils/checkpoint.py", "backward", 308),
                          torch_frame("autograd/function.py", "apply", 317)}));
  // ... then runs a nested backward through it: gradients, no forward frame inside.
  EXPECT_FALSE(recomputes({torch_frame("autograd/graph.py", "_engine_run_backward", 869),
                           torch_frame("autograd/__init__.py", "backward", 381),
                           torch_frame("utils/checkpoint.py", "backward", 320),
                           torch_frame("autograd/function.py", "apply", 317)}));
  // The first forward, inside checkpoint(): checkpointed, not recomputed.
  EXPECT_FALSE(recomputes(
      {op, layer, torch_frame("utils/checkpoint.py", "checkpoint", 512), {"/home/me/train.py", "<module>", 33}}));
  // A plain forward, and a custom Function's backward.
  EXPECT_FALSE(recomputes({op, layer, {"/home/me/train.py", "<module>", 33}}));
  EXPECT_FALSE(recomputes({{"/home/me/model.py", "backward", 10}, torch_frame("autograd/function.py", "apply", 317)}));
}

// Before: the out-of-memory in forward read as "Peak in the backward pass",
// its activations as gradients. The same diagnosis as without checkpointing
// and flash-attn but for the trace's counts and checkpointing, which is
// already on (Note [Checkpointing already on], recommendations.cpp).
TEST(ForwardFrames, ACheckpointedFlashAttentionForwardReadsAsWithout) {
  SKIP_IF_MISSING(testing::synthetic_fixture("hf_bert_checkpointed_flash_oom.pickle"));
  nlohmann::json wrapped = testing::fixture_json("hf_bert_checkpointed_flash_oom.pickle");
  nlohmann::json plain = testing::fixture_json("hf_bert_forward_oom.pickle");
  EXPECT_EQ(wrapped["ooms"][0]["phase"], "forward");
  // The 10 forward allocations (4 weights were loaded before) all ran in checkpoint().
  EXPECT_EQ(wrapped["trace"]["forward_alloc_events"], 10);
  EXPECT_EQ(wrapped["trace"]["checkpointed_forward_allocs"], 10);
  EXPECT_EQ(plain["trace"]["checkpointed_forward_allocs"], 0);
  std::vector<std::string> with, without;
  for (const auto& r : wrapped["recommendations"]) with.push_back(r["id"]);
  for (const auto& r : plain["recommendations"]) without.push_back(r["id"]);
  auto has = [](const std::vector<std::string>& ids, const std::string& id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  EXPECT_TRUE(has(without, "activation_checkpointing"));
  EXPECT_FALSE(has(with, "activation_checkpointing"));
  EXPECT_TRUE(has(with, "activation_checkpointing_on"));
  EXPECT_TRUE(has(with, "micro_batch"));
  for (const char* key : {"trace", "recommendations"}) {
    wrapped.erase(key);
    plain.erase(key);
  }
  EXPECT_EQ(wrapped, plain);
}

// Before: "Peak in the backward pass at cdcfax...py:136 in call".
TEST(ForwardFrames, ACompiledModelsForwardIsItsModulesForward) {
  const std::string path = testing::synthetic_fixture("compiled_step_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.phase, Phase::kForward);
  EXPECT_EQ(o.requested_bytes, 16 * kMiB);
  EXPECT_EQ(o.layer, "train.py:13 in forward");
  EXPECT_EQ(o.call_site, "train.py:40 in train_step");
  // Three of the second forward's four 16 MiB kept; the first backward's four 8 MiB gradients.
  EXPECT_EQ(testing::alive_bytes(o, Category::kActivations), 48 * kMiB);
  EXPECT_EQ(testing::alive_bytes(o, Category::kGradients), 32 * kMiB);
  EXPECT_EQ(d.verdicts.front().id, VerdictId::kActivationsInForward);
  for (const SiteBytes& s : d.oom_sites) {
    EXPECT_EQ(s.site.find(" in call"), std::string::npos) << s.site;
    EXPECT_EQ(s.filename.find("torchinductor_"), std::string::npos) << s.filename;
  }
  EXPECT_TRUE(d.trace.generated_frames);
  EXPECT_NE(d.trace.frames_note.find("torch.compile"), std::string::npos) << d.trace.frames_note;
  EXPECT_EQ(d.trace.iterations, 2);
  // The first forward grew by 4 x 16 + 4 MiB: 20 MiB still to come. Its
  // backward rose to 72 MiB above where that forward began, making the
  // gradients, which this iteration holds: adding into them, its backward
  // rises to 40 MiB, below the forward (Note [The rest of the iteration]).
  EXPECT_EQ(d.need.method, NeedMethod::kTrace);
  EXPECT_EQ(d.need.earlier_growth_bytes, 68 * kMiB);
  EXPECT_EQ(d.need.later_peak_bytes, 0);
  EXPECT_EQ(d.need.still_needed_bytes, 20 * kMiB);
}

// A checkpointed run out of memory in backward, recomputing the last layer
// (scripts/make_snapshot_fixtures.py, bert_backward_oom). Before,
// the recomputed tensors counted as gradients (64 MiB "gradients", 40 MiB
// activations), so halving the micro-batch read "not enough alone (frees
// 20.00 MiB, needs 32.00 MiB)".
TEST(ForwardFrames, ARecomputationInBackwardAllocatesActivationsNotGradients) {
  const std::string path = testing::synthetic_fixture("hf_bert_checkpointed_recompute_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.phase, Phase::kBackward);
  EXPECT_TRUE(o.recomputing);
  EXPECT_EQ(o.requested_bytes, 32 * kMiB);
  EXPECT_EQ(o.layer, "modeling_bert.py:466 in forward");
  EXPECT_EQ(testing::alive_bytes(o, Category::kParameters), 96 * kMiB);
  // The embeddings' output and 4 layer outputs (the checkpoints' inputs),
  // and the recomputed q, k, v (8 MiB each) and probabilities (32 MiB).
  EXPECT_EQ(testing::alive_bytes(o, Category::kActivations), 40 * kMiB + 56 * kMiB);
  EXPECT_EQ(testing::alive_bytes(o, Category::kGradients), 8 * kMiB);  // the head's gradient
  EXPECT_EQ(o.allocated_bytes, 200 * kMiB);
  EXPECT_EQ(d.trace.checkpointed_forward_allocs, 24);  // 4 layers x 6 tensors
  EXPECT_EQ(d.trace.recomputed_backward_allocs, 4);    // q, k, v, probabilities; the intermediate failed
  EXPECT_EQ(d.trace.iterations, 1);
  EXPECT_TRUE(d.leaks.empty());
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(d.verdicts.front().id, VerdictId::kBackwardPeak);
  EXPECT_NE(d.verdicts.front().evidence.find("recomputed a checkpointed block's forward"), std::string::npos)
      << d.verdicts.front().evidence;
  const auto find = [&](FixId id) {
    return std::find_if(d.recommendations.begin(), d.recommendations.end(),
                        [&](const Recommendation& r) { return r.id == id; });
  };
  EXPECT_EQ(find(FixId::kActivationCheckpointing), d.recommendations.end());
  EXPECT_NE(find(FixId::kCheckpointingOn), d.recommendations.end());
  // Note [Recomputed block]: the last layer's forward went on from the
  // intermediate (32 MiB) to the output (8 MiB), freeing nothing between.
  EXPECT_EQ(d.need.method, NeedMethod::kRecomputedBlock) << d.need.estimate;
  EXPECT_TRUE(d.need.lower_bound);
  EXPECT_EQ(d.need.still_needed_bytes, 40 * kMiB);
  EXPECT_EQ(d.need.recomputed_allocs, 5);  // q, k, v, probabilities and the failing intermediate
  const auto micro_batch = find(FixId::kMicroBatch);
  ASSERT_NE(micro_batch, d.recommendations.end());
  // Half of the 96 MiB of activations and of the 40 MiB still to come.
  EXPECT_EQ(micro_batch->frees_bytes, 68 * kMiB);
  EXPECT_EQ(micro_batch->sufficiency, Sufficiency::kEnoughForRecomputation);
  EXPECT_NE(sufficiency_text(*micro_batch).find("the block's backward after it is not counted"), std::string::npos);
}

// The same run with a masked-LM head whose tied embedding gradient stays
// alive through backward: the recomputation fails at its probabilities, with
// most of the block still to come. The bytes are the generator's
// (make_snapshot_fixtures.py, bert_backward_oom); that halving the
// micro-batch does not save it, tests/scripts/recompute_fixture_test.py.
TEST(ForwardFrames, ARecomputationNeedsTheRestOfItsBlockAsItRanInForward) {
  const std::string path = testing::synthetic_fixture("hf_bert_checkpointed_recompute_tied_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_TRUE(o.recomputing);
  EXPECT_EQ(o.layer, "modeling_bert.py:360 in forward");
  EXPECT_EQ(o.allocated_bytes, 200 * kMiB);
  EXPECT_EQ(testing::alive_bytes(o, Category::kActivations), 40 * kMiB + 24 * kMiB);
  EXPECT_EQ(testing::alive_bytes(o, Category::kGradients), 8 * kMiB + 32 * kMiB);
  // The probabilities, the intermediate and the output, as the 4th layer ran them in forward.
  EXPECT_EQ(d.need.method, NeedMethod::kRecomputedBlock) << d.need.estimate;
  EXPECT_EQ(d.need.still_needed_bytes, 72 * kMiB);
  EXPECT_EQ(d.need.recomputed_allocs, 4);
  ASSERT_GE(d.need.forward_first_event, 0);
  const TraceEvent& counterpart = load_snapshot(path).device_traces[0][static_cast<size_t>(d.need.forward_first_event)];
  EXPECT_EQ(counterpart.action, TraceAction::kAlloc);
  EXPECT_EQ(counterpart.size, 32 * kMiB);
  EXPECT_GT(d.need.forward_last_event, d.need.forward_first_event);
  const auto micro_batch = std::find_if(d.recommendations.begin(), d.recommendations.end(),
                                        [](const Recommendation& r) { return r.id == FixId::kMicroBatch; });
  ASSERT_NE(micro_batch, d.recommendations.end());
  EXPECT_EQ(micro_batch->frees_bytes, (64 + 72) / 2 * kMiB);
  EXPECT_EQ(micro_batch->needs_bytes, 72 * kMiB);
  // Judged against the request alone (32 MiB), it read enough.
  EXPECT_EQ(micro_batch->sufficiency, Sufficiency::kNotEnough);
}

// The index of the n-th allocation before the trace's first out-of-memory
// (n = 1: the last one); the trace's size when there is none.
size_t alloc_before_oom(const std::vector<TraceEvent>& trace, size_t n) {
  const auto oom =
      std::find_if(trace.begin(), trace.end(), [](const TraceEvent& e) { return e.action == TraceAction::kOom; });
  size_t seen = 0;
  for (auto i = static_cast<size_t>(oom - trace.begin()); i-- > 0;) {
    if (trace[i].action == TraceAction::kAlloc && ++seen == n) return i;
  }
  return trace.size();
}

// A recomputation whose allocations forward never made in a row (shapes
// that differ between the runs) falls back to the request.
TEST(ForwardFrames, ARecomputationUnlikeItsForwardNeedsOnlyTheRequest) {
  const std::string path = testing::synthetic_fixture("hf_bert_checkpointed_recompute_tied_oom.pickle");
  SKIP_IF_MISSING(path);
  Snapshot s = load_snapshot(path);
  std::vector<TraceEvent>& trace = s.device_traces[0];
  // The recomputed value (8 MiB, modeling_bert.py:331, the allocation before the failing one) 1 KiB larger.
  const size_t recomputed_v = alloc_before_oom(trace, 1);
  ASSERT_LT(recomputed_v, trace.size());
  trace[recomputed_v].size += 1024;
  const Diagnosis d = diagnose(s, path, {});
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_TRUE(d.ooms[0].recomputing);
  EXPECT_EQ(d.need.method, NeedMethod::kRequest) << d.need.estimate;
  EXPECT_EQ(d.need.still_needed_bytes, 32 * kMiB);
}

// The tied run with half the micro-batch (make_snapshot_fixtures.py,
// bert_backward_oom(embedding_grad, micro_batch_divisor=2)): out of
// memory in the third block's backward, at the intermediate's gradient
// (16 MiB, no frames), after the recomputation and backward of two blocks.
// A block's turn, in MiB: it recomputes q, k, v (4 each), the probabilities
// (16), the intermediate (16) and the output (4): 48; then BertOutput's
// weight gradient (8): 56 (where this block failed); the intermediate's
// gradient (16): 72; frees the output: 68; BertIntermediate's weight
// gradient (8) and the attention output's gradient (4): 80, the peak; it
// ends having kept 20 (three 8 MiB weight gradients and the 4 MiB gradient
// it passes on, less its 4 MiB input and the 4 MiB gradient it got). One
// block is left after it: 80 - 56 + 20 = 44 MiB, what the same run without
// the cap allocates beyond the 248 MiB at the out-of-memory
// (tests/scripts/recompute_fixture_test.py).
TEST(ForwardFrames, ABlockInBackwardNeedsWhatThePreviousBlockGrewByAndKept) {
  const std::string path = testing::synthetic_fixture("hf_bert_checkpointed_backward_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.phase, Phase::kBackward);
  EXPECT_FALSE(o.recomputing);
  EXPECT_EQ(o.requested_bytes, 16 * kMiB);
  EXPECT_EQ(o.allocated_bytes, 248 * kMiB);
  EXPECT_EQ(d.need.method, NeedMethod::kBackwardBlocks) << d.need.estimate;
  EXPECT_TRUE(d.need.lower_bound);
  EXPECT_EQ(d.need.block_peak_bytes, 80 * kMiB);
  EXPECT_EQ(d.need.block_net_bytes, 20 * kMiB);
  EXPECT_EQ(d.need.block_so_far_bytes, 56 * kMiB);
  EXPECT_EQ(d.need.blocks_done, 2);
  EXPECT_EQ(d.need.model_blocks, 4);
  EXPECT_EQ(d.need.blocks_after, 1);
  EXPECT_EQ(d.need.still_needed_bytes, 44 * kMiB);
  // Half of the 60 MiB of activations alive; the need's own share is not
  // counted (it holds weight gradients, which no micro-batch shrinks). The
  // same run at a quarter of the micro-batch runs out of memory too.
  const auto micro_batch = std::find_if(d.recommendations.begin(), d.recommendations.end(),
                                        [](const Recommendation& r) { return r.id == FixId::kMicroBatch; });
  ASSERT_NE(micro_batch, d.recommendations.end());
  EXPECT_EQ(micro_batch->frees_bytes, 30 * kMiB);
  EXPECT_EQ(micro_batch->sufficiency, Sufficiency::kNotEnough);
  const nlohmann::json j = nlohmann::json::parse(render_json(d));
  EXPECT_EQ(j["need"]["method"], "backward_blocks");
  EXPECT_EQ(j["need"]["block_peak_bytes"], 80 * kMiB);
}

// The same fine-tuning without checkpointing, at an eighth of the
// micro-batch (make_snapshot_fixtures.py, bert_backward_oom(208 MiB,
// micro_batch_divisor=8, checkpointing=False)): out of memory at the first
// layer's first weight gradient (8 MiB), after the backward of three. A
// block's turn starts where backward frees its intermediate (4 MiB,
// modeling_bert.py:466, the first tensor of forward's that backward frees
// again), in MiB: frees it and its gradient (-8), the probabilities'
// gradient (+4), frees the probabilities (-4), a weight gradient (+8): 0;
// frees q, k, v, the probabilities' gradient, the incoming gradient and the
// layer's input (-9), the last of forward's tensors it frees: up to there it
// peaked at its start, 0; then the next layer's gradients begin, 8 + 4 + 8
// + 1: it ends 12 higher, its peak. This turn (layer 2's) had reached -9:
// 21 MiB more to its end; layer 1's turn, the last, starts there and peaks
// at its start (its frees come first): at least 21 MiB, what the same run
// without the cap allocates beyond the 182 MiB at the out-of-memory
// (tests/scripts/recompute_fixture_test.py).
TEST(ForwardFrames, ABlockInAPlainBackwardNeedsWhatThePreviousBlockGrewBy) {
  const std::string path = testing::synthetic_fixture("hf_bert_backward_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.phase, Phase::kBackward);
  EXPECT_FALSE(o.recomputing);
  EXPECT_EQ(o.requested_bytes, 8 * kMiB);
  EXPECT_EQ(o.allocated_bytes, 182 * kMiB);
  EXPECT_EQ(d.trace.recomputed_backward_allocs, 0);
  EXPECT_EQ(d.need.method, NeedMethod::kBackwardBlocks) << d.need.estimate;
  EXPECT_TRUE(d.need.lower_bound);
  EXPECT_EQ(d.need.block_peak_bytes, 12 * kMiB);
  EXPECT_EQ(d.need.last_block_peak_bytes, 0);
  EXPECT_EQ(d.need.block_net_bytes, 12 * kMiB);
  EXPECT_EQ(d.need.block_so_far_bytes, -9 * kMiB);
  EXPECT_EQ(d.need.blocks_done, 2);
  EXPECT_EQ(d.need.blocks_after, 1);
  EXPECT_EQ(d.need.model_blocks, 4);
  EXPECT_EQ(d.need.still_needed_bytes, 21 * kMiB);
}

// The same run cut at its third block's recomputation of the probabilities
// (16 MiB), made the out-of-memory: the previous block's turn counts the
// block's backward too: 80 - 12 (q, k, v) + 20 (the block after) = 88 MiB,
// where the forward's run alone (rule 5) gives 36.
TEST(ForwardFrames, ARecomputationPastTheFirstBlockCountsTheBlocksBackward) {
  const std::string path = testing::synthetic_fixture("hf_bert_checkpointed_backward_oom.pickle");
  SKIP_IF_MISSING(path);
  Snapshot s = load_snapshot(path);
  std::vector<TraceEvent>& trace = s.device_traces[0];
  // Back from the out-of-memory: the weight gradient (8 MiB), the output
  // (4), the intermediate (16), the probabilities (16).
  const size_t probabilities = alloc_before_oom(trace, 4);
  ASSERT_LT(probabilities, trace.size());
  ASSERT_EQ(trace[probabilities].size, 16 * kMiB);
  trace[probabilities].action = TraceAction::kOom;
  trace[probabilities].addr = 70 * kGiB;  // device_free
  trace.resize(probabilities + 1);
  const Diagnosis d = diagnose(s, path, {});
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_TRUE(d.ooms[0].recomputing);
  EXPECT_EQ(d.ooms[0].layer, "modeling_bert.py:360 in forward");
  EXPECT_EQ(d.need.method, NeedMethod::kBackwardBlocks) << d.need.estimate;
  EXPECT_EQ(d.need.block_so_far_bytes, 12 * kMiB);
  EXPECT_EQ(d.need.still_needed_bytes, 88 * kMiB);
}

// A block whose recomputation differs from the previous block's (other
// shapes) says nothing of its own turn: the request alone.
TEST(ForwardFrames, ABlockUnlikeThePreviousInBackwardNeedsOnlyTheRequest) {
  const std::string path = testing::synthetic_fixture("hf_bert_checkpointed_backward_oom.pickle");
  SKIP_IF_MISSING(path);
  Snapshot s = load_snapshot(path);
  std::vector<TraceEvent>& trace = s.device_traces[0];
  // The third block's recomputed output (4 MiB, the allocation before its weight gradient) 1 KiB larger.
  const size_t output = alloc_before_oom(trace, 2);
  ASSERT_LT(output, trace.size());
  ASSERT_EQ(trace[output].size, 4 * kMiB);
  trace[output].size += 1024;
  const Diagnosis d = diagnose(s, path, {});
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.need.method, NeedMethod::kRequest) << d.need.estimate;
  EXPECT_EQ(d.need.still_needed_bytes, 16 * kMiB);
}

// A forward without autograd: a no_grad/inference_mode decorator or Hugging
// Face's generation code outer to the model's forward (FrameIndex::inference).
TEST(ForwardFrames, ANoGradDecoratorOrGenerateAroundTheModelIsInference) {
  const std::string hf = "/venv/lib/python3.11/site-packages/transformers";
  const Frame op = torch_frame("nn/modules/linear.py", "forward", 134);
  const Frame layer{hf + "/models/llama/modeling_llama.py", "forward", 252};
  const Frame generate{hf + "/generation/utils.py", "generate", 3008};
  const Frame decorator = torch_frame("utils/_contextlib.py", "decorate_context", 124);
  const Frame script{"/home/me/generate.py", "<module>", 20};
  auto inference = [](const std::vector<Frame>& stack) {
    const Snapshot s = testing::with_stacks({stack});
    return FrameIndex(s).inference(1);
  };
  auto kind = [](const std::vector<Frame>& stack) {
    const Snapshot s = testing::with_stacks({stack});
    return FrameIndex(s).inference_kind(1);
  };
  EXPECT_TRUE(inference({op, layer, {hf + "/generation/utils.py", "_sample", 3208}, generate, decorator, script}));
  // generate() is itself decorated: the generation frame, inner to the decorator, names it.
  EXPECT_EQ(kind({op, layer, generate, decorator, script}), InferenceKind::kGenerate);
  EXPECT_EQ(kind({op, layer, decorator, script}), InferenceKind::kNoGrad);
  // generate()'s own tensors (the float32 logits it copies) have no forward frame.
  EXPECT_TRUE(inference({{hf + "/generation/utils.py", "_sample", 3248}, generate, decorator, script}));
  // An evaluation function decorated with @torch.no_grad(), on torch 1.13.
  EXPECT_TRUE(inference({op,
                         {"/home/me/model.py", "forward", 20},
                         {"/usr/lib/python3/dist-packages/torch/autograd/grad_mode.py", "decorate_context", 27},
                         {"/home/me/train.py", "evaluate", 60},
                         script}));
  // A @torch.no_grad() helper inside a training forward is not inference.
  EXPECT_FALSE(
      inference({{"/home/me/model.py", "rotary", 5}, decorator, {"/home/me/model.py", "forward", 15}, script}));
  EXPECT_FALSE(inference({op, {"/home/me/model.py", "forward", 15}, script}));
  // LBFGS.step (decorated with no_grad) runs the closure through
  // torch.enable_grad()(closure): the same decorator frame, in a training step.
  EXPECT_FALSE(inference({op,
                          {"/home/me/model.py", "forward", 15},
                          {"/home/me/train.py", "closure", 40},
                          decorator,
                          torch_frame("optim/lbfgs.py", "step", 330),
                          decorator,
                          script}));
}

// Hugging Face generate() out of memory in a Llama's prefill
// (make_snapshot_fixtures.py, llama_generate_oom). Before: "Activations in
// the forward pass: activations kept for backward held 144.00 MiB", and
// activation checkpointing recommended, which a forward under no_grad
// cannot use.
TEST(ForwardFrames, AGenerateOutOfMemoryIsInferenceAndGetsNoTrainingFixes) {
  const std::string path = testing::synthetic_fixture("hf_llama_generate_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.phase, Phase::kForward);
  EXPECT_TRUE(o.inference());
  EXPECT_EQ(o.requested_bytes, 64 * kMiB);
  EXPECT_EQ(o.layer, "modeling_llama.py:197 in eager_attention_forward");
  EXPECT_EQ(testing::alive_bytes(o, Category::kParameters), 192 * kMiB);
  // The KV cache (4 layers x 2 x 16 MiB) and the 16 MiB hidden state.
  EXPECT_EQ(testing::alive_bytes(o, Category::kActivations), 128 * kMiB + 16 * kMiB);
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(d.verdicts.front().id, VerdictId::kInferenceForward);
  for (const Verdict& v : d.verdicts) EXPECT_NE(v.id, VerdictId::kActivationsInForward);
  // Note [Blocks without autograd]: a layer makes its keys and values (2 x
  // 16 MiB, kept), then its 64 MiB of probabilities (freed), then its 16 MiB
  // output (the hidden state before it freed): 96 MiB above its start at its
  // highest, 32 MiB at its end. The 4th layer had made its 32 MiB: the rest
  // is the 64 MiB request. The six 32 MiB weights, all alike, show no
  // blocks, so the layers after it are not counted: a lower bound.
  EXPECT_EQ(d.need.method, NeedMethod::kInferenceBlocks) << d.need.estimate;
  EXPECT_EQ(d.need.still_needed_bytes, 64 * kMiB);
  EXPECT_TRUE(d.need.lower_bound);
  EXPECT_EQ(d.need.blocks_done, 3);
  EXPECT_EQ(d.need.block_bytes, 32 * kMiB);
  EXPECT_EQ(d.need.block_so_far_bytes, 32 * kMiB);
  for (const Recommendation& r : d.recommendations) {
    EXPECT_NE(r.id, FixId::kActivationCheckpointing);
    EXPECT_NE(r.id, FixId::kCheckpointingOn);
  }
  ASSERT_FALSE(d.recommendations.empty());
  const Recommendation& first = d.recommendations.front();
  EXPECT_EQ(first.id, FixId::kMicroBatch);
  EXPECT_EQ(first.change, "Halve the batch passed to generate()");
  EXPECT_EQ(first.frees_bytes, (144 * kMiB + 64 * kMiB) / 2);  // half the kept tensors and the request
  // Note [Enough for how many blocks]: 104 MiB freed, half of it the need's
  // share: 104 - 32 = 72 MiB fixed covers a need of 144 MiB, 64 now and two
  // more layers of 32 MiB: the current one's, none known after it, and 2.
  EXPECT_EQ(first.sufficiency, Sufficiency::kEnoughUpToBlocks);
  EXPECT_EQ(first.most_blocks, 3 + 1 + 2);
}

}  // namespace
}  // namespace oomtune::diagnose
