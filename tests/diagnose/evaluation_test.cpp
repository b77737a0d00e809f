// Evaluation: the evaluation loops of Hugging Face Trainer and Lightning run
// the model without autograd (FrameIndex::inference), and Trainer keeps
// every step's outputs on the device until eval_accumulation_steps moves
// them (Note [Evaluation outputs], diagnose/eval_outputs.h). The stacks are
// those PyTorch 2.11 records with transformers 5.24 and Lightning 2.6 (a
// TorchDispatchMode's traceback at each op, on the CPU); the fixture is
// scripts/make_snapshot_fixtures.py's gpt2_eval_outputs_oom.

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/byte_size.h"
#include "diagnose/compare.h"
#include "diagnose/diagnosis.h"
#include "diagnose/eval_outputs.h"
#include "diagnose/frames.h"
#include "diagnose/render.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

const std::string kPackages = "/venv/lib/python3.11/site-packages";
const std::string kTrainer = kPackages + "/transformers/trainer.py";
const std::string kLoops = kPackages + "/lightning/pytorch/loops";

const Frame kCall{kPackages + "/torch/nn/modules/module.py", "_call_impl", 1790};
const Frame kOp{kPackages + "/torch/nn/modules/linear.py", "forward", 134};
const Frame kGpt2{kPackages + "/transformers/models/gpt2/modeling_gpt2.py", "forward", 698};

struct Classified {
  Phase phase;
  bool inference;
  InferenceKind kind;
  bool eval_outputs;
};

Classified classify(const std::vector<Frame>& stack) {
  const Snapshot s = testing::with_stacks({stack});
  const FrameIndex index(s);
  return {index.phase(1), index.inference(1), index.inference_kind(1), index.concatenates_eval_outputs(1)};
}

TEST(Evaluation, TrainerAndLightningEvaluationLoopsAreInference) {
  const Frame script{"/home/me/evaluate.py", "<module>", 25};
  // Trainer.evaluate(): prediction_step runs the forward under `with torch.no_grad():`.
  const Classified eval = classify({kOp,
                                    kCall,
                                    kGpt2,
                                    kCall,
                                    {kTrainer, "compute_loss", 2172},
                                    {kTrainer, "prediction_step", 3275},
                                    {kTrainer, "evaluation_loop", 2996},
                                    {kTrainer, "evaluate", 2871},
                                    script});
  EXPECT_EQ(eval.phase, Phase::kForward);
  EXPECT_TRUE(eval.inference);
  EXPECT_EQ(eval.kind, InferenceKind::kTrainerEvaluation);
  EXPECT_FALSE(eval.eval_outputs);
  // Trainer.train()'s step: the same forward through compute_loss, with autograd.
  const Classified train = classify({kOp,
                                     kCall,
                                     kGpt2,
                                     kCall,
                                     {kTrainer, "compute_loss", 2172},
                                     {kTrainer, "training_step", 1968},
                                     {kTrainer, "_inner_training_loop", 1620},
                                     {kTrainer, "train", 1433},
                                     script});
  EXPECT_EQ(train.phase, Phase::kForward);
  EXPECT_FALSE(train.inference);
  EXPECT_EQ(train.kind, InferenceKind::kNone);
  // Lightning's validation inside fit(): the evaluation loop is inner to the fit loop.
  const std::vector<Frame> fit = {{kLoops + "/training_epoch_loop.py", "on_advance_end", 406},
                                  {kLoops + "/training_epoch_loop.py", "run", 154},
                                  {kLoops + "/fit_loop.py", "run", 217},
                                  {kPackages + "/lightning/pytorch/trainer/trainer.py", "fit", 584},
                                  script};
  const Frame strategy{kPackages + "/lightning/pytorch/strategies/strategy.py", "validation_step", 412};
  EXPECT_TRUE(classify(testing::join_frames({{kOp,
                                              kCall,
                                              {"/home/me/model.py", "validation_step", 32},
                                              strategy,
                                              {kLoops + "/evaluation_loop.py", "_evaluation_step", 441},
                                              {kLoops + "/evaluation_loop.py", "run", 146},
                                              {kLoops + "/utilities.py", "_decorator", 179}},
                                             fit}))
                  .kind == InferenceKind::kLightningEvaluation);
  // Lightning 1.x's epoch loop file.
  EXPECT_TRUE(classify({kOp,
                        kCall,
                        {"/home/me/model.py", "predict_step", 40},
                        {kPackages + "/pytorch_lightning/loops/epoch/prediction_epoch_loop.py", "_predict_step", 130},
                        script})
                  .inference);
  // Lightning's training step, run in the optimizer's closure, is not.
  EXPECT_FALSE(classify(testing::join_frames({{kOp,
                                               kCall,
                                               {"/home/me/model.py", "training_step", 31},
                                               {kLoops + "/optimization/automatic.py", "closure", 131},
                                               {kPackages + "/torch/utils/_contextlib.py", "decorate_context", 124},
                                               {kPackages + "/torch/optim/adam.py", "step", 227}},
                                              fit}))
                   .inference);
}

