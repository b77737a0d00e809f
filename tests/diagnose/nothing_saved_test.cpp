// A forward whose blocks kept nothing for backward reads as inference
// (Note [Blocks that kept nothing], diagnose/nothing_saved.h): on traces
// built here, where what each block keeps is known, and on the fixture
// hf_llama_no_grad_oom.pickle (scripts/make_snapshot_fixtures.py), a Llama
// called in a `with torch.no_grad():` block.

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/byte_size.h"
#include "diagnose/attribution.h"
#include "diagnose/diagnosis.h"
#include "diagnose/frames.h"
#include "diagnose/nothing_saved.h"
#include "diagnose/render.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

const std::string kSite = "/venv/lib/python3.12/site-packages";
const std::string kModel = "/home/user/model.py";

Frame model_line(int64_t line) { return {kModel, "forward", line}; }

// A forward of blocks, each: two temporaries (layers at model.py:11 and
// :12), the block's output (:13), which the next block reads; what a block
// keeps for backward, and the KV cache entries it stores, are the caller's.
class Forward {
 public:
  enum Stack : StackId { kEmbedding = 1, kFirst, kSecond, kOutput, kCache, kCheckpointed };

  Forward()
      : s_(testing::with_stacks({
            {model_line(10)},
            {model_line(11)},
            {model_line(12)},
            {model_line(13)},
            {{kSite + "/transformers/cache_utils.py", "update", 136}, model_line(14)},
            {model_line(11),
             {kSite + "/torch/utils/checkpoint.py", "checkpoint", 512},
             {kSite + "/torch/nn/modules/module.py", "_call_impl", 1790}},
        })) {
    hidden_ = alloc(kEmbedding, kMiB);
  }

  // One block: `keep_second` keeps the second temporary (as autograd keeps
  // a saved tensor), `cache` stores a KV cache entry, `checkpointed` runs
  // the first temporary inside torch.utils.checkpoint.
  void block(bool keep_second = false, bool cache = false, bool checkpointed = false) {
    const int64_t first = alloc(checkpointed ? kCheckpointed : kFirst, kMiB);
    if (cache) alloc(kCache, kMiB);
    const int64_t second = alloc(kSecond, 2 * kMiB);
    free(first);
    const int64_t out = alloc(kOutput, kMiB);
    if (!keep_second) free(second);
    free(hidden_);
    hidden_ = out;
  }

  // The next block's first temporary, then the second's out-of-memory; or,
  // `second_made`, both temporaries, then the output's out-of-memory.
  void oom(bool second_made = false) {
    const int64_t first = alloc(kFirst, kMiB);
    if (second_made) {
      alloc(kSecond, 2 * kMiB);
      free(first);
    }
    TraceEvent e;
    e.action = TraceAction::kOom;
    e.size = second_made ? kMiB : 2 * kMiB;
    e.frames = second_made ? kOutput : kSecond;
    trace().push_back(e);
  }

  NothingSaved evidence() const {
    const FrameIndex frames(s_);
    const std::vector<TraceEvent>& t = s_.device_traces[0];
    return blocks_kept_nothing(t, attribute(t, frames), frames, t.size() - 1);
  }

 private:
  std::vector<TraceEvent>& trace() {
    if (s_.device_traces.empty()) s_.device_traces.emplace_back();
    return s_.device_traces[0];
  }
  int64_t alloc(StackId stack, int64_t bytes) {
    const int64_t addr = next_addr_;
    next_addr_ += bytes;
    sizes_[addr] = bytes;
    TraceEvent e;
    e.action = TraceAction::kAlloc;
    e.addr = addr;
    e.size = bytes;
    e.frames = stack;
    trace().push_back(e);
    return addr;
  }
  void free(int64_t addr) {
    for (TraceAction action : {TraceAction::kFreeRequested, TraceAction::kFreeCompleted}) {
      TraceEvent e;
      e.action = action;
      e.addr = addr;
      e.size = sizes_[addr];
      e.frames = kOutput;
      trace().push_back(e);
    }
  }

