// Frames classified by package (issue #48): the torch root found from the
// snapshot's own frames, layers and call sites, and the same report for a
// snapshot whose every path was moved under a folder named `torch`.

#include "diagnose/frames.h"

#include <unistd.h>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/byte_size.h"
#include "diagnose/attribution.h"
#include "diagnose/diagnosis.h"
#include "diagnose/render.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

TEST(FrameIndex, TorchRootIsFoundFromTheFramesNotFromASubstring) {
  const std::string venv = "/home/me/torch/.venv/lib/python3.12/site-packages";
  const Snapshot s = testing::with_stacks({{
      {venv + "/torch/nn/modules/linear.py", "forward", 125},  // 0 torch
      {"/home/me/torch/model.py", "forward", 30},              // 1 user, in a folder named torch
      {"/home/me/torch/utils/data.py", "load", 12},            // 2 user: torch/utils/ but not PyTorch's
      {venv + "/numpy/core/numeric.py", "ones", 9},            // 3 library
      {"/usr/lib/python3.12/threading.py", "run", 1010},       // 4 stdlib
      {"<frozen runpy>", "_run_code", 88},                     // 5 stdlib
      {"/home/me/torch/train.py", "main", 44},                 // 6 user
  }});
  const FrameIndex index(s);
  ASSERT_EQ(index.torch_roots(), std::vector<std::string>{venv + "/torch/"});
  EXPECT_EQ(index.origin(0), Origin::kTorch);
  EXPECT_EQ(index.origin(1), Origin::kUser);
  EXPECT_EQ(index.origin(2), Origin::kUser);
  EXPECT_EQ(index.origin(3), Origin::kLibrary);
  EXPECT_EQ(index.origin(4), Origin::kStdlib);
  EXPECT_EQ(index.origin(5), Origin::kStdlib);
  EXPECT_EQ(index.origin(6), Origin::kUser);
}

TEST(FrameIndex, ASourceCheckoutIsTorchWhenItsOwnFilesShow) {
  // PyTorch's own file: a checkout; then all of that root is torch. The
  // user's torch/optim/ lies outside packages and holds no own file.
  const Frame own{"/src/pytorch/torch/nn/modules/module.py", "_call_impl", 1784};
  const Frame memory{"/src/pytorch/torch/cuda/memory.py", "_snapshot", 900};
  const Frame user_step{"/work/torch/optim/my_sgd.py", "step", 10};
  const Snapshot s = testing::with_stacks({{own, memory, user_step}, {user_step}});
  const FrameIndex index(s);
  ASSERT_EQ(index.torch_roots(), std::vector<std::string>{"/src/pytorch/torch/"});
  EXPECT_EQ(index.origin(0), Origin::kTorch);
  EXPECT_EQ(index.origin(1), Origin::kTorch);
  EXPECT_EQ(index.origin(2), Origin::kUser);
  EXPECT_EQ(index.phase(2), Phase::kOptimizer);  // a step in the user's optimizer file
  // A module called inside that step: a closure's forward (Note [A closure
  // inside the optimizer step], frames.cpp).
  EXPECT_EQ(index.phase(1), Phase::kForward);
}

TEST(FrameIndex, LayerIsInnermostModelCodeAndCallSiteIsTheScriptLine) {
  const std::string venv = "/opt/venv/lib/python3.11/site-packages";
  const Snapshot s = testing::with_stacks({
      {{venv + "/torch/nn/modules/linear.py", "forward", 125},
       {venv + "/torch/nn/modules/module.py", "_call_impl", 1784},
       {venv + "/timm/layers/mlp.py", "forward", 44},  // timm's layer: model code
       {venv + "/timm/models/vision_transformer.py", "forward", 170},
       {"/home/u/train.py", "train_step", 20},  // the call site
       {"/home/u/train.py", "main", 80},
       {"/home/u/train.py", "<module>", 99}},
      {{venv + "/torch/optim/adamw.py", "_init_group", 120},
       {venv + "/accelerate/optimizer.py", "step", 178},  // a library helper: not model code
       {"/home/u/train.py", "train_step", 24},
       {"/home/u/train.py", "main", 80}},
  });
  const FrameIndex index(s);
  EXPECT_EQ(index.describe(index.layer_frame(1)), "mlp.py:44 in forward");
  EXPECT_EQ(index.describe(index.call_frame(1)), "train.py:20 in train_step");
  EXPECT_EQ(index.describe(index.model_forward_frame(1)), "vision_transformer.py:170 in forward");
  EXPECT_EQ(index.phase(1), Phase::kForward);
  EXPECT_EQ(index.describe(index.layer_frame(2)), "train.py:24 in train_step");
  EXPECT_EQ(index.describe(index.call_frame(2)), "train.py:24 in train_step");
  EXPECT_EQ(index.phase(2), Phase::kOptimizer);
}

