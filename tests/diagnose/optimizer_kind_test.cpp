// The optimizer a trace names decides what its first step still needed and
// which 8-bit class and fused kernel are offered (diagnose/optimizer_kind.h):
// one built trace, its optimizer frames in AdamW's, RMSprop's, Adagrad's,
// NAdam's or no file. Four parameters of 16 MiB, their gradients, then the
// first step's states: two made when the third fails, or the step's
// arithmetic failing after one temporary.

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/byte_size.h"
#include "diagnose/diagnosis.h"
#include "diagnose/render.h"
#include "test_support.h"

namespace oomtune::diagnose {
namespace {

constexpr int64_t kStateBytes = 16 * kMiB;
constexpr int kStateParameters = 4;

// `optimizer_file`: the torch/optim/ file of the step's frames ("" for a
// step whose frames name no torch.optim optimizer: a user's own optim.py).
// `arithmetic`: where given (_multi_tensor_adam, ...), the step's
// arithmetic allocates one 16 MiB temporary before the out-of-memory, there.
// `optimizer_dir`: where the optimizer's file is (torch/optim/ by default).
// `init`: how _init_group's lines allocate: every state on one line;
// with 0-dim (4-byte) allocations, as fused optimizers' step counters on a
// line of their own before each parameter's states, or as a 0-dim
// parameter's states on the states' line; or the three states of one
// parameter on three lines, as amsgrad=True makes them (Note [States an
// option adds]).
// kCounterOnly: a fused step that failed at its first state, after its
// first counter. kDefaultDeviceCounters: kStepCounters made through
// torch.utils._device's mode (`with torch.device("cuda"):` around the step).
enum class Scalars { kNone, kStepCounters, kScalarParameter, kThreeStateLines, kCounterOnly, kDefaultDeviceCounters };
Diagnosis first_step_oom(const std::string& optimizer_file, const std::string& arithmetic = "", bool trainer = false,
                         std::string optimizer_dir = "", Scalars scalars = Scalars::kNone) {
  const std::string torch = "/venv/lib/python3.12/site-packages/torch";
  if (optimizer_dir.empty()) optimizer_dir = torch + "/optim/";
  // Under Hugging Face's Trainer, its frame is the optimizer step's caller.
  const Frame script =
      trainer ? Frame{"/venv/lib/python3.12/site-packages/transformers/trainer.py", "_inner_training_loop", 2720}
              : Frame{"/home/u/train.py", "main", 30};
  const Frame step = optimizer_file.empty() ? Frame{"/home/u/optim.py", "step", 12}
                                            : Frame{optimizer_dir + optimizer_file, "step", 160};
  const Frame init_group = optimizer_file.empty() ? Frame{"/home/u/optim.py", "init_state", 20}
                                                  : Frame{optimizer_dir + optimizer_file, "_init_group", 123};
  const Frame wrapper{torch + "/optim/optimizer.py", "wrapper", 485};
  Snapshot s = testing::with_stacks({
      {{torch + "/nn/modules/module.py", "_apply", 900}, script},                  // 1: parameters
      {{torch + "/_tensor.py", "backward", 620}, script},                          // 2: gradients
      {init_group, step, wrapper, script},                                         // 3: states
      {{optimizer_dir + optimizer_file, arithmetic, 600}, step, wrapper, script},  // 4: the arithmetic
      {{init_group.filename, init_group.name, 118}, step, wrapper, script},        // 5: step counters
      {{init_group.filename, init_group.name, 127}, step, wrapper, script},        // 6: a second state
      {{init_group.filename, init_group.name, 131}, step, wrapper, script},        // 7: a third state
      {{torch + "/utils/_device.py", "__torch_function__", 116},
       {init_group.filename, init_group.name, 118},
       step,
       wrapper,
       script},  // 8: step counters under a default device
  });
  std::vector<TraceEvent>& trace = s.device_traces.emplace_back();
  int64_t addr = 1 << 30;
  auto alloc = [&](StackId stack, int64_t bytes = kStateBytes) {
    TraceEvent e;
    e.action = TraceAction::kAlloc;
    e.addr = addr;
    e.size = bytes;
    e.frames = stack;
    trace.push_back(e);
    addr += std::max<int64_t>(bytes, 512);
  };
  for (int i = 0; i < kStateParameters; ++i) alloc(1);
  for (int i = 0; i < kStateParameters; ++i) alloc(2);
  if (scalars == Scalars::kScalarParameter) {
    alloc(3, 4);
    alloc(3, 4);
  }
  const bool counters = scalars == Scalars::kStepCounters || scalars == Scalars::kDefaultDeviceCounters;
  const StackId counter = scalars == Scalars::kDefaultDeviceCounters ? 8 : 5;
  if (counters || scalars == Scalars::kCounterOnly) alloc(counter, 4);
  if (scalars != Scalars::kCounterOnly) {
    alloc(3);
    alloc(scalars == Scalars::kThreeStateLines ? 6 : 3);
  }
  if (scalars == Scalars::kThreeStateLines) alloc(7);
  if (counters) alloc(counter, 4);
  if (!arithmetic.empty()) alloc(4);
  TraceEvent oom;
  oom.action = TraceAction::kOom;
  oom.size = kStateBytes;
  oom.frames = arithmetic.empty() ? 3 : 4;
  trace.push_back(oom);
  return diagnose(s, "first_step.pickle", DiagnoseOptions{});
}

using testing::find_fix;

const Recommendation* eight_bit(const Diagnosis& d) { return find_fix(d, FixId::kAdamW8bit); }

// The step failed in _init_group: its arithmetic, foreach as PyTorch runs
// it on CUDA by default, is still to come with its temporaries: one
// parameter list's bytes for RMSprop and Adam (_foreach_sqrt).
TEST(OptimizerKind, RmspropsFirstStepNeedsOneStateAParameter) {
  const Diagnosis d = first_step_oom("rmsprop.py");
  ASSERT_NE(d.optimizer, nullptr);
  EXPECT_EQ(d.optimizer->name, "RMSprop");
  EXPECT_EQ(d.need.method, NeedMethod::kOptimizerFirstStep);
  EXPECT_EQ(d.need.states_per_parameter, 1);
  EXPECT_EQ(d.need.state_total_bytes, kStateParameters * kStateBytes);
  EXPECT_EQ(d.need.implementation, OptimizerImplementation::kForeach);
  EXPECT_TRUE(d.need.implementation_assumed());
  EXPECT_EQ(d.need.temporaries_total_bytes, kStateParameters * kStateBytes);
  // Two square_avg made, two to come, then the temporaries.
  EXPECT_EQ(d.need.still_needed_bytes, (kStateParameters - 2 + kStateParameters) * kStateBytes);
  const Recommendation* r = eight_bit(d);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->change, "8-bit RMSprop (bitsandbytes.optim.RMSprop8bit: blockwise-quantized states)");
  EXPECT_EQ(r->frees_bytes, 3 * kStateParameters * kStateBytes / 4 + kStateParameters * kStateBytes);
  EXPECT_EQ(find_fix(d, FixId::kFusedOptimizer), nullptr);  // RMSprop has no fused kernel
  EXPECT_NE(d.verdicts.front().evidence.find("The first step of RMSprop (torch.optim) allocates one state"),
            std::string::npos)
      << d.verdicts.front().evidence;
}

TEST(OptimizerKind, AdamwsFirstStepNeedsTwo) {
  const Diagnosis d = first_step_oom("adamw.py");
  ASSERT_NE(d.optimizer, nullptr);
  EXPECT_EQ(d.optimizer->name, "AdamW");
  EXPECT_EQ(d.need.states_per_parameter, 2);
  EXPECT_EQ(d.need.still_needed_bytes, (2 * kStateParameters - 2 + kStateParameters) * kStateBytes);
  const Recommendation* r = eight_bit(d);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->change, "8-bit AdamW (bitsandbytes.optim.AdamW8bit: blockwise-quantized states)");
  EXPECT_EQ(r->frees_bytes, 3 * 2 * kStateParameters * kStateBytes / 4 + kStateParameters * kStateBytes);
  EXPECT_EQ(r->sufficiency, Sufficiency::kEnough);
  const Recommendation* fused = find_fix(d, FixId::kFusedOptimizer);
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(fused->change, "torch.optim.AdamW(..., fused=True)");
  EXPECT_EQ(fused->frees_bytes, kStateParameters * kStateBytes);
  EXPECT_EQ(fused->sufficiency, Sufficiency::kNotEnough);
  EXPECT_NE(render_text(d).find("(first AdamW step: two states per parameter (exp_avg and exp_avg_sq), 2 x 64.00 MiB "
                                "of gradients = 128.00 MiB, of which 32.00 MiB existed; then its arithmetic's "
                                "temporaries (foreach, PyTorch's default on CUDA, assumed: its states were made with "
                                "no step counter on the device, so not fused; no frame shows the implementation yet): "
                                "1 x 64.00 MiB of gradients = 64.00 MiB at their peak, of which 0 B alive)"),
            std::string::npos)
      << render_text(d);
}

