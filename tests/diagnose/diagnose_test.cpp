// The analyses on the real H100 snapshots and on the synthetic ones. The
// expected numbers come from the fixtures' own README (real) or from the
// scenarios in scripts/make_snapshot_fixtures.py (synthetic), computed by hand.

#include "diagnose/diagnosis.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/byte_size.h"
#include "diagnose/render.h"
#include "diagnose/replay.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

int64_t cat(const CategoryBytes& c, Category k) { return c[static_cast<size_t>(k)]; }

std::string name(VerdictId id) { return verdict_name(id); }
std::string name(FixId id) { return fix_name(id); }

bool has_recommendation(const Diagnosis& d, const std::string& id) {
  for (const auto& r : d.recommendations) {
    if (fix_name(r.id) == id) return true;
  }
  return false;
}

// The cap the process ran under (set_per_process_memory_fraction) lies in
// [reserved, reserved + segment) at an oom the cap refused.
void expect_cap_within(const OomReport& o, int64_t cap) {
  EXPECT_TRUE(o.memory_cap) << "event " << o.event_index;
  EXPECT_LE(o.reserved_bytes, cap) << "event " << o.event_index;
  EXPECT_LT(cap, o.reserved_bytes + o.segment_bytes) << "event " << o.event_index;
  // The bounds the trace gives (the most it reserved, the least segment a
  // cap refused) hold the real cap too.
  EXPECT_LE(o.cap_low_bytes, cap) << "event " << o.event_index;
  EXPECT_LT(cap, o.cap_high_bytes) << "event " << o.event_index;
  EXPECT_GE(o.cap_low_bytes, o.reserved_bytes) << "event " << o.event_index;
  EXPECT_LE(o.cap_high_bytes, o.reserved_bytes + o.segment_bytes) << "event " << o.event_index;
}

TEST(BlockSplit, FollowsTheCachingAllocatorRules) {
  // Large pool: a 10.5 MiB free block serving 9.5 MiB leaves exactly 1 MiB:
  // not MORE than kSmallSize, so it is handed out whole (the real fixture's
  // 11010048-byte blocks show this).
  EXPECT_FALSE(block_would_split(true, false, 11010048, 9961472, INT64_MAX));
  EXPECT_TRUE(block_would_split(true, false, 20 * kMiB, 9961472, INT64_MAX));
  EXPECT_FALSE(block_would_split(true, false, 40 * kMiB, 20 * kMiB, 16 * kMiB));  // oversize: never split
  EXPECT_TRUE(block_would_split(false, false, 2 * kMiB, 2 * kMiB - 512, INT64_MAX));
  EXPECT_FALSE(block_would_split(false, false, 2 * kMiB, 2 * kMiB, INT64_MAX));
  EXPECT_TRUE(block_would_split(true, true, 20 * kMiB, 20 * kMiB - 512, INT64_MAX));  // expandable
}