// Optimizer steps whose files do not say "optim": DeepSpeed's engine
// (engine.step -> _take_model_step -> the ZeRO optimizer's step -> FusedAdam
// in deepspeed/ops/adam/), torch.amp's GradScaler.step and unscale_, and
// gradient clipping before the step (torch/nn/utils/clip_grad.py, from HF
// Trainer through Accelerate: the frames PyTorch 2.11 and transformers
// 5.24 name); a diffusers scheduler's step stays what its other frames say.
TEST(FrameIndex, DeepSpeedAndGradScalerStepsAreTheOptimizer) {
  const std::string venv = "/opt/venv/lib/python3.11/site-packages";
  const Snapshot s = testing::with_stacks({
      {{venv + "/deepspeed/ops/adam/fused_adam.py", "step", 191},
       {venv + "/deepspeed/runtime/zero/stage_1_and_2.py", "step", 1985},
       {venv + "/deepspeed/runtime/engine.py", "_take_model_step", 2213},
       {venv + "/deepspeed/runtime/engine.py", "step", 2319},
       {"/home/u/train.py", "main", 80}},
      {{venv + "/torch/amp/grad_scaler.py", "step", 457}, {"/home/u/train.py", "main", 81}},
      {{venv + "/diffusers/schedulers/scheduling_ddpm.py", "step", 440}, {"/home/u/sample.py", "main", 30}},
      {{venv + "/torch/nn/utils/clip_grad.py", "_get_total_norm", 96},
       {venv + "/torch/nn/utils/clip_grad.py", "clip_grad_norm_", 231},
       {venv + "/accelerate/accelerator.py", "_clip_grad_norm_dtensor_aware", 2960},
       {venv + "/accelerate/accelerator.py", "clip_grad_norm_", 3048},
       {venv + "/transformers/trainer.py", "_clip_grad_norm", 2787},
       {venv + "/transformers/trainer.py", "_inner_training_loop", 1939},
       {"/home/u/train.py", "main", 82}},
      {{venv + "/torch/amp/grad_scaler.py", "unscale_", 356}, {"/home/u/train.py", "main", 83}},
  });
  const FrameIndex index(s);
  EXPECT_EQ(index.phase(1), Phase::kOptimizer);
  EXPECT_EQ(index.phase(2), Phase::kOptimizer);
  EXPECT_EQ(index.phase(3), Phase::kOther);
  EXPECT_EQ(index.phase(4), Phase::kOptimizer);
  EXPECT_EQ(index.phase(5), Phase::kOptimizer);
}

// A model built on the device makes its weights in its own __init__:
// transformers' Conv1D (GPT-2) calls torch.empty before nn.Parameter, so no
// torch/nn/ frame says so (the stacks transformers 5.24 records, with
// scripts/record_cpu_snapshot.py). An object a forward builds is not the model.
TEST(FrameIndex, ALibraryModelsInitAllocatesItsParameters) {
  const std::string venv = "/opt/venv/lib/python3.11/site-packages";
  const Frame gpt2_mlp{venv + "/transformers/models/gpt2/modeling_gpt2.py", "__init__", 235};
  const Frame script{"/home/u/train.py", "<module>", 12};
  const Snapshot s = testing::with_stacks({
      {{venv + "/transformers/pytorch_utils.py", "__init__", 110},
       gpt2_mlp,
       {venv + "/transformers/models/gpt2/modeling_gpt2.py", "__init__", 262},
       {venv + "/torch/nn/modules/module.py", "__call__", 1779},
       script},
      {gpt2_mlp, script},
      {gpt2_mlp, {venv + "/transformers/models/gpt2/modeling_gpt2.py", "forward", 300}, script},
      {{venv + "/transformers/cache_utils.py", "__init__", 1200}, script},
      {{"/home/u/model.py", "__init__", 20}, script},
  });
  const FrameIndex index(s);
  EXPECT_TRUE(index.allocates_parameters(1));
  EXPECT_EQ(index.phase(1), Phase::kOther);
  EXPECT_TRUE(index.allocates_parameters(2));
  EXPECT_FALSE(index.allocates_parameters(3));  // inside a forward
  EXPECT_EQ(index.phase(3), Phase::kForward);
  EXPECT_FALSE(index.allocates_parameters(4));  // not a model file
  EXPECT_FALSE(index.allocates_parameters(5));  // the user's own __init__ may be anything's
}