// The step's own frames say how its arithmetic runs; what it has made of
// its temporaries is alive (16 MiB here).
TEST(OptimizerKind, TheStepsFramesShowItsImplementation) {
  {
    const Diagnosis d = first_step_oom("adamw.py", "_multi_tensor_adamw");
    EXPECT_EQ(d.need.implementation, OptimizerImplementation::kForeach);
    EXPECT_FALSE(d.need.implementation_assumed());
    EXPECT_EQ(d.need.temporaries_left_bytes, (kStateParameters - 1) * kStateBytes);
    EXPECT_EQ(d.need.still_needed_bytes, (2 * kStateParameters - 2 + kStateParameters - 1) * kStateBytes);
    const Recommendation* fused = find_fix(d, FixId::kFusedOptimizer);
    ASSERT_NE(fused, nullptr);
    EXPECT_EQ(fused->frees_bytes, (kStateParameters - 1) * kStateBytes);
  }
  {
    // One parameter at a time: sqrt and quotient of the largest (16 MiB), one of them made.
    const Diagnosis d = first_step_oom("adamw.py", "_single_tensor_adamw");
    EXPECT_EQ(d.need.implementation, OptimizerImplementation::kSingleTensor);
    EXPECT_EQ(d.need.temporaries_total_bytes, 2 * kStateBytes);
    EXPECT_EQ(d.need.still_needed_bytes, (2 * kStateParameters - 2 + 1) * kStateBytes);
    EXPECT_EQ(find_fix(d, FixId::kFusedOptimizer), nullptr);
  }
  {
    const Diagnosis d = first_step_oom("adamw.py", "_fused_adamw");
    EXPECT_EQ(d.need.implementation, OptimizerImplementation::kFused);
    EXPECT_EQ(d.need.temporaries_total_bytes, 0);
    EXPECT_EQ(d.need.still_needed_bytes, (2 * kStateParameters - 2) * kStateBytes);
    EXPECT_EQ(find_fix(d, FixId::kFusedOptimizer), nullptr);
  }
}