// Before 2026-12-03 an out-of-memory in Trainer.evaluate()'s forward read
// "Activations in the forward pass" with activation checkpointing first; its
// batch is TrainingArguments' per_device_eval_batch_size.
TEST(Evaluation, AnEvaluationForwardOutOfMemoryHalvesTheEvalBatch) {
  const std::string path = testing::synthetic_fixture("hf_gpt2_eval_forward_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.phase, Phase::kForward);
  EXPECT_TRUE(o.inference());
  EXPECT_EQ(o.inference_kind, InferenceKind::kTrainerEvaluation);
  EXPECT_EQ(o.requested_bytes, 32 * kMiB);  // cross-entropy's log-probabilities
  EXPECT_EQ(o.layer, "modeling_gpt2.py:703 in forward");
  EXPECT_EQ(testing::alive_bytes(o, Category::kEvalOutputs), 0);  // the first step: nothing kept yet
  EXPECT_FALSE(o.eval_outputs.at_concat);
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(d.verdicts.front().id, VerdictId::kInferenceForward);
  EXPECT_NE(d.verdicts.front().evidence.find("Hugging Face Trainer's evaluation"), std::string::npos)
      << d.verdicts.front().evidence;
  for (const Verdict& v : d.verdicts) EXPECT_NE(v.id, VerdictId::kEvalOutputsAccumulated);
  const auto micro_batch = std::find_if(d.recommendations.begin(), d.recommendations.end(),
                                        [](const Recommendation& r) { return r.id == FixId::kMicroBatch; });
  ASSERT_NE(micro_batch, d.recommendations.end());
  EXPECT_EQ(micro_batch->change, "Halve TrainingArguments(per_device_eval_batch_size=...)");
  for (const Recommendation& r : d.recommendations) {
    EXPECT_NE(r.id, FixId::kActivationCheckpointing);
    EXPECT_NE(r.id, FixId::kEvalAccumulation);
  }
  EXPECT_EQ(nlohmann::json::parse(render_json(d))["ooms"][0]["inference_kind"], "trainer_evaluation");
}

TEST(Evaluation, OnlyTrainersNestedConcatConcatenatesEvaluationOutputs) {
  const std::string utils = kPackages + "/transformers/trainer_pt_utils.py";
  const Classified concat = classify({{kPackages + "/torch/functional.py", "cat", 10},
                                      {utils, "torch_pad_and_concatenate", 86},
                                      {utils, "nested_concat", 128},
                                      {utils, "add", 376},
                                      {kTrainer, "evaluation_loop", 3023},
                                      {kTrainer, "evaluate", 2871},
                                      {"/home/me/evaluate.py", "<module>", 25}});
  EXPECT_TRUE(concat.eval_outputs);
  EXPECT_EQ(concat.phase, Phase::kOther);  // no forward frame: outside the model
  // A user's own nested_concat is not Trainer's.
  EXPECT_FALSE(
      classify({{"/home/me/utils.py", "nested_concat", 12}, {"/home/me/evaluate.py", "<module>", 25}}).eval_outputs);
}

// Note [Evaluation outputs]: the largest K whose outputs alive beyond K - 1
// steps plus the failing concatenation beyond K steps cover the need.
TEST(Evaluation, EvalAccumulationStepsIsTheLargestThatFreesTheNeed) {
  EvalOutputs o;
  o.bytes = 5 * 32 * kMiB;  // 5 steps alive
  o.at_concat = true;
  o.request_bytes = 6 * 32 * kMiB;  // the 6th step's concatenation
  o.step_bytes = 32 * kMiB;
  o.steps = 6;
  // K = 4: (160 - 96) + (192 - 128) = 128 MiB < 192; K = 3: (160 - 64) + (192 - 96) = 192 MiB.
  EXPECT_EQ(eval_accumulation(o, 192 * kMiB).steps, 3);
  EXPECT_EQ(eval_accumulation(o, 192 * kMiB).frees_bytes, 192 * kMiB);
  EXPECT_EQ(eval_accumulation(o, 128 * kMiB).steps, 4);
  EXPECT_EQ(eval_accumulation(o, 128 * kMiB).frees_bytes, 128 * kMiB);
  // Nothing but K = 1 (no concatenation at all) frees 300 MiB: it frees everything it can.
  EXPECT_EQ(eval_accumulation(o, 300 * kMiB).steps, 1);
  EXPECT_EQ(eval_accumulation(o, 300 * kMiB).frees_bytes, 160 * kMiB + 192 * kMiB);
  // The step unknown (one concatenation seen): K = 1.
  o.step_bytes = 0;
  o.steps = 0;
  EXPECT_EQ(eval_accumulation(o, kMiB).steps, 1);
  // An out-of-memory in the next step's forward: only the outputs alive shrink.
  o = EvalOutputs{};
  o.bytes = 8 * 32 * kMiB;
  o.step_bytes = 32 * kMiB;
  o.steps = 8;
  EXPECT_EQ(eval_accumulation(o, 100 * kMiB).steps, 5);  // 256 - 4 x 32 = 128 >= 100; K = 6 frees 96
  EXPECT_EQ(eval_accumulation(o, 100 * kMiB).frees_bytes, 128 * kMiB);
}

// Before: "The request did not fit [capacity]" with no fix but the cap, the
// outputs "unattributed" at evaluate.py:31.
TEST(Evaluation, KeptOutputsAreTheVerdictAndEvalAccumulationStepsTheFix) {
  const std::string path = testing::synthetic_fixture("hf_gpt2_eval_outputs_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.phase, Phase::kOther);
  EXPECT_EQ(o.requested_bytes, 192 * kMiB);  // the 6th step's logits concatenation
  // 5 steps of logits (32 MiB) and labels (32 KiB), and 6 of losses (512
  // bytes): evaluation_loop concatenates the losses (line 3008) before the
  // logits (3023).
  const int64_t kept = 5 * (32 * kMiB + 32 * kKiB) + 6 * 512;
  EXPECT_TRUE(o.eval_outputs.at_concat);
  EXPECT_EQ(o.eval_outputs.bytes, kept);
  EXPECT_EQ(o.eval_outputs.step_bytes, 32 * kMiB);
  EXPECT_EQ(o.eval_outputs.steps, 6);
  EXPECT_EQ(testing::alive_bytes(o, Category::kEvalOutputs), kept);
  EXPECT_EQ(testing::alive_bytes(o, Category::kParameters), 96 * kMiB);
  EXPECT_EQ(testing::alive_bytes(o, Category::kActivations), 32 * kMiB);   // the 6th step's logits
  EXPECT_EQ(o.allocated_bytes, 96 * kMiB + kept + 32 * kMiB + 32 * kKiB);  // + the 6th step's labels

  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(d.verdicts.front().id, VerdictId::kEvalOutputsAccumulated);
  for (const Verdict& v : d.verdicts) EXPECT_NE(v.id, VerdictId::kCapacity);
  EXPECT_NE(d.verdicts.front().evidence.find("6 steps of 32.00 MiB"), std::string::npos) << d.verdicts.front().evidence;

  ASSERT_FALSE(d.recommendations.empty());
  const Recommendation& first = d.recommendations.front();
  EXPECT_EQ(first.id, FixId::kEvalAccumulation);
  EXPECT_EQ(first.change, "TrainingArguments(eval_accumulation_steps=3)");
  EXPECT_EQ(first.frees_bytes, (kept - 2 * 32 * kMiB) + (192 - 3 * 32) * kMiB);
  EXPECT_NE(first.sufficiency, Sufficiency::kNotEnough);
  // Halving the batch keeps the same samples; nothing here is a training
  // step's, nor are there training iterations to record more of.
  for (const Recommendation& r : d.recommendations) {
    EXPECT_NE(r.id, FixId::kMicroBatch);
    EXPECT_NE(r.id, FixId::kActivationCheckpointing);
    EXPECT_NE(r.id, FixId::kRecordMore);
  }

  const nlohmann::json j = nlohmann::json::parse(render_json(d));
  EXPECT_EQ(j["ooms"][0]["eval_outputs"]["steps"], 6);
  EXPECT_EQ(j["ooms"][0]["eval_outputs"]["bytes"], kept);
  EXPECT_EQ(j["ooms"][0]["alive"]["eval_outputs_bytes"], kept);
  EXPECT_EQ(j["recommendations"][0]["id"], "eval_accumulation_steps");
  EXPECT_NE(render_text(d).find("concatenating evaluation outputs"), std::string::npos);
}

TEST(Evaluation, CompareNamesTheOutputsThatAppeared) {
  const std::string a = testing::synthetic_fixture("hf_llama_generate_oom.pickle");
  const std::string b = testing::synthetic_fixture("hf_gpt2_eval_outputs_oom.pickle");
  SKIP_IF_MISSING(b);
  DiagnoseOptions all;
  all.top = std::numeric_limits<int>::max();
  const Comparison c = compare(testing::diagnose_file(a, all), testing::diagnose_file(b, all), 10);
  const auto eval = std::find_if(c.verdicts.begin(), c.verdicts.end(),
                                 [](const CompareVerdict& v) { return v.id == CompareVerdictId::kEvalOutputsChanged; });
  ASSERT_NE(eval, c.verdicts.end());
  EXPECT_EQ(eval->change_bytes, 5 * (32 * kMiB + 32 * kKiB) + 6 * 512);  // as in the test above
  EXPECT_EQ(c.after_rows[static_cast<size_t>(Category::kEvalOutputs)], eval->change_bytes);
}

}  // namespace
}  // namespace oomtune::diagnose
