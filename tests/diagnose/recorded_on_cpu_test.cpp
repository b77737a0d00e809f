// Snapshots of a real transformers GPT-2 (PyTorch 2.11, transformers 5.24;
// 4 blocks, n_embd 256, vocabulary 1000; built inside the recording) that
// scripts/record_cpu_snapshot.py recorded on the CPU: PyTorch's own
// allocations, lifetimes and Python frames, backward's cut to what CUDA's
// allocator records on the autograd engine's device thread, replayed through
// the fixture generator's caching-allocator model. Made once with:
//   cpu_gpt2_no_grad_oom.pickle    --mode no_grad --oom-after 0.7
//   cpu_gpt2_forward_oom.pickle    --mode train --oom-after 0.7
//   cpu_gpt2_backward_oom.pickle   --mode step --batch 1 --seq 32 --oom-in backward --share 0.8
//   cpu_gpt2_checkpointed_backward_oom.pickle
//                                  --mode step --checkpointing --eager-attention --oom-in backward --share 0.5
//   cpu_gpt2_recomputation_oom.pickle
//                                  --mode step --checkpointing --eager-attention --oom-in recomputation
// A Llama of the same width (transformers' LlamaForCausalLM, hidden 256,
// MLP 688, 2 of 4 heads for keys and values, its head its own), with
// --model llama:
//   cpu_llama_forward_oom.pickle   --mode train --oom-after 0.7
//   cpu_llama_backward_oom.pickle  --mode step --batch 1 --seq 32 --oom-in backward --share 0.8
//   cpu_llama_second_forward_oom.pickle
//                                  --mode step --steps 2 --optimizer adamw --oom-in forward
// its parameters and buffers 13657344 bytes; uncapped_growth_bytes
// 32090152, 2645248 and 14387208.
// The recorder's own figures (independent of diagnose): the model's
// parameters and buffers, 13924352 bytes (PyTorch's storages); what the same
// run without the cap allocates from the failing allocation on
// (uncapped_growth_bytes): 75079768, 4239592, 8405056 and 13652096 bytes
// for the last four. tests/scripts/cpu_snapshot_test.py records them afresh where
// transformers is installed.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/byte_size.h"
#include "diagnose/diagnosis.h"
#include "diagnose/render.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

constexpr int64_t kParameterBytes = 13924352;

// The diagnosis of the recorded fixture `name`; a missing file throws, failing the test.
Diagnosis recorded(const std::string& name) { return testing::diagnose_file(testing::synthetic_fixture(name)); }

// Expects the need between `low` and `high` times `uncapped`, what the same
// run without the cap allocated from the failing allocation on.
void expect_need_within(const Diagnosis& d, int64_t uncapped, double low, double high) {
  const double ratio = static_cast<double>(d.need.still_needed_bytes) / static_cast<double>(uncapped);
  EXPECT_GE(ratio, low) << d.need.still_needed_bytes << " of " << uncapped << ": " << d.need.estimate;
  EXPECT_LE(ratio, high) << d.need.still_needed_bytes << " of " << uncapped << ": " << d.need.estimate;
}

bool recommends(const Diagnosis& d, FixId id) {
  return std::any_of(d.recommendations.begin(), d.recommendations.end(),
                     [&](const Recommendation& r) { return r.id == id; });
}

// `with torch.no_grad():` leaves no frame; its blocks keep nothing (Note
// [Blocks that kept nothing]). The KV cache (transformers 5.x cache_utils)
// keeps keys and values.
TEST(RecordedOnCpu, ANoGradForwardReadsAsInference) {
  const Diagnosis d = recorded("cpu_gpt2_no_grad_oom.pickle");
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.phase, Phase::kForward);
  EXPECT_EQ(o.inference_kind, InferenceKind::kNothingSaved);
  EXPECT_GE(o.nothing_saved.freed_allocations, o.nothing_saved.block_allocations);
  EXPECT_EQ(testing::alive_bytes(o, Category::kParameters), kParameterBytes);
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(d.verdicts.front().id, VerdictId::kInferenceForward);
  EXPECT_FALSE(recommends(d, FixId::kActivationCheckpointing));
  // Note [Blocks without autograd]: the block after the current one peaks
  // above the KV cache entries the current one keeps; the need is within 5%
  // of what the uncapped run allocates from the failure on (14680076 B,
  // tests/scripts/cpu_snapshot_test.py), 14 times the 1 MiB request.
  EXPECT_EQ(d.need.method, NeedMethod::kInferenceBlocks) << d.need.estimate;
  EXPECT_EQ(d.need.model_blocks, 4);
  EXPECT_FALSE(d.need.lower_bound);
  EXPECT_NEAR(static_cast<double>(d.need.still_needed_bytes), 14680076.0, 0.05 * 14680076) << d.need.estimate;
}