// A later step whose trace holds no step without new states to compare
// with (the first step made them): its foreach temporaries to come alone.
TEST(OptimizerKind, ALaterStepNeedsItsTemporaries) {
  const std::string torch = "/venv/lib/python3.12/site-packages/torch";
  const Frame script{"/home/u/train.py", "main", 30};
  const Frame step{torch + "/optim/adam.py", "step", 230};
  Snapshot s = testing::with_stacks({
      {{torch + "/nn/modules/module.py", "_apply", 900}, script},             // 1: parameters
      {{torch + "/_tensor.py", "backward", 620}, script},                     // 2: gradients
      {{torch + "/optim/adam.py", "_init_group", 180}, step, script},         // 3: states
      {{torch + "/optim/adam.py", "_multi_tensor_adam", 640}, step, script},  // 4: the arithmetic
  });
  std::vector<TraceEvent>& trace = s.device_traces.emplace_back();
  int64_t next = 1 << 30;
  auto event = [&](TraceAction action, StackId stack, int64_t addr) {
    TraceEvent e;
    e.action = action;
    e.addr = addr;
    e.size = kStateBytes;
    e.frames = stack;
    trace.push_back(e);
    return addr;
  };
  auto alloc = [&](StackId stack) {
    next += kStateBytes;
    return event(TraceAction::kAlloc, stack, next);
  };
  for (int i = 0; i < kStateParameters; ++i) alloc(1);
  for (int i = 0; i < kStateParameters; ++i) alloc(2);
  // The first step: its states, its arithmetic's temporaries, freed.
  for (int i = 0; i < 2 * kStateParameters; ++i) alloc(3);
  std::vector<int64_t> temporaries;
  for (int i = 0; i < kStateParameters; ++i) temporaries.push_back(alloc(4));
  for (int64_t addr : temporaries) event(TraceAction::kFreeRequested, 4, addr);
  // Backward between the steps, then the second step's arithmetic fails at its second temporary.
  event(TraceAction::kFreeRequested, 2, alloc(2));
  alloc(4);
  TraceEvent oom;
  oom.action = TraceAction::kOom;
  oom.size = kStateBytes;
  oom.frames = 4;
  trace.push_back(oom);
  const Diagnosis d = diagnose(s, "later_step.pickle", DiagnoseOptions{});
  EXPECT_EQ(d.need.method, NeedMethod::kOptimizerStep);
  EXPECT_EQ(d.need.implementation, OptimizerImplementation::kForeach);
  EXPECT_FALSE(d.need.implementation_assumed());
  EXPECT_EQ(d.need.temporaries_total_bytes, kStateParameters * kStateBytes);
  EXPECT_EQ(d.need.still_needed_bytes, (kStateParameters - 1) * kStateBytes);
  const Recommendation* fused = find_fix(d, FixId::kFusedOptimizer);
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(fused->change, "torch.optim.Adam(..., fused=True) or torch.optim.AdamW(..., fused=True)");
  EXPECT_EQ(fused->sufficiency, Sufficiency::kEnough);
  EXPECT_NE(d.verdicts.front().evidence.find("Its states were made by an earlier step; this step's arithmetic "
                                             "(foreach) holds 64.00 MiB of temporaries at its peak."),
            std::string::npos)
      << d.verdicts.front().evidence;
}