  Snapshot s_;
  int64_t next_addr_ = 1 << 30;
  int64_t hidden_ = 0;
  std::unordered_map<int64_t, int64_t> sizes_;
};

TEST(NothingSaved, BlocksThatFreedAllTheyMadeKeptNothing) {
  Forward f;
  for (int i = 0; i < 4; ++i) f.block();
  f.oom();
  const NothingSaved n = f.evidence();
  ASSERT_TRUE(n.found());
  EXPECT_EQ(n.block_allocations, 3);
  // The run: the embedding, 4 blocks of 3, the 5th block's first. Its
  // stretch of blocks: 13 allocations; but the last two blocks' worth, 7:
  // blocks 1 and 2 and block 3's first temporary, 1 + 2 + 1 MiB a block.
  EXPECT_EQ(n.freed_allocations, 7);
  EXPECT_EQ(n.freed_bytes, 9 * kMiB);
  EXPECT_LT(n.first_event, n.last_event);
  // Blocks 0 to 3 and the 5th block's first allocation: 13 in the stretch,
  // each period's first the block's first temporary.
  EXPECT_EQ(n.stretch_allocations, 13);
  ASSERT_EQ(n.block_first_events.size(), 5u);
  EXPECT_EQ(n.block_first_events[0], n.first_event);
  for (size_t k = 1; k < n.block_first_events.size(); ++k)
    EXPECT_LT(n.block_first_events[k - 1], n.block_first_events[k]);
}

TEST(NothingSaved, BlocksThatKeepATensorForBackwardKeptSomething) {
  Forward f;
  for (int i = 0; i < 4; ++i) f.block(/*keep_second=*/true);
  f.oom();
  EXPECT_FALSE(f.evidence().found());
}

TEST(NothingSaved, OneBlockKeepingATensorIsEnoughToReadTraining) {
  Forward f;
  f.block(/*keep_second=*/true);
  for (int i = 0; i < 3; ++i) f.block();
  f.oom();
  EXPECT_FALSE(f.evidence().found());
}

TEST(NothingSaved, KvCacheEntriesAreNotWhatAutogradKeeps) {
  Forward f;
  for (int i = 0; i < 4; ++i) f.block(/*keep_second=*/false, /*cache=*/true);
  f.oom();
  const NothingSaved n = f.evidence();
  ASSERT_TRUE(n.found());
  EXPECT_EQ(n.block_allocations, 4);
  // The stretch holds 4 blocks of 4 and the 5th's first: 17 allocations; but
  // the last 8 (9): blocks 1 and 2 (4 each) and block 3's first; the 2 cache
  // entries among them do not count.
  EXPECT_EQ(n.freed_allocations, 7);
  EXPECT_EQ(n.freed_bytes, 9 * kMiB);
}

TEST(NothingSaved, TwoBlocksAreNotEvidence) {
  Forward f;
  for (int i = 0; i < 2; ++i) f.block();
  f.oom();
  EXPECT_FALSE(f.evidence().found());  // 7 allocations of blocks: 2 1/3 periods
  f = Forward();
  for (int i = 0; i < 3; ++i) f.block();
  f.oom();
  EXPECT_TRUE(f.evidence().found());
}

// GPT-2 under no_grad on an H200 ran out of memory late in its third block
// (Note [Blocks that kept nothing]): two blocks and two thirds of a third
// are 8 allocations, 2 2/3 periods; the first block's two temporaries, both
// freed, are the evidence (its output is among the last two periods).
TEST(NothingSaved, TwoBlocksAndMostOfAThirdAreEvidence) {
  Forward f;
  for (int i = 0; i < 2; ++i) f.block();
  f.oom(/*second_made=*/true);
  const NothingSaved n = f.evidence();
  ASSERT_TRUE(n.found());
  EXPECT_EQ(n.block_allocations, 3);
  EXPECT_EQ(n.freed_allocations, 2);
  EXPECT_EQ(n.freed_bytes, 3 * kMiB);
  f = Forward();
  f.block(/*keep_second=*/true);  // autograd keeps the first block's second temporary
  f.block();
  f.oom(/*second_made=*/true);
  EXPECT_FALSE(f.evidence().found());
}