// The same forward with autograd keeps its blocks' saved tensors: rule 3
// reads 2 complete blocks before the failure and the 4 blocks of the
// parameters (Conv1D's weights, made in GPT-2's own __init__, are
// parameters: frames.h), then the head's logits (Note [A language model's
// head]): 4 x 256 tokens x 1000 entries x 4 bytes, and the loss's
// log_softmax as large again: within 1% of the uncapped run's 75079768
// bytes (the blocks' and its own temporaries beside).
TEST(RecordedOnCpu, ATrainingForwardNeedsTheRestOfItsBlocks) {
  const Diagnosis d = recorded("cpu_gpt2_forward_oom.pickle");
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.inference_kind, InferenceKind::kNone);
  EXPECT_EQ(testing::alive_bytes(o, Category::kParameters), kParameterBytes);
  EXPECT_EQ(testing::alive_bytes(o, Category::kUnattributed), 0);
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(d.verdicts.front().id, VerdictId::kActivationsInForward);
  EXPECT_EQ(d.need.method, NeedMethod::kForwardBlocks) << d.need.estimate;
  EXPECT_EQ(d.need.blocks_done, 2);
  EXPECT_EQ(d.need.model_blocks, 4);
  EXPECT_EQ(d.need.blocks_after, 1);
  EXPECT_EQ(d.need.head_bytes, 4 * 256 * 1000 * 4);
  EXPECT_EQ(d.need.loss_bytes, d.need.head_bytes);
  // 2 x 43.02 MiB - 22.02 MiB so far, reviewed; then the logits and the loss.
  EXPECT_EQ(d.need.still_needed_bytes, 67125296 + 2 * (4 * 256 * 1000 * 4));
  expect_need_within(d, 75079768, 0.99, 1.01);
  EXPECT_TRUE(recommends(d, FixId::kActivationCheckpointing));
}

// Without a parameter of the embedding's size after the blocks (the head's
// weight GPT-2 allocates before tying it to the embedding; a tied model
// moved with .to() has none) the head is not known: no logits counted.
TEST(RecordedOnCpu, NoVocabularyHeadInTheParametersNoLogits) {
  const std::string path = testing::synthetic_fixture("cpu_gpt2_forward_oom.pickle");
  Snapshot s = load_snapshot(path);
  std::vector<TraceEvent>& trace = s.device_traces[0];
  std::vector<size_t> embedding_sized;  // wte, then the head's weight after the blocks
  for (size_t i = 0; i < trace.size(); ++i) {
    if (trace[i].action == TraceAction::kAlloc && trace[i].size == 1000 * 256 * 4) embedding_sized.push_back(i);
  }
  ASSERT_GE(embedding_sized.size(), 2u);
  trace[embedding_sized[1]].size -= 512;  // no longer the embedding's size
  const Diagnosis d = diagnose(s, path, {});
  EXPECT_EQ(d.need.method, NeedMethod::kForwardBlocks) << d.need.estimate;
  EXPECT_EQ(d.need.model_blocks, 4);
  EXPECT_EQ(d.need.head_bytes, 0);
  EXPECT_EQ(d.need.loss_bytes, 0);
  EXPECT_EQ(d.need.still_needed_bytes, 67125296);
}