// Under Hugging Face's Trainer, whose default optimizer is torch's fused
// AdamW (optim="adamw_torch_fused" with torch 2.8 or later), a step that
// failed in _init_group before any state is assumed fused: no temporaries
// to come. Once states were made, the step counters say which (Note [Step
// counters on the device]): none on the device is optim="adamw_torch",
// foreach, whatever the Trainer's default.
TEST(OptimizerKind, UnderTheTrainerFusedIsAssumed) {
  const Diagnosis d = first_step_oom("adam.py", "", /*trainer=*/true, "", Scalars::kCounterOnly);
  EXPECT_EQ(d.need.implementation, OptimizerImplementation::kFused);
  EXPECT_EQ(d.need.implementation_basis, ImplementationBasis::kHfTrainer);
  EXPECT_TRUE(d.need.implementation_assumed());
  EXPECT_EQ(d.need.temporaries_total_bytes, 0);
  // All eight 16 MiB states to come, beside the one 4-byte counter made.
  EXPECT_LE(std::abs(d.need.still_needed_bytes - 2 * kStateParameters * kStateBytes), 1024) << d.need.estimate;
  EXPECT_NE(d.need.estimate.find("fused, Hugging Face Trainer's default optim adamw_torch_fused"), std::string::npos)
      << d.need.estimate;
  EXPECT_EQ(find_fix(d, FixId::kFusedOptimizer), nullptr);

  const Diagnosis counters = first_step_oom("adam.py", "", /*trainer=*/true, "", Scalars::kStepCounters);
  EXPECT_EQ(counters.need.implementation, OptimizerImplementation::kFused);
  EXPECT_EQ(counters.need.implementation_basis, ImplementationBasis::kStepCounters);

  const Diagnosis host = first_step_oom("adam.py", "", /*trainer=*/true);
  EXPECT_EQ(host.need.implementation, OptimizerImplementation::kForeach);
  EXPECT_EQ(host.need.implementation_basis, ImplementationBasis::kHostStepCounters);
  EXPECT_EQ(host.need.temporaries_total_bytes, kStateParameters * kStateBytes);
  EXPECT_EQ(host.need.still_needed_bytes, (2 * kStateParameters - 2 + kStateParameters) * kStateBytes);
  EXPECT_NE(host.need.estimate.find("with no step counter on the device, so not fused"), std::string::npos)
      << host.need.estimate;
  const Recommendation* fused = find_fix(host, FixId::kFusedOptimizer);
  ASSERT_NE(fused, nullptr);
  EXPECT_NE(fused->reason.find("its step counters are on the host, so not fused"), std::string::npos) << fused->reason;
}