// An optimizer's arithmetic (the foreach implementation, CUDA's default, in
// torch 2.11's adam.py and rmsprop.py; adamw.py's own before 2.2) makes
// temporaries only; its states come from _init_group. SGD's arithmetic makes
// its momentum buffers. The optimizer is named by its file.
TEST(FrameIndex, AnOptimizersArithmeticIsNotItsState) {
  const std::string torch = "/opt/venv/lib/python3.11/site-packages/torch";
  const Frame step{torch + "/optim/adam.py", "step", 247};
  const Frame script{"/home/u/train.py", "main", 80};
  const Frame wrapper{torch + "/optim/optimizer.py", "wrapper", 485};
  const Snapshot s = testing::with_stacks({
      {{torch + "/optim/adam.py", "_multi_tensor_adam", 640}, {torch + "/optim/adam.py", "adam", 960}, step, script},
      {{torch + "/optim/adamw.py", "_single_tensor_adamw", 390}, step, script},
      {{torch + "/optim/adam.py", "_init_group", 180}, step, script},
      {{torch + "/optim/sgd.py", "_multi_tensor_sgd", 400}, {torch + "/optim/sgd.py", "step", 120}, script},
      {{torch + "/optim/rmsprop.py", "_multi_tensor_rmsprop", 400},
       {torch + "/optim/rmsprop.py", "step", 160},
       wrapper,
       script},
      {{torch + "/optim/rmsprop.py", "_init_group", 123}, {torch + "/optim/rmsprop.py", "step", 160}, wrapper, script},
      {wrapper, script},
  });
  const FrameIndex index(s);
  EXPECT_TRUE(index.runs_optimizer_math(1));
  EXPECT_TRUE(index.runs_optimizer_math(2));
  EXPECT_FALSE(index.runs_optimizer_math(3));  // the states
  EXPECT_FALSE(index.runs_optimizer_math(4));  // SGD makes its momentum buffers in its arithmetic
  EXPECT_TRUE(index.runs_optimizer_math(5));
  EXPECT_FALSE(index.runs_optimizer_math(6));
  for (StackId id = 1; id <= 7; ++id) EXPECT_EQ(index.phase(id), Phase::kOptimizer);
  EXPECT_EQ(category_before_recording(1, index), Category::kTemporaries);
  EXPECT_EQ(category_before_recording(3, index), Category::kOptimizerState);
  EXPECT_EQ(category_before_recording(5, index), Category::kTemporaries);
  EXPECT_EQ(category_before_recording(6, index), Category::kOptimizerState);

  // The optimizer: the innermost torch/optim/ file that defines one (not optimizer.py).
  ASSERT_NE(index.optimizer(1), nullptr);
  EXPECT_EQ(index.optimizer(1)->name, "Adam/AdamW");  // AdamW's step runs in adam.py in recent torch
  EXPECT_EQ(index.optimizer(2)->name, "AdamW");
  EXPECT_EQ(index.optimizer(2)->states_per_parameter, 2);
  EXPECT_EQ(index.optimizer(4)->name, "SGD");
  EXPECT_EQ(index.optimizer(6)->name, "RMSprop");
  EXPECT_EQ(index.optimizer(6)->states_per_parameter, 1);
  EXPECT_EQ(index.optimizer(6)->eight_bit, "bitsandbytes.optim.RMSprop8bit");
  EXPECT_EQ(index.optimizer(7), nullptr);
}