TEST(NothingSaved, ACheckpointedForwardIsNotRead) {
  Forward f;
  for (int i = 0; i < 4; ++i) f.block(/*keep_second=*/false, /*cache=*/false, /*checkpointed=*/true);
  f.oom();
  EXPECT_FALSE(f.evidence().found());
}

// The fixture: a 4-layer Llama's forward called in `with torch.no_grad():`,
// out of memory at the 4th layer's attention probabilities (64 MiB); each
// layer stores its keys and values in the KV cache (2 x 16 MiB) and frees
// its probabilities and, in the next layer, its output (16 MiB).
TEST(NothingSaved, ALlamaCalledUnderNoGradIsInferenceAndGetsNoTrainingFixes) {
  const std::string path = testing::synthetic_fixture("hf_llama_no_grad_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.phase, Phase::kForward);
  EXPECT_EQ(o.inference_kind, InferenceKind::kNothingSaved);
  EXPECT_EQ(o.call_site, "infer.py:20 in <module>");
  // The first layer's probabilities and output; the cache entries aside.
  EXPECT_EQ(o.nothing_saved.block_allocations, 4);
  EXPECT_EQ(o.nothing_saved.freed_allocations, 2);
  EXPECT_EQ(o.nothing_saved.freed_bytes, 80 * kMiB);
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(d.verdicts.front().id, VerdictId::kInferenceForward);
  EXPECT_NE(d.verdicts.front().evidence.find("freed all 2 allocations they made (80.00 MiB)"), std::string::npos)
      << d.verdicts.front().evidence;
  for (const Verdict& v : d.verdicts) EXPECT_NE(v.id, VerdictId::kActivationsInForward);
  for (const Recommendation& r : d.recommendations) {
    EXPECT_NE(r.id, FixId::kActivationCheckpointing);
    EXPECT_NE(r.id, FixId::kCheckpointingOn);
  }
  ASSERT_FALSE(d.recommendations.empty());
  EXPECT_EQ(d.recommendations.front().change, "Halve the batch passed to the model");
  const nlohmann::json j = nlohmann::json::parse(render_json(d));
  EXPECT_EQ(j["ooms"][0]["inference_kind"], "nothing_saved");
  EXPECT_EQ(j["ooms"][0]["nothing_saved"]["freed_bytes"], 80 * kMiB);
}

// The same run with the first layer's probabilities never freed (as
// autograd keeps a softmax's output for backward) reads as training.
TEST(NothingSaved, TheSameLlamaKeepingItsProbabilitiesReadsAsTraining) {
  const std::string path = testing::synthetic_fixture("hf_llama_no_grad_oom.pickle");
  SKIP_IF_MISSING(path);
  Snapshot s = load_snapshot(path);
  std::vector<TraceEvent>& trace = s.device_traces[0];
  const auto probs = std::find_if(trace.begin(), trace.end(), [](const TraceEvent& e) {
    return e.action == TraceAction::kAlloc && e.size == 64 * kMiB;
  });
  ASSERT_NE(probs, trace.end());
  const int64_t addr = probs->addr;
  // Its free (requested, completed) before the block reuses the address.
  const auto next_alloc = std::find_if(
      probs + 1, trace.end(), [&](const TraceEvent& e) { return e.action == TraceAction::kAlloc && e.addr == addr; });
  const auto kept = std::remove_if(probs + 1, next_alloc, [&](const TraceEvent& e) {
    return (e.action == TraceAction::kFreeRequested || e.action == TraceAction::kFreeCompleted) && e.addr == addr;
  });
  ASSERT_NE(kept, next_alloc);
  trace.erase(kept, next_alloc);
  const Diagnosis d = diagnose(s, path, {});
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].inference_kind, InferenceKind::kNone);
  EXPECT_FALSE(d.ooms[0].nothing_saved.found());
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(d.verdicts.front().id, VerdictId::kActivationsInForward);
}

}  // namespace
}  // namespace oomtune::diagnose