// bitsandbytes' optimizers: the job runs 8-bit states already, or 32-bit
// ones; the frames do not say which. No first-step states are estimated,
// no 8-bit class offered, and no temporaries counted.
TEST(OptimizerKind, BitsandbytesIsNotOfferedEightBit) {
  const Diagnosis d =
      first_step_oom("optimizer.py", "", false, "/venv/lib/python3.12/site-packages/bitsandbytes/optim/");
  ASSERT_NE(d.optimizer, nullptr);
  EXPECT_EQ(d.optimizer->name, "bitsandbytes' optimizer");
  EXPECT_FALSE(is_torch_optim(*d.optimizer));
  EXPECT_TRUE(is_torch_optim(*torch_optimizer("optim/adam.py")));
  EXPECT_EQ(d.need.method, NeedMethod::kRequest);
  EXPECT_EQ(eight_bit(d), nullptr);
  EXPECT_EQ(find_fix(d, FixId::kFusedOptimizer), nullptr);
  EXPECT_NE(d.verdicts.front().evidence.find("The step runs bitsandbytes' optimizer"), std::string::npos)
      << d.verdicts.front().evidence;
}

// Adagrad makes its `sum` when it is built: its first step makes no state
// of the parameters' size, so the need is the request alone.
TEST(OptimizerKind, AdagradsFirstStepMakesNoState) {
  const Diagnosis d = first_step_oom("adagrad.py");
  ASSERT_NE(d.optimizer, nullptr);
  EXPECT_EQ(d.optimizer->name, "Adagrad");
  EXPECT_EQ(d.need.method, NeedMethod::kRequest);
  EXPECT_EQ(d.need.still_needed_bytes, kStateBytes);
}

// NAdam has no bitsandbytes 8-bit class: none is offered (a change of
// optimizer is the user's call); offloading still is.
TEST(OptimizerKind, NoEightBitClassNoEightBitFix) {
  const Diagnosis d = first_step_oom("nadam.py");
  ASSERT_NE(d.optimizer, nullptr);
  EXPECT_EQ(d.optimizer->name, "NAdam");
  EXPECT_EQ(d.need.states_per_parameter, 2);
  EXPECT_EQ(eight_bit(d), nullptr);
  EXPECT_EQ(find_fix(d, FixId::kFusedOptimizer), nullptr);
  bool offload = false;
  for (const Recommendation& r : d.recommendations) offload = offload || r.id == FixId::kOptimizerOffload;
  EXPECT_TRUE(offload);
}