// Lightning's automatic optimization runs training_step and backward in the
// closure AdamW.step calls (`loss = closure()`): torch/optim/ frames outer to
// them do not make them the optimizer's (Note [A closure inside the
// optimizer step], frames.cpp). The optimizer's own allocations stay its.
TEST(FrameIndex, AClosureInsideTheOptimizerStepKeepsItsPhase) {
  const std::string venv = "/opt/venv/lib/python3.11/site-packages";
  const std::vector<Frame> step = {
      {venv + "/torch/optim/adamw.py", "step", 227},
      {venv + "/torch/optim/optimizer.py", "wrapper", 485},
      {venv + "/lightning/pytorch/core/optimizer.py", "step", 154},
      {venv + "/lightning/pytorch/loops/optimization/automatic.py", "_optimizer_step", 270},
      {"/home/u/train.py", "main", 50}};
  const std::vector<Frame> closure = {{venv + "/lightning/pytorch/loops/optimization/automatic.py", "closure", 146},
                                      {venv + "/lightning/pytorch/loops/optimization/automatic.py", "__call__", 132}};
  const Snapshot s = testing::with_stacks({
      testing::join_frames({{{venv + "/torch/nn/modules/linear.py", "forward", 125},
                             {venv + "/torch/nn/modules/module.py", "_call_impl", 1784},
                             {"/home/u/model.py", "forward", 30},
                             {"/home/u/model.py", "training_step", 44}},
                            closure,
                            step}),
      testing::join_frames({{{venv + "/torch/autograd/graph.py", "_engine_run_backward", 869},
                             {venv + "/torch/autograd/__init__.py", "backward", 381},
                             {venv + "/torch/_tensor.py", "backward", 631},
                             {venv + "/lightning/pytorch/core/module.py", "backward", 1089}},
                            closure,
                            step}),
      testing::join_frames({{{venv + "/torch/optim/adamw.py", "_init_group", 160}}, step}),
  });
  const FrameIndex index(s);
  EXPECT_EQ(index.phase(1), Phase::kForward);
  EXPECT_EQ(index.phase(2), Phase::kBackward);
  EXPECT_EQ(index.phase(3), Phase::kOptimizer);
}

// A stack with a layer but no user frame (a library calling the model) groups
// by call site under "(no call site)", never with the placeholders.
TEST(FrameIndex, NoCallSiteIsItsOwnGroup) {
  const std::string venv = "/opt/venv/lib/python3.11/site-packages";
  Snapshot s = testing::with_stacks({{{venv + "/torch/nn/modules/linear.py", "forward", 125},
                                      {venv + "/timm/models/resnet.py", "forward", 90},
                                      {venv + "/lightning/pytorch/loops/fit_loop.py", "run", 200}}});
  Segment seg;
  seg.address = 1 << 20;
  seg.total_size = 2 << 20;
  seg.allocated_size = 1 << 20;
  seg.blocks.push_back(Block{1 << 20, 1 << 20, 1 << 20, BlockState::kActiveAllocated, 1});  // frames: stack 1
  seg.blocks.push_back(Block{2 << 20, 1 << 20, 1 << 20, BlockState::kActiveAllocated, 0});  // no frames
  seg.allocated_size = 2 << 20;
  s.segments.push_back(seg);
  s.device_traces.emplace_back();
  DiagnoseOptions options;
  options.group_by = GroupBy::kCall;
  const Diagnosis d = diagnose(s, "made", options);
  ASSERT_EQ(d.peak.sites.size(), 2u);
  EXPECT_EQ(d.peak.sites[0].site, "(allocated before recording began)");
  EXPECT_EQ(d.peak.sites[0].bytes, 1 << 20);
  EXPECT_EQ(d.peak.sites[1].site, "(no call site)");
  EXPECT_EQ(d.peak.sites[1].layer, "resnet.py:90 in forward");
  EXPECT_EQ(d.peak.sites[1].bytes, 1 << 20);
}

// The real H100 snapshots, rewritten by scripts/move_snapshot_paths.py with
// every path under /home/user/torch/: the same report, but for the file name.
TEST(FrameIndex, RealSnapshotsMovedUnderAFolderNamedTorchGiveTheSameReport) {
  for (const char* name : {"oom_gpt_activations.pickle", "oom_fragmentation.pickle"}) {
    SCOPED_TRACE(name);
    const std::string original = testing::real_fixture(name);
    SKIP_IF_MISSING(original);
    const std::string moved = ::testing::TempDir() + "moved_" + std::to_string(::getpid()) + "_" + name;
    const std::string command = std::string(OOMTUNE_PYTHON) + " " + OOMTUNE_SOURCE_DIR +
                                "/scripts/move_snapshot_paths.py " + original + " " + moved;
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    const Snapshot before = load_snapshot(original), after = load_snapshot(moved);
    std::remove(moved.c_str());
    ASSERT_EQ(before.frames.size(), after.frames.size());
    for (const Frame& f : after.frames) ASSERT_EQ(f.filename.rfind("/home/user/torch/", 0), 0u) << f.filename;
    DiagnoseOptions options;
    const Diagnosis a = diagnose(before, original, options);
    const Diagnosis b = diagnose(after, original, options);
    EXPECT_EQ(render_text(a), render_text(b));
    // The torch root moved with the files; JSON differs only there and in full paths.
    ASSERT_EQ(b.torch_roots.size(), a.torch_roots.size());
    for (size_t i = 0; i < a.torch_roots.size(); ++i)
      EXPECT_EQ(b.torch_roots[i], "/home/user/torch" + a.torch_roots[i]);
    ASSERT_EQ(a.oom_sites.size(), b.oom_sites.size());
    for (size_t i = 0; i < a.oom_sites.size(); ++i) {
      EXPECT_EQ(b.oom_sites[i].layer, a.oom_sites[i].layer);
      EXPECT_EQ(b.oom_sites[i].call_site, a.oom_sites[i].call_site);
      EXPECT_EQ(b.oom_sites[i].bytes, a.oom_sites[i].bytes);
    }
  }
}