// A Llama block's most common parameter size is its MLP's d x ff (gate,
// up and down), which divides neither the embedding (1000 x 256 x 4 B)
// nor its output; its norms' 256 x 4 B does (Note [A language model's
// head]): the head's logits of 4 x 256 tokens x 1000 entries and the
// loss's log_softmax count, within 10% below the uncapped run's 32090152
// bytes (the MLP's temporaries aside). Read as d x ff, no head was found
// (0.679 of it).
TEST(RecordedOnCpu, ALlamasDIsItsNormsNotItsMlp) {
  const Diagnosis d = recorded("cpu_llama_forward_oom.pickle");
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.need.method, NeedMethod::kForwardBlocks) << d.need.estimate;
  EXPECT_EQ(d.need.model_blocks, 4);
  EXPECT_EQ(d.need.head_bytes, 4 * 256 * 1000 * 4);
  EXPECT_EQ(d.need.loss_bytes, d.need.head_bytes);
  expect_need_within(d, 32090152, 0.9, 1);
}

// A Llama's forward leaves one more tensor of its backward turns' marker
// alive than it has blocks: counted, a fifth block came after the first
// (3670272 bytes, 1.39 of the uncapped run's 2645248). The parameters show
// 4 blocks (Note [Blocks in backward]): none after the current one, then
// the embedding's gradient, 1000 x 256 x 4 bytes, untied (the head's
// weight stays): 0.87 of the uncapped run.
TEST(RecordedOnCpu, ALlamasBackwardHasNoMoreBlocksThanItsParameters) {
  const Diagnosis d = recorded("cpu_llama_backward_oom.pickle");
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].phase, Phase::kBackward);
  EXPECT_EQ(d.need.method, NeedMethod::kBackwardBlocks) << d.need.estimate;
  EXPECT_EQ(d.need.blocks_done, 3);
  EXPECT_EQ(d.need.model_blocks, 4);
  EXPECT_EQ(d.need.blocks_after, 0);
  EXPECT_EQ(d.need.stem_gradient_bytes, 1000 * 256 * 4);
  EXPECT_EQ(d.need.tied_gradient_sum_bytes, 0);
  expect_need_within(d, 2645248, 0.85, 1);
}

// Llama's second forward: the first grew by 94426624 bytes, its backward
// (the untied head's gradient and the logits' on top of what forward
// kept) rose to 98505728 above where that forward began (Note [The rest
// of the iteration]): the rest of the iteration needs what the uncapped
// run allocated, to 0.01%; by the forward alone, 0.717 of it.
TEST(RecordedOnCpu, ALlamasSecondForwardNeedsItsBackwardsPeakToo) {
  const Diagnosis d = recorded("cpu_llama_second_forward_oom.pickle");
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].phase, Phase::kForward);
  EXPECT_EQ(d.need.method, NeedMethod::kTrace) << d.need.estimate;
  EXPECT_EQ(d.need.later_peak_phase, Phase::kBackward);
  EXPECT_GT(d.need.later_peak_bytes, d.need.earlier_growth_bytes);
  expect_need_within(d, 14387208, 0.999, 1.001);
  EXPECT_EQ(need_prose(d.need), "the forward phase and the backward phase after it");
  EXPECT_NE(render_text(d).find("the forward phase and the backward phase after it still needed 13.72 MiB"),
            std::string::npos);
}

// A plain backward past its first block: a GPT-2 block frees two tensors
// of one (layer, bytes) key, so the turns come from the period of
// backward's frees (Note [Blocks in backward]). After the blocks come the
// embeddings' gradients: the parameters before the blocks, wte 1000 x 256
// and wpe 256 x 256 fp32, 1286144 bytes, and, wte being tied to the head
// (its weight made after the blocks and freed), the sum of the head's
// gradient and wte's, 1000 x 256 x 4 bytes more. The need fell short of
// the uncapped run's 4239592 bytes by 2049536 bytes without the
// embeddings' gradients, by 925440 with them but not the sum; now 1.023
// of it.
TEST(RecordedOnCpu, APlainBackwardNeedsTheRestOfItsBlocks) {
  const Diagnosis d = recorded("cpu_gpt2_backward_oom.pickle");
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].phase, Phase::kBackward);
  EXPECT_EQ(d.need.method, NeedMethod::kBackwardBlocks) << d.need.estimate;
  EXPECT_GE(d.need.blocks_done, 1);
  EXPECT_EQ(d.need.model_blocks, 4);
  EXPECT_EQ(d.need.stem_gradient_bytes, (1000 + 256) * 256 * 4);
  EXPECT_EQ(d.need.tied_gradient_sum_bytes, 1000 * 256 * 4);
  // The last block's turn ends at its last freed forward tensor; then the stem's gradients and the sum.
  EXPECT_EQ(d.need.blocks_after, 0);
  EXPECT_EQ(d.need.still_needed_bytes, 4338152);  // reviewed: 2190056, then 3314152 before; the uncapped run 4239592
  expect_need_within(d, 4239592, 1, 1.05);
}