// No torch.optim frame: Adam's two states assumed, and said; the arithmetic
// is its own (bitsandbytes', DeepSpeed's, a custom one): its temporaries
// are not counted and torch's fused kernel is not offered.
TEST(OptimizerKind, UnnamedOptimizerIsAssumedAdam) {
  const Diagnosis d = first_step_oom("");
  EXPECT_EQ(d.optimizer, nullptr);
  EXPECT_EQ(d.need.states_per_parameter, 2);
  EXPECT_EQ(d.need.implementation, OptimizerImplementation::kUnknown);
  EXPECT_FALSE(d.need.temporaries_modelled);
  EXPECT_EQ(d.need.still_needed_bytes, (2 * kStateParameters - 2) * kStateBytes);
  EXPECT_NE(d.need.estimate.find("no torch.optim frame names it"), std::string::npos) << d.need.estimate;
  EXPECT_NE(d.need.estimate.find("are not counted"), std::string::npos) << d.need.estimate;
  const Recommendation* r = eight_bit(d);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->change, "8-bit AdamW (blockwise-quantized states)");
  EXPECT_EQ(find_fix(d, FixId::kFusedOptimizer), nullptr);
}

TEST(OptimizerKind, StatesCountedInWords) {
  EXPECT_EQ(count_states(1), "one state");
  EXPECT_EQ(count_states(2), "two states");
  EXPECT_EQ(count_states(7), "7 states");
  EXPECT_EQ(torch_optimizer("optim/optimizer.py"), nullptr);
  EXPECT_EQ(torch_optimizer("optim/sgd.py")->name, "SGD");
}

// Note [Step counters on the device]: a fused AdamW's first step failing
// among its states shows no arithmetic frame, but its step counters, made
// on the device on a line of their own: fused, no temporaries to come.
TEST(OptimizerKind, StepCountersOnTheDeviceSayFused) {
  const Diagnosis d = first_step_oom("adamw.py", "", false, "", Scalars::kStepCounters);
  EXPECT_EQ(d.need.implementation, OptimizerImplementation::kFused);
  EXPECT_EQ(d.need.implementation_basis, ImplementationBasis::kStepCounters);
  EXPECT_TRUE(d.need.implementation_assumed());
  EXPECT_EQ(d.need.temporaries_total_bytes, 0);
  // Two of eight 16 MiB states made, and two 4-byte counters (state too).
  EXPECT_LE(std::abs(d.need.still_needed_bytes - 6 * kStateBytes), 1024) << d.need.estimate;
  EXPECT_EQ(find_fix(d, FixId::kFusedOptimizer), nullptr);
  EXPECT_NE(d.need.estimate.find("fused, assumed: its step counters are on the device"), std::string::npos)
      << d.need.estimate;
}

// Under a default device (torch.device as a context around the step,
// torch.set_default_device) foreach's host counters, torch.tensor(0.0), are
// made on the device too: they tell nothing, foreach is assumed, with its
// temporaries (an H200's foreach AdamW recorded so,
// h200_recorded/first_adamw_step_0.2.pickle.gz, ctest
// h200_snapshots_diagnosed).
TEST(OptimizerKind, StepCountersUnderADefaultDeviceTellNothing) {
  const Diagnosis d = first_step_oom("adamw.py", "", false, "", Scalars::kDefaultDeviceCounters);
  EXPECT_EQ(d.need.implementation, OptimizerImplementation::kForeach);
  EXPECT_EQ(d.need.implementation_basis, ImplementationBasis::kDefaultDevice);
  EXPECT_TRUE(d.need.implementation_assumed());
  EXPECT_EQ(d.need.temporaries_total_bytes, kStateParameters * kStateBytes);
  // Six 16 MiB states to come, then the foreach temporaries of the four parameters.
  EXPECT_LE(std::abs(d.need.still_needed_bytes - (6 + kStateParameters) * kStateBytes), 1024) << d.need.estimate;
  EXPECT_NE(d.need.estimate.find("made under a default device"), std::string::npos) << d.need.estimate;
  const Recommendation* fused = find_fix(d, FixId::kFusedOptimizer);
  ASSERT_NE(fused, nullptr);
  EXPECT_NE(fused->reason.find("made under a default device, do not tell"), std::string::npos) << fused->reason;
}