// scripts/make_snapshot_fixtures.py hf_bert_forward_oom: a Trainer fine-tuning
// a BERT, project and venv under /home/user/torch/, out of memory in the second
// layer's BertIntermediate (modeling_bert.py:466).
TEST(FrameIndex, HuggingFaceSnapshotNamesModelingBertLines) {
  const std::string path = testing::synthetic_fixture("hf_bert_forward_oom.pickle");
  SKIP_IF_MISSING(path);
  const Diagnosis d = testing::diagnose_file(path);
  EXPECT_EQ(d.torch_roots, std::vector<std::string>{"/home/user/torch/.venv/lib/python3.11/site-packages/torch/"});
  ASSERT_EQ(d.ooms.size(), 1u);
  const OomReport& o = d.ooms[0];
  EXPECT_EQ(o.requested_bytes, 32 * kMiB);
  EXPECT_EQ(o.phase, Phase::kForward);
  EXPECT_EQ(o.layer, "modeling_bert.py:466 in forward");
  EXPECT_EQ(o.call_site, "finetune.py:61 in main");
  EXPECT_EQ(o.model_forward, "modeling_bert.py:1493 in forward");
  EXPECT_NE(d.verdicts.front().evidence.find("at modeling_bert.py:466 in forward (called from finetune.py:61 in main)"),
            std::string::npos)
      << d.verdicts.front().evidence;
  // One whole layer and the second's attention were alive: softmax probabilities
  // (modeling_bert.py:360) 2 x 32 MiB, the intermediate (:466) 32 MiB, q/k/v 2 x 8 MiB
  // each, the output (:480) 8 MiB; the 4 x 24 MiB weights were moved by finetune.py:48.
  ASSERT_EQ(d.oom_sites.size(), 7u);
  EXPECT_EQ(d.oom_sites[0].site, "finetune.py:48 in main");
  EXPECT_EQ(d.oom_sites[0].bytes, 96 * kMiB);
  EXPECT_EQ(d.oom_sites[0].category, Category::kParameters);
  EXPECT_EQ(d.oom_sites[1].site, "modeling_bert.py:360 in forward");
  EXPECT_EQ(d.oom_sites[1].bytes, 64 * kMiB);
  EXPECT_EQ(d.oom_sites[1].call_site, "finetune.py:61 in main");
  EXPECT_EQ(d.oom_sites[1].filename,
            "/home/user/torch/.venv/lib/python3.11/site-packages/transformers/models/bert/"
            "modeling_bert.py");
  EXPECT_EQ(d.oom_sites[2].site, "modeling_bert.py:466 in forward");
  EXPECT_EQ(d.oom_sites[2].bytes, 32 * kMiB);
  for (size_t i = 3; i < 6; ++i) EXPECT_EQ(d.oom_sites[i].bytes, 16 * kMiB) << d.oom_sites[i].site;
  EXPECT_EQ(d.oom_sites[6].site, "modeling_bert.py:480 in forward");

  // --group-by call: everything the forward kept is one line of finetune.py.
  const Diagnosis by_call = testing::diagnose_file(path, DiagnoseOptions{/*top=*/10, GroupBy::kCall});
  ASSERT_EQ(by_call.oom_sites.size(), 2u);
  EXPECT_EQ(by_call.oom_sites[0].site, "finetune.py:61 in main");
  EXPECT_EQ(by_call.oom_sites[0].bytes, 64 * kMiB + 32 * kMiB + 3 * 16 * kMiB + 8 * kMiB);
  EXPECT_EQ(by_call.oom_sites[0].others, 5);  // six modeling_bert.py lines: 329, 330, 331, 360, 466, 480
  EXPECT_EQ(by_call.oom_sites[1].site, "finetune.py:48 in main");
  const auto j = nlohmann::json::parse(render_json(by_call));
  EXPECT_EQ(j["group_by"], "call");
  EXPECT_EQ(j["ooms"][0]["layer"], "modeling_bert.py:466 in forward");
  EXPECT_EQ(j["oom_sites"][0]["others"], 5);
}

}  // namespace
}  // namespace oomtune::diagnose