// The stem is counted only where the parameters show as many blocks as
// backward: with a copy of the first block's twelve parameter allocations
// after it (five blocks by the parameters, four in backward) the need is
// the blocks' alone again.
TEST(RecordedOnCpu, TheStemNeedsTheParametersBlocksToBeBackwards) {
  const std::string path = testing::synthetic_fixture("cpu_gpt2_backward_oom.pickle");
  Snapshot s = load_snapshot(path);
  std::vector<TraceEvent>& trace = s.device_traces[0];
  std::vector<size_t> allocs;  // the model's: wte, wpe, then block after block of 12
  for (size_t i = 0; i < trace.size() && allocs.size() < 14; ++i) {
    if (trace[i].action == TraceAction::kAlloc) allocs.push_back(i);
  }
  ASSERT_EQ(allocs.size(), 14u);
  ASSERT_EQ(trace[allocs[0]].size, 1000 * 256 * 4);  // wte
  ASSERT_EQ(trace[allocs[2]].size, 256 * 4);         // the first block's ln_1.weight
  std::vector<TraceEvent> copy;
  for (size_t k = 2; k < 14; ++k) {
    copy.push_back(trace[allocs[k]]);
    copy.back().addr = (int64_t{1} << 45) + static_cast<int64_t>(k) * kMiB;
  }
  trace.insert(trace.begin() + static_cast<std::ptrdiff_t>(allocs[13] + 1), copy.begin(), copy.end());
  const Diagnosis d = diagnose(s, path, {});
  EXPECT_EQ(d.need.method, NeedMethod::kBackwardBlocks) << d.need.estimate;
  EXPECT_EQ(d.need.model_blocks, 4);
  EXPECT_EQ(d.need.stem_gradient_bytes, 0);
  EXPECT_EQ(d.need.still_needed_bytes, 2190056);
}

// Checkpointed: each turn recomputes its block, then runs its backward; the
// need is the uncapped run's growth to the byte.
TEST(RecordedOnCpu, ACheckpointedBackwardNeedsWhatTheRunWithoutTheCapAllocated) {
  const Diagnosis d = recorded("cpu_gpt2_checkpointed_backward_oom.pickle");
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].phase, Phase::kBackward);
  EXPECT_FALSE(d.ooms[0].recomputing);
  EXPECT_EQ(d.need.method, NeedMethod::kBackwardBlocks) << d.need.estimate;
  EXPECT_EQ(d.need.still_needed_bytes, 8405056);
}