TEST(DiagnoseReal, FragmentationFixture) {
  const std::string path = testing::real_fixture("oom_fragmentation.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(name(d.verdicts.front().id), "fragmentation");
  ASSERT_EQ(d.ooms.size(), 2u);
  const OomReport& o = d.ooms.back();
  // README: "Tried to allocate 512.00 MiB ... 1.88 GiB is allocated by PyTorch, and 2.08 GiB is reserved by
  // PyTorch but unallocated". 203 segments of 20 MiB, each with one 9.5 MiB tensor and a 10.5 MiB hole.
  EXPECT_EQ(o.requested_bytes, 512 * kMiB);
  EXPECT_EQ(o.allocated_bytes, int64_t{203} * 9961472);       // 1.88 GiB
  EXPECT_EQ(o.reserved_bytes, 203 * 20 * kMiB);               // 3.96 GiB
  EXPECT_EQ(o.reserved_free_bytes, int64_t{203} * 11010048);  // 2.08 GiB
  EXPECT_EQ(o.largest_free_block_bytes, 11010048);            // 10.5 MiB, "about 10 MiB"
  EXPECT_TRUE(o.large_pool);
  EXPECT_TRUE(o.fragmentation);
  EXPECT_EQ(o.device_free_bytes, 80207872000);
  // The first oom (while filling) was not fragmentation: every segment was full.
  EXPECT_FALSE(d.ooms.front().fragmentation);
  EXPECT_EQ(d.ooms.front().allocated_bytes, d.ooms.front().reserved_bytes);
  ASSERT_FALSE(d.recommendations.empty());
  EXPECT_EQ(name(d.recommendations.front().id), "expandable_segments");
  EXPECT_EQ(d.recommendations.front().change, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
  // Note [Allocator settings replayed]: with expandable segments the 408
  // tensors of 9.5 MiB sit back to back and every other one is freed; the
  // live ones end at tensor 405, 3847.5 MiB, so once the free pages past
  // it are unmapped 193 pages of 20 MiB (3860 MiB) stay: 200 MiB less than
  // the 203 segments of 20 MiB, not the 2.08 GiB of holes. PyTorch checks
  // the cap against the request's whole 512 MiB (alloc_block), so it fits
  // only under a cap of 3860 + 512 = 4372 MiB; the cap was 4 GiB.
  EXPECT_EQ(d.recommendations.front().frees_bytes, 200 * kMiB);
  EXPECT_EQ(d.recommendations.front().sufficiency, Sufficiency::kEnoughIfCapAtLeast);
  EXPECT_GE(d.recommendations.front().smallest_cap_bytes, 4372 * kMiB);
  EXPECT_LE(d.recommendations.front().smallest_cap_bytes, 4374 * kMiB);  // bisection to 2 MiB
  EXPECT_EQ(d.expandable_replay.reserved_bytes, 3860 * kMiB);
  EXPECT_TRUE(d.trace.replay_matches_dump);
  EXPECT_EQ(d.trace.inconsistencies, 0);
  // README: "4.00 GiB allowed", on an 80 GB H100 that had 74.7 GiB free.
  for (const OomReport& oom : d.ooms) expect_cap_within(oom, int64_t{4} << 30);
  EXPECT_EQ(name(d.verdicts.back().id), "memory_cap");
  // The first error came at 4080 MiB reserved (204 full 20 MiB segments),
  // the cap refusing a 20 MiB segment: the cap lies in [4080, 4100) MiB,
  // and the trace never reserved more than those 4080.
  EXPECT_EQ(o.cap_low_bytes, 4080 * kMiB);
  EXPECT_EQ(o.cap_high_bytes, 4100 * kMiB);
  EXPECT_NE(d.verdicts.back().evidence.find("between 3.98 GiB (the most the trace reserved before) and 4.00 GiB (an "
                                            "earlier error's segment)"),
            std::string::npos)
      << d.verdicts.back().evidence;
  // The cap is said last among the changes: the fixes come first.
  ASSERT_GE(d.recommendations.size(), 3u);
  EXPECT_EQ(name(d.recommendations[2].id), "memory_cap");
  EXPECT_EQ(d.recommendations[2].frees_bytes, 0);
  // ... with the verdict's bounds, not reserved + segment (4.46 GiB), which
  // the earlier error's 20 MiB segment already rules out.
  EXPECT_NE(d.recommendations[2].reason.find("the cap, between 3.98 GiB (the most the trace reserved before) and "
                                             "4.00 GiB (an earlier error's segment), refused the 512.00 MiB segment"),
            std::string::npos)
      << d.recommendations[2].reason;
  // The script's frames (gpu_truth.py in scenario_snap_fragmentation) are no
  // training phase: the sentences say so rather than "the other phase".
  EXPECT_EQ(o.phase, Phase::kOther);
  const std::string text = render_text(d);
  EXPECT_NE(text.find("  code outside forward, backward and the optimizer step still needed 512.00 MiB"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("needs a 512.00 MiB segment) in code outside forward, backward and the optimizer step at "),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("other phase"), std::string::npos) << text;
  EXPECT_EQ(text.find(" in other"), std::string::npos) << text;
}

TEST(DiagnoseReal, GptActivationsFixture) {
  const std::string path = testing::real_fixture("oom_gpt_activations.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(name(d.verdicts.front().id), "activations_in_forward");
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms.front();
  EXPECT_EQ(o.requested_bytes, 288 * kMiB);  // README: "Tried to allocate 288.00 MiB"
  EXPECT_EQ(o.phase, Phase::kForward);
  EXPECT_FALSE(o.fragmentation);
  // The user frame of the failing call and the model's forward (gpu_truth.py:35 inside :49).
  EXPECT_EQ(o.layer, "gpu_truth.py:35 in forward");
  EXPECT_EQ(o.call_site, "gpu_truth.py:88 in step_phases");  // `model(x)` in the training step
  EXPECT_EQ(o.model_forward, "gpu_truth.py:49 in forward");
  EXPECT_NE(d.verdicts.front().evidence.find("gpu_truth.py:35 in forward"), std::string::npos);
  // Under the 8 GiB cap: reserved 7.90 GiB (sum of segments at the oom) and
  // the 135M fp32 parameters (515.46 MiB) allocated before recording began.
  EXPECT_EQ(o.reserved_bytes, 8487174144);
  EXPECT_EQ(d.trace.allocated_before_recording_bytes, 540502016);
  EXPECT_GT(cat(o.live_by_category, Category::kActivations), 7 * (int64_t{1} << 30));
  EXPECT_LT(o.reserved_bytes - o.allocated_bytes, o.requested_bytes);  // not fragmentation: no room at all
  EXPECT_TRUE(has_recommendation(d, "activation_checkpointing"));
  EXPECT_TRUE(has_recommendation(d, "micro_batch"));
  EXPECT_FALSE(has_recommendation(d, "expandable_segments"));
  EXPECT_TRUE(d.trace.replay_matches_dump);
  expect_cap_within(o, int64_t{8} << 30);  // README: "8.00 GiB allowed"
  EXPECT_TRUE(has_recommendation(d, "memory_cap"));
}

TEST(DiagnoseSynthetic, LayoutsGiveTheSameDiagnosis) {
  for (const char* f : {"layout_v2_0.pickle", "layout_v2_1.pickle", "layout_v2_2.pickle", "layout_v2_4.pickle",
                        "layout_v2_11.pickle", "layout_v2_11_protocol5.pickle"}) {
    SCOPED_TRACE(f);
    const std::string path = testing::synthetic_fixture(f);
    SKIP_IF_MISSING(path);
    const Diagnosis d = testing::diagnose_file(path);
    ASSERT_EQ(d.ooms.size(), 1u);
    // 20 segments of 20 MiB, each a 9.5 MiB tensor and a 10.5 MiB hole; 64 MiB requested.
    EXPECT_EQ(d.ooms[0].allocated_bytes, int64_t{20} * 9961472);
    EXPECT_EQ(d.ooms[0].reserved_bytes, 400 * kMiB);
    EXPECT_EQ(d.ooms[0].largest_free_block_bytes, 11010048);
    EXPECT_EQ(name(d.verdicts.front().id), "fragmentation");
    EXPECT_TRUE(d.trace.replay_matches_dump);
  }
}

TEST(DiagnoseSynthetic, Leak) {
  const std::string path = testing::synthetic_fixture("leak.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(name(d.verdicts.front().id), "leak");
  // Each of 6 iterations keeps the activations of train.py:20 and :21 (12 MiB each).
  ASSERT_EQ(d.leaks.size(), 2u);
  EXPECT_EQ(d.leaks[0].growth_per_iteration_bytes, 12 * kMiB);
  EXPECT_EQ(d.leaks[0].site.bytes, 6 * 12 * kMiB);
  EXPECT_EQ(d.leaks[0].site.filename, "/home/user/train.py");
  EXPECT_TRUE(d.leaks[0].site.line == 20 || d.leaks[0].site.line == 21);
  EXPECT_EQ(d.trace.iterations, 6);
  EXPECT_EQ(name(d.recommendations.front().id), "fix_leak");
}

TEST(DiagnoseSynthetic, OptimizerStepOom) {
  const std::string path = testing::synthetic_fixture("optimizer_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  EXPECT_EQ(name(d.verdicts.front().id), "optimizer_state_allocation");
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  // 6 parameters of 12 MiB, their 6 gradients, 5 AdamW states allocated when the 6th fails.
  EXPECT_EQ(cat(o.live_by_category, Category::kParameters), 72 * kMiB);
  EXPECT_EQ(cat(o.live_by_category, Category::kGradients), 72 * kMiB);
  EXPECT_EQ(cat(o.live_by_category, Category::kOptimizerState), 60 * kMiB);
  EXPECT_EQ(o.phase, Phase::kOptimizer);
  // The first step's two states per parameter: 2 x 72 MiB of gradients, less
  // the 60 MiB made; then foreach's temporaries (assumed: the step failed in
  // _init_group), 1 x 72 MiB.
  EXPECT_EQ(d.need.method, NeedMethod::kOptimizerFirstStep);
  EXPECT_EQ(d.need.still_needed_bytes, (84 + 72) * kMiB);
  EXPECT_TRUE(d.need.implementation_assumed());
  EXPECT_EQ(name(d.recommendations.front().id), "adamw_8bit");
  EXPECT_EQ(d.recommendations.front().frees_bytes, (108 + 72) * kMiB);  // 75% of 144 MiB, and no foreach temporaries
  EXPECT_EQ(d.recommendations.front().sufficiency, Sufficiency::kEnough);
  // The device itself was full (6 MiB free, a 12 MiB segment needed): no cap to blame.
  EXPECT_EQ(o.device_free_bytes, 6 * kMiB);
  EXPECT_EQ(o.segment_bytes, 12 * kMiB);  // one 12 MiB AdamW state, its own segment
  EXPECT_FALSE(o.memory_cap);
  for (const Verdict& v : d.verdicts) EXPECT_NE(name(v.id), "memory_cap");
  EXPECT_FALSE(has_recommendation(d, "memory_cap"));
  EXPECT_EQ(render_text(d).find("memory cap"), std::string::npos);
}

// Issue #44 item 4 on a GPU: the snapshot an oomtune trial wrote when it ran
// out of memory on an H200 (2026-11-29: `oomtune probe examples/gpt.toml
// --device cuda --budget 96MiB --enforce-budget --config micro_batch=32`,
// its caching allocator capped at the usable 91.20 MiB). What the trial's
// own line said: out of memory during forward, a 4 MiB request, 71.70 MiB
// allocated and 76.00 MiB reserved, the device 139.06 GiB free. Its phases
// come from the trial's marks alone.
TEST(DiagnoseGpu, AnOomtuneTrialsSnapshotNamesItsPhasesAndTheCap) {
  const std::string path = testing::synthetic_fixture("gpu_trial_gpt_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.phase, Phase::kForward);
  EXPECT_EQ(o.requested_bytes, 4 * kMiB);
  EXPECT_EQ(o.reserved_bytes, 76 * kMiB);
  EXPECT_TRUE(o.memory_cap) << "the device had 139 GiB free: the cap refused";
  EXPECT_GT(o.device_free_bytes, int64_t{139} << 30);
  // Every allocation inside a phase mark of the trial's.
  EXPECT_GT(d.trace.alloc_events_in_marked_phases, 0);
  bool cap_verdict = false;
  for (const Verdict& v : d.verdicts) cap_verdict = cap_verdict || name(v.id) == "memory_cap";
  EXPECT_TRUE(cap_verdict);
  // Under the 91.20 MiB cap: the trace bounds it between reserved (76 MiB)
  // and reserved plus the 20 MiB segment it needed.
  EXPECT_NE(render_text(d).find("between 76.00 MiB and 96.00 MiB"), std::string::npos) << render_text(d);
  // A C++ trial's events have no frames: nothing shows the forward's blocks,
  // the need is the request alone (Note [Enough for the request only]). A fix
  // that serves it is "enough for the failing request", never plainly
  // enough, and among those the ones that free the most come first.
  EXPECT_EQ(d.need.method, NeedMethod::kRequest);
  int64_t last_freed = INT64_MAX;
  int for_request = 0;
  for (const Recommendation& r : d.recommendations) {
    EXPECT_NE(r.sufficiency, Sufficiency::kEnough) << name(r.id) << ": only the request is known";
    if (r.sufficiency != Sufficiency::kEnoughForRequest) continue;
    ++for_request;
    EXPECT_LE(r.frees_bytes, last_freed) << name(r.id);
    last_freed = r.frees_bytes;
  }
  EXPECT_GE(for_request, 2);
  EXPECT_NE(render_text(d).find("enough for the failing request; what the rest of the phase needs is not in the "
                                "snapshot"),
            std::string::npos);
  // The replay with expandable segments serves the request only under a
  // higher cap: the forward's verdict comes first.
  testing::expect_fragmentation_order(d, VerdictId::kActivationsInForward, false,
                                      "the request fits only under a cap of at least");
}

/// The diagnosis of the snapshot at `path`, expected to hold one
/// out-of-memory, in forward, whose need is read from the blocks (rule 3).
Diagnosis forward_blocks_diagnosis(const std::string& path) {
  Diagnosis d = testing::diagnose_file(path);
  EXPECT_EQ(d.ooms.size(), 1u);
  if (!d.ooms.empty()) {
    EXPECT_EQ(d.ooms[0].phase, Phase::kForward);
  }
  EXPECT_EQ(d.need.method, NeedMethod::kForwardBlocks) << d.need.estimate;
  return d;
}

// Issue #48: a real Hugging Face GPT-2 small (transformers 5.17, 8 x 1024
// tokens, fp32) out of memory in its first forward on an H200 under an 8 GiB
// cap (scripts/record_hf_snapshot.py, 2026-11-29), in its 11th block: the
// trace holds 11 c_attn outputs of 8 x 1024 x 2304 x 4 B = 72 MiB. By
// modeling_gpt2.py each complete block keeps, for 8192 positions of 768:
// ln_1's output 24 MiB and its mean and rstd 2 x 32 KiB; c_attn's output
// 72 MiB; SDPA's output 24 MiB and its logsumexp (8 x 12 x 1024 x 4 B = 384
// KiB); resid_dropout's bool mask 6 MiB; the residual sum 24 MiB; ln_2's
// output and stats 24 MiB + 64 KiB; c_fc's output 96 MiB; NewGELUActivation's
// four saved intermediates 4 x 96 MiB; the MLP dropout's mask 6 MiB; the
// second residual sum 24 MiB: 684.5 MiB. The first block also keeps the
// causal mask (irregular): 10 complete blocks. The current block holds its
// MLP temporaries not freed yet, more than a block keeps, so its rest is
// the request itself. The model's 148 parameter tensors were moved to the
// GPU in the trace (wte, wpe, 12 blocks of 12 from ln_1's weight to the
// MLP's c_proj bias, ln_f's 2): 12 blocks (Note [Blocks from the
// parameters]), so the 12th counts too: 24 + 684.5 MiB. After the blocks
// only ln_f's weight and bias, moved by Module._apply 3 deep as wte was:
// the head is wte's weight, tied (Note [A language model's head]), so its
// fp32 logits, 8 x 1024 x 50257 x 4 B, and the loss's log_softmax as large
// again come after them: 24 + 684.5 MiB + 2 x 1.53 GiB at least.
TEST(DiagnoseGpu, ARealHuggingFaceOomInItsFirstForwardIsJudgedByBlocks) {
  const std::string path = testing::synthetic_fixture("gpu_hf_gpt2_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = forward_blocks_diagnosis(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].requested_bytes, 24 * kMiB);
  EXPECT_NE(d.ooms[0].layer.find("modeling_gpt2.py"), std::string::npos) << d.ooms[0].layer;
  EXPECT_TRUE(d.need.lower_bound);
  EXPECT_EQ(d.need.blocks_done, 10);
  EXPECT_EQ(d.need.block_bytes, 684 * kMiB + 512 * 1024);
  EXPECT_EQ(d.need.model_blocks, 12);
  EXPECT_EQ(d.need.blocks_after, 1);
  constexpr int64_t kLogits = int64_t{8} * 1024 * 50257 * 4;
  EXPECT_EQ(d.need.head_bytes, kLogits);
  EXPECT_EQ(d.need.loss_bytes, kLogits);
  EXPECT_EQ(d.need.still_needed_bytes, 24 * kMiB + 684 * kMiB + 512 * 1024 + 2 * kLogits);
  const nlohmann::json j = nlohmann::json::parse(render_json(d));
  EXPECT_EQ(j["need"]["model_blocks"], 12);
  EXPECT_EQ(j["need"]["blocks_after"], 1);
  EXPECT_EQ(j["need"]["head_bytes"], kLogits);
  EXPECT_NE(d.need.estimate.find("temporaries it had not freed yet included"), std::string::npos) << d.need.estimate;
  EXPECT_NE(d.need.estimate.find("the rest of this block, 1 more block (the model's parameters repeat in 12 "
                                 "blocks), then the head's logits, 8192 tokens x 50257 entries x 4 B = 1.53 GiB"),
            std::string::npos)
      << d.need.estimate;
  EXPECT_NE(d.need.estimate.find("the head is the embedding's weight, tied: the model was moved with .to() and adds "
                                 "no head of its own after the blocks"),
            std::string::npos)
      << d.need.estimate;
  for (const Recommendation& r : d.recommendations) {
    EXPECT_NE(r.sufficiency, Sufficiency::kEnough) << name(r.id) << ": the need is a lower bound";
  }
  // Checkpointing and half the micro-batch leave room for more blocks than
  // the model has (counted after its 12); expandable segments, with the
  // 72.97 MiB reserved but free packed, serve the 24 MiB request and two
  // more 24 MiB of the need, not a fourth: 72 MiB of the 3.76 GiB.
  ASSERT_GE(d.recommendations.size(), 3u);
  EXPECT_EQ(name(d.recommendations[0].id), "activation_checkpointing");
  EXPECT_EQ(name(d.recommendations[1].id), "micro_batch");
  EXPECT_GT(d.recommendations[0].most_blocks, d.recommendations[1].most_blocks);
  EXPECT_GE(d.recommendations[1].most_blocks, 12);
  const auto expandable = std::find_if(d.recommendations.begin(), d.recommendations.end(),
                                       [](const Recommendation& r) { return name(r.id) == "expandable_segments"; });
  ASSERT_NE(expandable, d.recommendations.end());
  EXPECT_EQ(expandable->sufficiency, Sufficiency::kNotEnough);
  EXPECT_EQ(d.expandable_replay.served_bytes, 72 * kMiB);
  EXPECT_EQ(expandable->frees_bytes, 72 * kMiB);  // it held more reserved than the real run then, not less
  EXPECT_EQ(sufficiency_text(*expandable), "not enough alone (frees 72.00 MiB, needs 3.76 GiB)");
  EXPECT_NE(expandable->estimate.find("it serves the request and 48.00 MiB more of the need; then the rest of the "
                                      "phase's need (a 24.00 MiB request after it) still fails"),
            std::string::npos)
      << expandable->estimate;
  // The verdicts follow the same evidence (Note [Fragmentation first]):
  // 72.97 MiB reserved but free against 7.46 GiB of activations.
  testing::expect_fragmentation_order(d, VerdictId::kActivationsInForward, false,
                                      "defragmented, the 72.97 MiB reserved but free are still less than the 3.76 "
                                      "GiB (at least) that the forward phase still needed; further copies of the "
                                      "logits (bf16 logits' fp32 copy, a shifted copy) are not counted.");
}

// The same snapshot with its last parameter, ln_f's bias, moved one
// module shallower than wte (Module._apply's frames): a head of the task
// model's own, as a reward model's score (GPT2ForSequenceClassification,
// num_labels=1: d wide, 2 deep). The model is then no language model
// whose head is the embedding: no logits counted (Note [A language
// model's head]).
TEST(DiagnoseGpu, AHeadOfItsOwnAfterTheBlocksIsNoTiedVocabularyHead) {
  const std::string path = testing::synthetic_fixture("gpu_hf_gpt2_oom.pickle");
  SKIP_IF_MISSING(path);
  Snapshot s = load_snapshot(path);
  std::vector<TraceEvent>& trace = s.device_traces[0];
  auto moved = [&](const TraceEvent& e) {
    const std::vector<uint32_t>& stack = s.stack(e.frames);
    return std::any_of(stack.begin(), stack.end(), [&](uint32_t f) { return s.frames[f].name == "_apply"; });
  };
  const auto last = std::find_if(trace.rbegin(), trace.rend(),
                                 [&](const TraceEvent& e) { return e.action == TraceAction::kAlloc && moved(e); });
  ASSERT_NE(last, trace.rend());
  EXPECT_EQ(last->size, 768 * 4);
  std::vector<uint32_t> shallower = s.stack(last->frames);
  shallower.erase(
      std::find_if(shallower.begin(), shallower.end(), [&](uint32_t f) { return s.frames[f].name == "_apply"; }));
  s.stacks.push_back(shallower);
  last->frames = static_cast<StackId>(s.stacks.size() - 1);
  const Diagnosis d = diagnose(s, path, {});
  EXPECT_EQ(d.need.method, NeedMethod::kForwardBlocks) << d.need.estimate;
  EXPECT_EQ(d.need.model_blocks, 12);
  EXPECT_EQ(d.need.head_bytes, 0);
  EXPECT_EQ(d.need.loss_bytes, 0);
  EXPECT_EQ(d.need.still_needed_bytes, 24 * kMiB + 684 * kMiB + 512 * 1024);
}

// GPT-2 small loaded with from_pretrained(..., device_map=) on an H200 and
// run out of memory in its first forward under 8 GiB (scripts/
// record_hf_snapshot.py --pretrained, transformers 5.17, 2026-12-04):
// transformers' loader made its 148 tensors in a thread pool
// (core_model_loading.py), interleaved, the embeddings last. They are the
// model's parameters, 124439808 x 4 B (frames.h), and their sizes' counts
// give its 12 blocks (Note [Blocks from loaded weights]): the 12th after
// the 11 the forward ran. No head weight of its own among them: the tied
// head's logits are not counted, and the estimate says so.
TEST(DiagnoseGpu, WeightsLoadedByFromPretrainedAreParametersInBlocks) {
  const std::string path = testing::synthetic_fixture("gpu_hf_gpt2_pretrained_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = forward_blocks_diagnosis(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(testing::alive_bytes(d.ooms[0], Category::kParameters), int64_t{124439808} * 4);
  EXPECT_EQ(d.need.blocks_done, 11);
  EXPECT_EQ(d.need.model_blocks, 12);
  EXPECT_EQ(d.need.blocks_after, 0);
  EXPECT_EQ(d.need.head_bytes, 0);
  EXPECT_NE(d.need.estimate.find("the model's parameters loaded by from_pretrained count 12 blocks"), std::string::npos)
      << d.need.estimate;
  EXPECT_NE(d.need.estimate.find("the logits of a language model's head tied to the embedding are not counted"),
            std::string::npos)
      << d.need.estimate;
}

// The same snapshot with a second tensor of the token embedding's size
// loaded after it, as an untied language model's head (Llama 3 8B's
// lm_head): a head of its own, so its fp32 logits, 8 x 1024 tokens x 50257
// entries x 4 B, and the loss's log_softmax as large come after the blocks
// (Note [A language model's head]; d = 768 x 4 B, ln's size, the blocks'
// most common, divides the embedding and its output).
TEST(DiagnoseGpu, ALoadedHeadOfItsOwnCountsItsLogits) {
  const std::string path = testing::synthetic_fixture("gpu_hf_gpt2_pretrained_oom.pickle");
  SKIP_IF_MISSING(path);
  Snapshot s = load_snapshot(path);
  std::vector<TraceEvent>& trace = s.device_traces[0];
  constexpr int64_t kEmbedding = int64_t{50257} * 768 * 4;
  const auto wte = std::find_if(trace.begin(), trace.end(), [](const TraceEvent& e) {
    return e.action == TraceAction::kAlloc && e.size == kEmbedding;
  });
  ASSERT_NE(wte, trace.end());
  TraceEvent head = *wte;
  head.addr = int64_t{1} << 46;  // no block of the trace lies there
  trace.insert(wte + 1, head);
  const Diagnosis d = diagnose(s, path, {});
  EXPECT_EQ(d.need.model_blocks, 12) << d.need.estimate;
  constexpr int64_t kLogits = int64_t{8} * 1024 * 50257 * 4;
  EXPECT_EQ(d.need.head_bytes, kLogits) << d.need.estimate;
  EXPECT_EQ(d.need.loss_bytes, kLogits);
}

TEST(DiagnoseSynthetic, BackwardPeakWithFramelessAllocations) {
  const std::string path = testing::synthetic_fixture("backward_peak.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  EXPECT_EQ(name(d.verdicts.front().id), "backward_peak");
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].phase, Phase::kBackward);  // inferred: the oom has no frames
  EXPECT_EQ(d.ooms[0].requested_bytes, 96 * kMiB);
  EXPECT_GT(d.trace.frameless_inferred_backward, 0);
  EXPECT_NE(d.trace.frames_note.find("autograd engine's C++ thread"), std::string::npos);
}

// An oomtune CUDA trial's own snapshot (make_snapshot_fixtures.py,
// oomtune_trial_oom): no event has frames, and the trial's phase marks
// alone place the out-of-memory in the first optimizer step and give each
// live byte its category: 4 x 16 MiB of parameters loaded, 4 x 16 MiB of
// gradients from backward, and 4 x 16 MiB of AdamW state made before the
// fifth 16 MiB state failed under the 200 MiB cap. The same trace without
// the marks can say none of it.
TEST(DiagnoseSynthetic, OomtunePhaseMarksPlaceAFramelessTrial) {
  const std::string path = testing::synthetic_fixture("oomtune_trial_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.phase, Phase::kOptimizer);
  EXPECT_EQ(o.requested_bytes, 16 * kMiB);
  EXPECT_EQ(cat(o.live_by_category, Category::kParameters), 64 * kMiB);
  EXPECT_EQ(cat(o.live_by_category, Category::kGradients), 64 * kMiB);
  EXPECT_EQ(cat(o.live_by_category, Category::kOptimizerState), 64 * kMiB);
  EXPECT_EQ(cat(o.live_by_category, Category::kActivations), 0);
  EXPECT_EQ(d.trace.alloc_events_in_marked_phases, d.trace.alloc_events);
  EXPECT_EQ(d.trace.alloc_events_without_frames, d.trace.alloc_events);
  EXPECT_NE(d.trace.frames_note.find("oomtune's phase marks"), std::string::npos) << d.trace.frames_note;

  const std::string unmarked_path = testing::synthetic_fixture("oomtune_trial_oom_unmarked.pickle");
  SKIP_IF_MISSING(unmarked_path);
  const Diagnosis unmarked = testing::diagnose_file(unmarked_path);
  ASSERT_EQ(unmarked.ooms.size(), 1u);
  EXPECT_NE(unmarked.ooms[0].phase, Phase::kOptimizer);
  EXPECT_EQ(cat(unmarked.ooms[0].live_by_category, Category::kOptimizerState), 0);
  EXPECT_EQ(unmarked.trace.alloc_events_in_marked_phases, 0);
}

TEST(DiagnoseSynthetic, ExpandableSegments) {
  const std::string path = testing::synthetic_fixture("expandable.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  EXPECT_TRUE(d.allocator_settings.expandable_segments);
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_FALSE(d.ooms[0].fragmentation);
  EXPECT_EQ(d.ooms[0].reserved_bytes, 400 * kMiB);  // the cap, mapped in 20 MiB pages
  EXPECT_EQ(name(d.verdicts.front().id), "activations_in_forward");
  EXPECT_FALSE(has_recommendation(d, "expandable_segments"));
  EXPECT_FALSE(has_recommendation(d, "max_split_size"));
  EXPECT_TRUE(d.trace.replay_matches_dump);
  EXPECT_EQ(d.trace.inconsistencies, 0);
}

TEST(DiagnoseSynthetic, MissingFramesAreExplained) {
  const std::string path = testing::synthetic_fixture("missing_frames.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  EXPECT_EQ(d.trace.alloc_events_without_frames, d.trace.alloc_events);
  EXPECT_NE(d.trace.frames_note.find("context=\"all\""), std::string::npos);
  ASSERT_TRUE(has_recommendation(d, "record_more"));
  EXPECT_NE(d.recommendations.back().change.find("stacks=\"python\""), std::string::npos);
  // Under two iterations there is no per-iteration count to quote.
  ASSERT_LT(d.trace.iterations, 2);
  EXPECT_NE(d.recommendations.back().reason.find(fmt::format("({} events in the whole trace)", d.trace.events)),
            std::string::npos)
      << d.recommendations.back().reason;
}

TEST(DiagnoseRender, JsonUnitsAndSvgWithoutScripts) {
  const std::string path = testing::synthetic_fixture("layout_v2_11.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path, DiagnoseOptions{/*top=*/1});
  EXPECT_LE(d.peak.sites.size(), 1u);  // --top 1
  const auto j = nlohmann::json::parse(render_json(d));
  EXPECT_EQ(j["ooms"][0]["requested_bytes"].get<int64_t>(), 64 * kMiB);
  EXPECT_EQ(j["ooms"][0]["largest_free_block_bytes"].get<int64_t>(), 11010048);
  EXPECT_EQ(j["verdicts"][0]["id"], "fragmentation");
  EXPECT_EQ(j["ooms"][0]["memory_cap"], true);  // 70 GiB free on the device
  EXPECT_TRUE(j["trace"].contains("duration_us"));
  const std::string svg = render_svg(d);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_NE(svg.find("OOM 64.00 MiB"), std::string::npos);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  const std::string text = render_text(d);
  EXPECT_NE(text.find("largest free block in the large pool 10.50 MiB"), std::string::npos);
  EXPECT_NE(text.find("this process's memory cap was the limit (between 400.00 MiB and 464.00 MiB)"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace oomtune::diagnose