// Without the counters' line the states say foreach: a 0-dim parameter's
// 4-byte states share the states' line; RMSprop, which has no fused
// kernel, keeps counters on the device only when capturable: PyTorch's
// default, foreach.
TEST(OptimizerKind, ScalarStatesOrNoFusedKernelStayForeach) {
  const Diagnosis scalar = first_step_oom("adamw.py", "", false, "", Scalars::kScalarParameter);
  EXPECT_EQ(scalar.need.implementation, OptimizerImplementation::kForeach);
  EXPECT_EQ(scalar.need.implementation_basis, ImplementationBasis::kHostStepCounters);
  EXPECT_EQ(scalar.need.temporaries_total_bytes, kStateParameters * kStateBytes);
  const Diagnosis rmsprop = first_step_oom("rmsprop.py", "", false, "", Scalars::kStepCounters);
  EXPECT_EQ(rmsprop.need.implementation, OptimizerImplementation::kForeach);
  EXPECT_EQ(rmsprop.need.implementation_basis, ImplementationBasis::kDefault);
  // The arithmetic's frame, where there is one, outranks the counters.
  const Diagnosis seen = first_step_oom("adamw.py", "_multi_tensor_adam", false, "", Scalars::kStepCounters);
  EXPECT_EQ(seen.need.implementation, OptimizerImplementation::kForeach);
  EXPECT_EQ(seen.need.implementation_basis, ImplementationBasis::kFrames);
}

// Note [States an option adds]: AdamW's _init_group made three kinds of
// state (amsgrad=True's max_exp_avg_sq): three per parameter, not the
// table's two; the sentences say one more an option adds.
TEST(OptimizerKind, StatesAnOptionAddsAreCounted) {
  const Diagnosis d = first_step_oom("adamw.py", "", false, "", Scalars::kThreeStateLines);
  EXPECT_EQ(d.need.states_per_parameter, 3);
  EXPECT_EQ(d.need.states_added_by_options, 1);
  EXPECT_EQ(d.need.state_total_bytes, 3 * kStateParameters * kStateBytes);
  // Three of twelve states made; foreach's temporaries (one list) to come.
  EXPECT_EQ(d.need.still_needed_bytes, (3 * kStateParameters - 3 + kStateParameters) * kStateBytes);
  EXPECT_NE(d.need.estimate.find("three states per parameter (exp_avg and exp_avg_sq, and one more its _init_group "
                                 "made (max_exp_avg_sq too with amsgrad=True))"),
            std::string::npos)
      << d.need.estimate;
  EXPECT_NE(d.verdicts.front().evidence.find("allocates three states of each parameter's size here: exp_avg and "
                                             "exp_avg_sq, and one more that an option adds"),
            std::string::npos)
      << d.verdicts.front().evidence;
  // Fewer lines than the table's states (one line, or an optimizer whose
  // first step makes none of the parameters' size) leave the table's count.
  EXPECT_EQ(first_step_oom("adamw.py").need.states_per_parameter, 2);
  EXPECT_EQ(first_step_oom("adagrad.py", "", false, "", Scalars::kThreeStateLines).need.states_per_parameter, 0);
}

}  // namespace
}  // namespace oomtune::diagnose