// Backward's first recomputation (the last block's) has no turn before it
// (Note [The turns after a recomputed block]): the rest of the
// recomputation, 2 MiB, then three more turns, each keeping a block's
// parameters' gradients (GPT-2's 12 tensors of a 256-wide block, 789760
// fp32 values) and freeing a checkpointed input (4 x 256 tokens x 256 x 4
// bytes): the last turn's recomputation rises 3 x (3159040 - 1048576) + 2
// MiB above now. 0.616 of the uncapped run's 13652096 bytes (the blocks'
// backward beyond their recomputation is not counted); 0.154 before.
TEST(RecordedOnCpu, TheFirstRecomputationCountsTheTurnsAfterIt) {
  const Diagnosis d = recorded("cpu_gpt2_recomputation_oom.pickle");
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_TRUE(d.ooms[0].recomputing);
  EXPECT_EQ(d.need.method, NeedMethod::kRecomputedBlock) << d.need.estimate;
  EXPECT_EQ(d.need.model_blocks, 4);
  EXPECT_EQ(d.need.blocks_after, 3);
  // The inputs kept inside checkpoint() are the blocks' outputs and the CPU RNG states checkpoint saves
  // (5056 bytes each, host memory on CUDA).
  EXPECT_NEAR(d.need.block_net_bytes, 789760 * 4 - 4 * 256 * 256 * 4, 8192);
  EXPECT_EQ(d.need.still_needed_bytes, 3 * d.need.block_net_bytes + 2 * kMiB);
  expect_need_within(d, 13652096, 0.6, 1);
  // Half the micro-batch frees more than that: enough for what the need covers, and says which.
  const auto half = std::find_if(d.recommendations.begin(), d.recommendations.end(),
                                 [](const Recommendation& r) { return r.id == FixId::kMicroBatch; });
  ASSERT_NE(half, d.recommendations.end());
  EXPECT_EQ(half->sufficiency, Sufficiency::kEnoughForRecomputedBlocks);
  EXPECT_EQ(sufficiency_text(*half),
            "enough for the recomputations of the blocks still to come (needs at least 8.02 MiB); each block's "
            "backward beyond its recomputation is not counted");
}

// The same snapshot without the gradients backward had made before the
// recomputation (the engine's frameless allocations still alive at the
// out-of-memory: the head's and the final norm's): nothing says the
// layers train (LoRA
// leaves them frozen), so the turns after are not counted: the rest of
// the recomputation alone.
TEST(RecordedOnCpu, NoGradientYetNoTurnsAfterTheFirstRecomputation) {
  const std::string path = testing::synthetic_fixture("cpu_gpt2_recomputation_oom.pickle");
  Snapshot s = load_snapshot(path);
  std::vector<TraceEvent>& trace = s.device_traces[0];
  const Diagnosis before = diagnose(s, path, {});
  ASSERT_GT(testing::alive_bytes(before.ooms.at(0), Category::kGradients), 0);
  const size_t oom = static_cast<size_t>(before.ooms[0].event_index);
  std::vector<bool> erase(trace.size());  // frameless allocations (backward's engine) alive at the oom, their frees
  for (size_t i = 0; i < oom; ++i) {
    if (trace[i].action != TraceAction::kAlloc || trace[i].frames != 0) continue;
    size_t j = i + 1;
    while (j < oom && !(trace[j].addr == trace[i].addr && trace[j].action == TraceAction::kFreeRequested)) ++j;
    if (j < oom) continue;
    for (size_t k = i; k < trace.size(); ++k) {
      if (trace[k].addr == trace[i].addr && (k == i || trace[k].action != TraceAction::kAlloc)) erase[k] = true;
      if (k > i && trace[k].addr == trace[i].addr && trace[k].action == TraceAction::kAlloc) break;
    }
  }
  ASSERT_NE(std::find(erase.begin(), erase.end(), true), erase.end());
  std::vector<TraceEvent> kept;
  for (size_t i = 0; i < trace.size(); ++i) {
    if (!erase[i]) kept.push_back(trace[i]);
  }
  trace = kept;
  const Diagnosis d = diagnose(s, path, {});
  ASSERT_EQ(d.ooms.size(), 1u);
  // What stays counted as gradients: checkpoint's saved RNG state and loss.backward()'s seed, 5632 bytes.
  EXPECT_LT(testing::alive_bytes(d.ooms[0], Category::kGradients), 8192);
  EXPECT_EQ(d.need.method, NeedMethod::kRecomputedBlock) << d.need.estimate;
  EXPECT_EQ(d.need.blocks_after, 0);
  EXPECT_EQ(d.need.still_needed_bytes, 2 * kMiB);
  for (const Recommendation& r : d.recommendations) EXPECT_NE(r.sufficiency, Sufficiency::kEnoughForRecomputedBlocks);
}

}  // namespace
}  // namespace oomtune::diagnose
