// Activation checkpointing on TorchScript models (strategies/activation_checkpointing.h),
// on the CPU; the same on a GPU: cuda_checkpointing_test.cpp. The gradient
// tests' reference: checkpoint_test_support.h.

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>

#include "checkpoint_test_support.h"
#include "common/error.h"
#include "compat/torch_compat.h"
#include "strategies/activation_checkpointing.h"
#include "strategies/argument_writes.h"
#include "strategies/recompute_op.h"
#include "strategies/training_config.h"
#include "support/require_file.h"

namespace oomtune {
namespace {

using testing::example_model;
using testing::expect_same_gradients;
using testing::gpt_input;
using testing::gradients;
using testing::kGptSeq;
using testing::kGptVocab;
using testing::kSeed;
using testing::kTolerance;
using testing::OptimizeScope;
using testing::StepOptions;
using testing::test_model;
using testing::train_steps;
using testing::zero_grads;
using Grads = testing::Gradients;

int64_t count_checkpoint_nodes(const torch::jit::Module& module) {
  const auto symbol = c10::Symbol::fromQualString(kCheckpointOpName);
  int64_t count = 0;
  std::vector<const c10::ClassType*> seen;
  for (const auto& entry : module.named_modules()) {
    const c10::ClassType* type = entry.value.type().get();
    if (std::find(seen.begin(), seen.end(), type) != seen.end()) continue;
    seen.push_back(type);
    for (torch::jit::Function* method : type->methods()) {
      for (const torch::jit::Node* node : torch::jit::toGraphFunction(*method).graph()->nodes()) {
        count += node->kind() == symbol;
      }
    }
  }
  return count;
}

/// Names a test instance by its graph-executor optimization parameter.
std::string on_or_off(const ::testing::TestParamInfo<bool>& info) { return info.param ? "on" : "off"; }

/// Loads make_checkpoint_models.py's `name` twice, checkpoints every block of
/// one copy (expecting exactly `blocks`, one oomtune::checkpoint node each)
/// and expects its gradients to equal the plain copy's, with graph-executor
/// optimization `optimize`: after 1 step, or 3 with optimization on (the
/// profiling executor runs its optimized plan from the second).
template <typename MakeInput>
void expect_all_blocks_train_like_plain(const std::string& name, bool optimize, const std::vector<std::string>& blocks,
                                        MakeInput make_input) {
  OptimizeScope optimize_scope(optimize);
  const int steps = optimize ? 3 : 1;
  LOAD_OR_SKIP(plain, test_model(name));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  const CheckpointReport report = apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
  EXPECT_EQ(paths_of(report.checkpointed), blocks);
  EXPECT_EQ(count_checkpoint_nodes(ckpt), static_cast<int64_t>(blocks.size()));
  expect_same_gradients(train_steps(plain, make_input, steps), train_steps(ckpt, make_input, steps));
}

/// Expects make_checkpoint_models.py's `name` (blocks.0.lin, fed an [8, 16]
/// input) to train unchecked, then, checkpointed by `plan`, to be refused at
/// its first forward with an error containing every one of `expected`.
// Also checks that the operator kept the refused block's class for the
// trial to read (take_refused_block_class), once.
void expect_refused_at_first_call(const std::string& name, const std::string& plan, const std::string& block_class,
                                  const std::vector<std::string>& expected) {
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, test_model(name));
  const auto input = [] { return std::vector<c10::IValue>{at::randn({8, 16})}; };
  const Grads grads = train_steps(plain, input, 1);
  EXPECT_GT(grads.at("blocks.0.lin.weight").abs().sum().item<double>(), 0.0);
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  apply_checkpointing(ckpt, parse_checkpoint_plan(plan));
  ckpt.train(true);
  try {
    ckpt.forward(input());
    FAIL() << "no error";
  } catch (const std::exception& e) {  // the interpreter's JITException
    const std::string message = e.what();
    for (const std::string& part : expected) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
  EXPECT_EQ(take_refused_block_class(), std::optional<std::string>(block_class));
  EXPECT_EQ(take_refused_block_class(), std::nullopt);
}

int64_t batches_tracked(const torch::jit::Module& module, const std::string& bn_path) {
  for (const auto& buffer : module.named_buffers(/*recurse=*/true)) {
    if (buffer.name == bn_path + ".num_batches_tracked") return buffer.value.item<int64_t>();
  }
  ADD_FAILURE() << "no buffer " << bn_path << ".num_batches_tracked";
  return -1;
}

// --- Counting CPU allocator (DESIGN.md "Counting CPU allocator") ---------

std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};        // the most g_live_bytes reached since reset_peak()
constexpr size_t kHeaderBytes = 64;          // keeps alloc_cpu's 64-byte alignment; holds the size
constexpr uint8_t kAllocatorPriority = 255;  // c10::SetCPUAllocator compares with >=

/// Counts live CPU bytes while installed; restores the previous allocator.
class CountingAllocator final : public c10::Allocator {
 public:
  CountingAllocator() : previous_(c10::GetCPUAllocator()) { c10::SetCPUAllocator(this, kAllocatorPriority); }
  ~CountingAllocator() override { c10::SetCPUAllocator(previous_, kAllocatorPriority); }
  CountingAllocator(const CountingAllocator&) = delete;
  CountingAllocator& operator=(const CountingAllocator&) = delete;

  // libtorch 1.13 declares `allocate(size_t) const`, 2.3+ `allocate(size_t)`:
  // defining both overrides whichever the base has, without a version test.
  c10::DataPtr allocate(size_t bytes) { return static_cast<const CountingAllocator&>(*this).allocate(bytes); }
  c10::DataPtr allocate(size_t bytes) const {
    auto* base = static_cast<char*>(c10::alloc_cpu(bytes + kHeaderBytes));
    *reinterpret_cast<size_t*>(base) = bytes;
    const int64_t live = g_live_bytes += static_cast<int64_t>(bytes);
    for (int64_t peak = g_peak_bytes.load(); live > peak && !g_peak_bytes.compare_exchange_weak(peak, live);) {
    }
    void* data = base + kHeaderBytes;
    return {data, data, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  OOMTUNE_ALLOCATOR_COPY_DATA

  static int64_t live() { return g_live_bytes.load(); }
  static int64_t peak() { return g_peak_bytes.load(); }
  static void reset_peak() { g_peak_bytes = g_live_bytes.load(); }

 private:
  static void release(void* data) {
    if (data == nullptr) return;
    char* base = static_cast<char*>(data) - kHeaderBytes;
    g_live_bytes -= static_cast<int64_t>(*reinterpret_cast<size_t*>(base));
    c10::free_cpu(base);
  }
  c10::Allocator* previous_;
};

/// Bytes alive between the end of forward (loss computed) and backward.
int64_t retained_activation_bytes(torch::jit::Module& module, std::vector<c10::IValue> inputs) {
  module.train(true);
  CountingAllocator counter;
  at::manual_seed(kSeed);
  const int64_t before = CountingAllocator::live();
  at::Tensor loss = module.forward(inputs).toTensor().pow(2).mean();
  const int64_t retained = CountingAllocator::live() - before;
  loss.backward();
  return retained;
}

/// Prints both counts of retained activations (shown by ctest -V).
void print_retained(const char* model, int64_t plain_bytes, int64_t ckpt_bytes) {
  std::printf("retained activations (%s): plain %lld B, checkpoint-all %lld B (%.1f %%)\n", model,
              static_cast<long long>(plain_bytes), static_cast<long long>(ckpt_bytes),
              100.0 * static_cast<double>(ckpt_bytes) / static_cast<double>(plain_bytes));
}

// --- Block detection ------------------------------------------------------

TEST(BlockDetection, GptBlocksAreTheModuleListEntries) {
  LOAD_OR_SKIP(gpt, example_model("gpt.pt"));
  const auto blocks = detect_blocks(gpt);
  ASSERT_EQ(blocks.size(), 4u);
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(blocks[i].path, "blocks." + std::to_string(i));
    EXPECT_EQ(blocks[i].type_name, "__torch__.Block");
    int64_t expected = 0;  // independent count: parameters under the path prefix
    for (const auto& parameter : gpt.named_parameters(true)) {
      if (parameter.name.rfind(blocks[i].path + ".", 0) == 0) expected += parameter.value.numel();
    }
    EXPECT_EQ(blocks[i].parameters, expected);
    EXPECT_GT(blocks[i].parameters, 0);
  }
}

TEST(BlockDetection, ResNetBlocksAreTheLayerChildren) {
  LOAD_OR_SKIP(resnet18, example_model("resnet18.pt"));
  const auto blocks = detect_blocks(resnet18);
  std::vector<std::string> paths;
  for (const auto& block : blocks) {
    paths.push_back(block.path);
    EXPECT_EQ(block.type_name, "__torch__.torchvision.models.resnet.BasicBlock");
  }
  EXPECT_EQ(paths, (std::vector<std::string>{"layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1",
                                             "layer4.0", "layer4.1"}));
}

TEST(BlockDetection, ResNet50HasSixteenBottlenecks) {
  LOAD_OR_SKIP(resnet50, example_model("resnet50.pt"));
  const auto blocks = detect_blocks(resnet50);
  ASSERT_EQ(blocks.size(), 16u);  // 3 + 4 + 6 + 3 (torchvision resnet50)
  EXPECT_EQ(blocks.front().path, "layer1.0");
  EXPECT_EQ(blocks.back().path, "layer4.2");
  EXPECT_EQ(blocks.front().type_name, "__torch__.torchvision.models.resnet.Bottleneck");
}

TEST(BlockDetection, MixedSequentialAndLeafLayersAreNotBlocks) {
  LOAD_OR_SKIP(no_blocks, test_model("no_blocks.pt"));
  EXPECT_TRUE(detect_blocks(no_blocks).empty());
  LOAD_OR_SKIP(shared, test_model("shared.pt"));
  const auto blocks = detect_blocks(shared);  // the outermost repetition wins
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].path, "stages.0");
  EXPECT_EQ(blocks[1].path, "stages.1");
}

TEST(BlockDetection, RunsOfOneClassBetweenAStemAndAHeadAreBlocks) {
  // features = Sequential(Stem, Unit, Unit, Unit, Sequential(Unit, Unit),
  // Sequential(Unit, Unit), Sequential(Unit), Head): the run of Units is
  // blocks; the three stages are plain Sequentials of Units only, so their
  // Units are the blocks, the one-Unit stage's too (as EfficientNet's).
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, test_model("mixed.pt"));
  std::vector<std::string> paths;
  for (const auto& block : detect_blocks(plain)) paths.push_back(block.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"features.1", "features.2", "features.3", "features.4.0", "features.4.1",
                                             "features.5.0", "features.5.1", "features.6.0"}));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
  const auto input = [] { return std::vector<c10::IValue>{at::randn({8, 16})}; };
  expect_same_gradients(train_steps(plain, input, 1), train_steps(ckpt, input, 1));
}

TEST(BlockDetection, AModuleDictSubclassOfOneClassHoldsBlocks) {
  // DenseNet(stem, DenseBlock(layer1, layer2, layer3), head): the DenseBlock
  // is a class of its own (an nn.ModuleDict subclass) whose children are all
  // DenseLayers; the model itself has other children too.
  LOAD_OR_SKIP(dense, test_model("dense.pt"));
  std::vector<std::string> paths;
  for (const auto& block : detect_blocks(dense)) {
    paths.push_back(block.path);
    EXPECT_EQ(block.type_name, "__torch__.DenseLayer");
  }
  EXPECT_EQ(paths, (std::vector<std::string>{"block.layer1", "block.layer2", "block.layer3"}));
}

TEST(SelectCheckpointPaths, PlansChooseBlocksInForwardOrder) {
  LOAD_OR_SKIP(gpt, example_model("gpt.pt"));
  using V = std::vector<std::string>;
  EXPECT_EQ(select_checkpoint_paths(gpt, parse_checkpoint_plan("none")), V{});
  EXPECT_EQ(select_checkpoint_paths(gpt, parse_checkpoint_plan("all")),
            (V{"blocks.0", "blocks.1", "blocks.2", "blocks.3"}));
  EXPECT_EQ(select_checkpoint_paths(gpt, parse_checkpoint_plan("every:2")), (V{"blocks.0", "blocks.2"}));
  EXPECT_EQ(select_checkpoint_paths(gpt, parse_checkpoint_plan("every:3")), (V{"blocks.0", "blocks.3"}));
  EXPECT_EQ(select_checkpoint_paths(gpt, parse_checkpoint_plan("first:1")), V{"blocks.0"});
  EXPECT_EQ(select_checkpoint_paths(gpt, parse_checkpoint_plan("first:4")),
            (V{"blocks.0", "blocks.1", "blocks.2", "blocks.3"}));
  EXPECT_EQ(select_checkpoint_paths(gpt, parse_checkpoint_plan("paths:blocks.3+blocks.1")),
            (V{"blocks.1", "blocks.3"}));
}

// --- Gradients equal the plain run's ---------------------------------------

struct GptCase {
  const char* plan;
  bool optimize;
  std::vector<std::string> checkpointed;
};

void PrintTo(const GptCase& c, std::ostream* os) {
  *os << "ckpt=" << c.plan << ", optimize " << (c.optimize ? "on" : "off");
}

class GptGradients : public ::testing::TestWithParam<GptCase> {};

TEST_P(GptGradients, EqualThePlainRun) {
  const GptCase& c = GetParam();
  OptimizeScope optimize(c.optimize);
  LOAD_OR_SKIP(plain, example_model("gpt.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  const CheckpointReport report = apply_checkpointing(ckpt, parse_checkpoint_plan(c.plan), plain_path);
  EXPECT_EQ(paths_of(report.checkpointed), c.checkpointed);
  EXPECT_EQ(report.rewritten_calls, static_cast<int64_t>(c.checkpointed.size()));  // one call site per block
  EXPECT_EQ(count_checkpoint_nodes(ckpt), static_cast<int64_t>(c.checkpointed.size()));
  EXPECT_EQ(report.blocks.size(), 4u);

  const int steps = c.optimize ? 3 : 1;
  const Grads expected = train_steps(
      plain, [] { return gpt_input(2); }, steps);
  const Grads actual = train_steps(
      ckpt, [] { return gpt_input(2); }, steps);
  expect_same_gradients(expected, actual);
}

INSTANTIATE_TEST_SUITE_P(Plans, GptGradients,
                         ::testing::Values(GptCase{"all", false, {"blocks.0", "blocks.1", "blocks.2", "blocks.3"}},
                                           GptCase{"every:2", false, {"blocks.0", "blocks.2"}},
                                           GptCase{"first:1", false, {"blocks.0"}},
                                           GptCase{"paths:blocks.1+blocks.3", false, {"blocks.1", "blocks.3"}},
                                           GptCase{"all", true, {"blocks.0", "blocks.1", "blocks.2", "blocks.3"}},
                                           GptCase{"every:2", true, {"blocks.0", "blocks.2"}}),
                         [](const ::testing::TestParamInfo<GptCase>& info) {
                           std::string name = info.param.plan;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name + (info.param.optimize ? "_optimize_on" : "_optimize_off");
                         });

TEST(GptGradients, DropoutIsReallyOnSoSeedsMatter) {
  // Guards the comparisons above: with dropout active, other dropout masks
  // give other gradients, so equal gradients mean the masks were repeated.
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(gpt, example_model("gpt.pt"));
  gpt.train(true);
  const auto run = [&](uint64_t dropout_seed) {
    zero_grads(gpt);
    at::manual_seed(kSeed);
    std::vector<c10::IValue> inputs = gpt_input(2);
    at::Tensor probe = at::randn({2, kGptSeq, kGptVocab});
    at::manual_seed(dropout_seed);
    (gpt.forward(inputs).toTensor() * probe).sum().backward();
    return gradients(gpt);
  };
  const Grads first = run(1);
  const Grads same = run(1);
  const Grads other = run(2);
  const std::string name = "blocks.0.attn.qkv.weight";
  EXPECT_TRUE(at::allclose(first.at(name), same.at(name), kTolerance, kTolerance));
  EXPECT_FALSE(at::allclose(first.at(name), other.at(name), kTolerance, kTolerance));
}

class ResNetGradients : public ::testing::TestWithParam<bool> {};

TEST_P(ResNetGradients, AllBlocksEqualThePlainRun) {
  OptimizeScope optimize(GetParam());
  LOAD_OR_SKIP(plain, example_model("resnet18.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  const CheckpointReport report = apply_checkpointing(ckpt, parse_checkpoint_plan("all"), plain_path);
  EXPECT_EQ(report.checkpointed.size(), 8u);
  EXPECT_EQ(report.rewritten_calls, 8);  // inside the four layerN Sequential graphs

  const int steps = GetParam() ? 2 : 1;
  const auto input = [] { return std::vector<c10::IValue>{at::randn({2, 3, 224, 224})}; };
  const Grads expected = train_steps(plain, input, steps);
  const Grads actual = train_steps(ckpt, input, steps);
  expect_same_gradients(expected, actual);
  // BatchNorm running statistics are updated again by the recomputation
  // (as with torch.utils.checkpoint): each checkpointed block counts each
  // batch twice, the stem's bn1 (not in a block) once.
  EXPECT_EQ(batches_tracked(plain, "layer1.0.bn1"), steps);
  EXPECT_EQ(batches_tracked(ckpt, "layer1.0.bn1"), 2 * steps);
  EXPECT_EQ(batches_tracked(ckpt, "layer4.1.bn2"), 2 * steps);
  EXPECT_EQ(batches_tracked(ckpt, "bn1"), steps);
}

INSTANTIATE_TEST_SUITE_P(Optimize, ResNetGradients, ::testing::Values(false, true), on_or_off);

TEST(ResNetGradients, FirstBlockOnlyInsideTheSequentialGraph) {
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, example_model("resnet18.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  const CheckpointReport report = apply_checkpointing(ckpt, parse_checkpoint_plan("first:1"));
  EXPECT_EQ(paths_of(report.checkpointed), std::vector<std::string>{"layer1.0"});
  EXPECT_EQ(report.checkpointed.at(0).class_name, "__torch__.torchvision.models.resnet.BasicBlock");  // unmangled
  const auto input = [] { return std::vector<c10::IValue>{at::randn({2, 3, 224, 224})}; };
  expect_same_gradients(train_steps(plain, input, 1), train_steps(ckpt, input, 1));
  EXPECT_EQ(batches_tracked(ckpt, "layer1.0.bn1"), 2);  // recomputed
  EXPECT_EQ(batches_tracked(ckpt, "layer1.1.bn1"), 1);  // same class, same graph, not recomputed
}

TEST(CheckpointOp, TwoTensorInputsAndATupleOfTwoOutputs) {
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, test_model("pair.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  const CheckpointReport report = apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
  EXPECT_EQ(paths_of(report.checkpointed), (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2"}));
  const auto input = [] { return std::vector<c10::IValue>{at::randn({8, 16})}; };
  const Grads expected = train_steps(plain, input, 1);
  const Grads actual = train_steps(ckpt, input, 1);
  expect_same_gradients(expected, actual);
  // blocks.0 is fed the raw input (no input requires grad): its parameters
  // still get gradients (Note [Checkpoint anchor]).
  EXPECT_GT(actual.at("blocks.0.lin_a.weight").abs().sum().item<double>(), 0.0);
}

// Both outputs of one autograd node (chunk's halves): the recomputed roots
// share a node, which hands both gradients over when it runs (Note
// [Incoming gradients are the graph's]); gradients equal the plain run's.
TEST(CheckpointOp, TwoOutputsOfOneNode) {
  expect_all_blocks_train_like_plain("halves.pt", false, {"blocks.0", "blocks.1", "blocks.2"}, [] {
    return std::vector<c10::IValue>{at::randn({8, 16})};
  });
}

// An output that is the block's own input, returned unchanged: recomputed,
// it is the detached input itself, a leaf, whose root node is its
// AccumulateGrad; gradients equal the plain run's.
TEST(CheckpointOp, AnInputReturnedUnchanged) {
  expect_all_blocks_train_like_plain("passthrough.pt", false, {"blocks.0", "blocks.1", "blocks.2"}, [] {
    return std::vector<c10::IValue>{at::randn({8, 16})};
  });
}

class NonTensorArguments : public ::testing::TestWithParam<bool> {};

// Arguments that are not Tensors pass through to the forward and to its
// recomputation: an int (int_arg.pt); an Optional[Tensor] given None to one
// block and a Tensor to the other, a float and a bool (masked.pt).
TEST_P(NonTensorArguments, PassThroughAndGradientsEqualThePlainRun) {
  for (const std::string name : {"int_arg.pt", "masked.pt"}) {
    SCOPED_TRACE(name);
    expect_all_blocks_train_like_plain(name, GetParam(), {"blocks.0", "blocks.1"}, [] {
      return std::vector<c10::IValue>{at::randn({8, 16}).requires_grad_(true)};
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Optimize, NonTensorArguments, ::testing::Values(false, true), on_or_off);

class ListArguments : public ::testing::TestWithParam<bool> {};

// dense.pt's DenseLayers are called through an overloaded forward
// (forward__0) with the list of all features before them (List[Tensor]),
// which the caller appends to after each call. The recomputation must see the
// list as it was at the call: layer1 recomputed with the final list would
// concatenate 20 features into its 8-feature BatchNorm and fail. Dropout and
// BatchNorm are on; gradients equal the plain run's.
TEST_P(ListArguments, DenseLayersCheckpointAndGradientsEqualThePlainRun) {
  expect_all_blocks_train_like_plain("dense.pt", GetParam(), {"block.layer1", "block.layer2", "block.layer3"}, [] {
    return std::vector<c10::IValue>{at::randn({8, 16})};
  });
}

// A block that appends a Tensor it made to its List[Tensor] argument (and
// the caller reads it from there) is refused at the first checkpointed call:
// that Tensor was made under no-grad, so the block would get no gradients.
// The append sits under `if len(xs) > 0`, so the graph check
// (ArgumentWrites.*) leaves it to the operator. Unchecked, the same model
// trains normally.
TEST(CheckpointErrors, ABlockThatAddsToItsListArgumentIsRefused) {
  expect_refused_at_first_call("appending_branch.pt", "all", "__torch__.BranchAppendingBlock",
                               {"forward of __torch__.BranchAppendingBlock changed",
                                "changed its List[Tensor] argument (1 tensors before the call, 2 after)"});
}

// A Tuple[Tensor, Tensor] argument: its Tensors go to autograd one by one and
// the recomputation gets a new tuple of them.
TEST_P(ListArguments, TuplesOfTensorsCheckpointToo) {
  expect_all_blocks_train_like_plain("tuple_arg.pt", GetParam(), {"blocks.0", "blocks.1"}, [] {
    return std::vector<c10::IValue>{at::randn({8, 16}).requires_grad_(true)};
  });
}

// A block that scales its input in place (x.mul_(0.5)) before using it: the
// forward changes the Tensor its recomputation would start from. The first
// block's input is data (no grad), so nothing in autograd notices, and
// without the check its checkpointed gradients differ from the plain run's
// (max abs diff 0.88). Refused at the first checkpointed call, naming the
// argument; unchecked, the same model trains. The write sits under
// `if x.dim() == 2`, which the graph check cannot decide.
TEST(CheckpointErrors, ABlockThatModifiesItsInputInPlaceIsRefused) {
  expect_refused_at_first_call("in_place_branch.pt", "first:1", "__torch__.BranchScalingBlock",
                               {"forward of __torch__.BranchScalingBlock modified its argument x in place"});
}

INSTANTIATE_TEST_SUITE_P(Optimize, ListArguments, ::testing::Values(false, true), on_or_off);

class TracedDecoder : public ::testing::TestWithParam<bool> {};

// A Llama-style decoder traced as users export Hugging Face models: the
// trace flattens each layer's rotary (cos, sin) tuple into two Tensor
// arguments and bakes the training-mode dropout in as aten::dropout(train=
// True). The layers are the blocks; with dropout on, gradients equal the
// plain run's.
TEST_P(TracedDecoder, LlamaLayersCheckpointAndGradientsEqualThePlainRun) {
  expect_all_blocks_train_like_plain("llama_trace.pt", GetParam(),
                                     {"model.layers.0", "model.layers.1", "model.layers.2"}, [] {
                                       return std::vector<c10::IValue>{at::randint(0, 100, {8, 16})};
                                     });
}

INSTANTIATE_TEST_SUITE_P(Optimize, TracedDecoder, ::testing::Values(false, true), on_or_off);

// nn.TransformerEncoder calls each nn.TransformerEncoderLayer with
// Optional[Tensor] masks (None here): the layers checkpoint, gradients equal
// the plain run's (dropout on), and less stays alive between forward and
// backward.
TEST(CheckpointOp, TransformerEncoderLayersWithOptionalMasks) {
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, test_model("encoder.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  const CheckpointReport report = apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
  EXPECT_EQ(paths_of(report.checkpointed), (std::vector<std::string>{"layers.0", "layers.1"}));
  const auto input = [] { return std::vector<c10::IValue>{at::randn({8, 6, 16})}; };
  expect_same_gradients(train_steps(plain, input, 1), train_steps(ckpt, input, 1));

  at::manual_seed(kSeed);
  const std::vector<c10::IValue> inputs{at::randn({64, 6, 16})};
  const int64_t plain_bytes = retained_activation_bytes(plain, inputs);
  const int64_t ckpt_bytes = retained_activation_bytes(ckpt, inputs);
  print_retained("encoder", plain_bytes, ckpt_bytes);
  EXPECT_LE(static_cast<double>(ckpt_bytes), 0.5 * static_cast<double>(plain_bytes))
      << "plain " << plain_bytes << " B, checkpointed " << ckpt_bytes << " B";
}

// The recomputation runs under the forward's autocast (bf16 here), not the
// backward's (off), and leaves no cast weights behind for the next step.
TEST(CheckpointOp, RecomputationRunsUnderTheForwardsAutocast) {
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, example_model("gpt.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
  const StepOptions bf16_sgd{/*bf16_autocast=*/true, /*sgd_lr=*/0.1};
  const Grads expected = train_steps(
      plain, [] { return gpt_input(2); }, 2, bf16_sgd);
  const Grads actual = train_steps(
      ckpt, [] { return gpt_input(2); }, 2, bf16_sgd);
  expect_same_gradients(expected, actual);
  EXPECT_FALSE(compat::cpu_autocast_enabled());
}

TEST(CheckpointOp, SharedGraphChoosesPerBlockObject) {
  // stages.0 and stages.1 are Sequentials of one TorchScript type, so one
  // compiled forward calls both stages.0.0 and stages.1.0.
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, test_model("shared.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  const CheckpointReport report = apply_checkpointing(ckpt, parse_checkpoint_plan("paths:stages.1.0"));
  EXPECT_EQ(paths_of(report.checkpointed), std::vector<std::string>{"stages.1.0"});
  EXPECT_EQ(report.rewritten_calls, 1);
  const auto input = [] { return std::vector<c10::IValue>{at::randn({8, 16})}; };
  expect_same_gradients(train_steps(plain, input, 1), train_steps(ckpt, input, 1));
  EXPECT_EQ(batches_tracked(ckpt, "stages.1.0.norm"), 2);
  EXPECT_EQ(batches_tracked(ckpt, "stages.0.0.norm"), 1);
  EXPECT_EQ(batches_tracked(ckpt, "stages.0.1.norm"), 1);
  EXPECT_EQ(batches_tracked(ckpt, "stages.1.1.norm"), 1);
}

TEST(CheckpointOp, ReapplyingChangesTheChoiceWithoutNewRewrites) {
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(shared, test_model("shared.pt"));
  const CheckpointReport first = apply_checkpointing(shared, parse_checkpoint_plan("all"));
  EXPECT_EQ(paths_of(first.checkpointed), (std::vector<std::string>{"stages.0", "stages.1"}));
  const CheckpointReport none = apply_checkpointing(shared, parse_checkpoint_plan("none"));
  EXPECT_TRUE(none.checkpointed.empty());
  EXPECT_EQ(none.rewritten_calls, 0);
  const auto input = [] { return std::vector<c10::IValue>{at::randn({8, 16})}; };
  train_steps(shared, input, 1);
  EXPECT_EQ(batches_tracked(shared, "stages.0.0.norm"), 1);  // flag off: a plain call
  const CheckpointReport again = apply_checkpointing(shared, parse_checkpoint_plan("first:1"));
  EXPECT_EQ(paths_of(again.checkpointed), std::vector<std::string>{"stages.0"});
  EXPECT_EQ(again.rewritten_calls, 0);
}

TEST(CheckpointOp, NoGradInferenceIsAPlainCall) {
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, example_model("gpt.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
  plain.eval();
  ckpt.eval();
  at::NoGradGuard no_grad;
  at::manual_seed(kSeed);
  std::vector<c10::IValue> inputs = gpt_input(2);
  EXPECT_TRUE(at::allclose(plain.forward(inputs).toTensor(), ckpt.forward(inputs).toTensor(), kTolerance, kTolerance));
}

// --- Memory ---------------------------------------------------------------

TEST(CheckpointMemory, RetainedActivationsDropOnGpt) {
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, example_model("gpt.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
  constexpr int64_t kBatch = 8;
  at::manual_seed(kSeed);
  const std::vector<c10::IValue> inputs = gpt_input(kBatch);
  const int64_t plain_bytes = retained_activation_bytes(plain, inputs);
  const int64_t ckpt_bytes = retained_activation_bytes(ckpt, inputs);
  RecordProperty("plain_retained_bytes", std::to_string(plain_bytes));
  RecordProperty("checkpoint_retained_bytes", std::to_string(ckpt_bytes));
  print_retained("gpt", plain_bytes, ckpt_bytes);
  EXPECT_GT(plain_bytes, 10 * 1000 * 1000);  // about 27 MB: [8, 64] tokens, d_model 128, 4 blocks
  EXPECT_LE(static_cast<double>(ckpt_bytes), 0.35 * static_cast<double>(plain_bytes))
      << "plain " << plain_bytes << " B, checkpointed " << ckpt_bytes << " B";
}

// DenseNet's layers keep the inputs they are given (the features before
// them, already alive) instead of their concatenation, its normalization and
// activation: the memory-efficient DenseNet (Pleiss et al. 2017,
// arXiv:1707.06990), which torchvision's memory_efficient=True does in eager
// PyTorch but not in TorchScript.
TEST(CheckpointMemory, DenseLayersKeepOnlyTheFeaturesBeforeThem) {
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(plain, test_model("dense.pt"));
  torch::jit::Module ckpt = torch::jit::load(plain_path);
  apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
  constexpr int64_t kBatch = 256;
  constexpr int64_t kRow = kBatch * 4;  // bytes of one fp32 feature over the batch
  at::manual_seed(kSeed);
  const std::vector<c10::IValue> inputs{at::randn({kBatch, 16})};
  const int64_t plain_bytes = retained_activation_bytes(plain, inputs);
  const int64_t ckpt_bytes = retained_activation_bytes(ckpt, inputs);
  print_retained("dense", plain_bytes, ckpt_bytes);
  // Either way: the head's input (the block's 20 features), the output (kept
  // by pow) and the loss.
  const int64_t outside = kRow * (20 + 16) + 4;
  // Checkpointed: the features the layers were given, each once (the stem's
  // 8, layer1's 4, layer2's 4), and one CPU generator state per layer (Note
  // [Recompute RNG]), nothing of the layers' insides.
  const int64_t rng_state = at::globalContext().defaultGenerator(c10::Device(c10::kCPU)).get_state().nbytes();
  EXPECT_EQ(ckpt_bytes, outside + kRow * (8 + 4 + 4) + 3 * rng_state);
  // Plain: at least each layer's concatenation (kept by BatchNorm) and ReLU
  // output (kept by Linear), 8, 12 and 16 features wide, and a dropout mask
  // of one byte or more per element of its 4 features.
  EXPECT_GE(plain_bytes, outside + 2 * kRow * (8 + 12 + 16) + 3 * kBatch * 4);
}

/// In `peak`: the CPU bytes that backward of loss_of(output) holds at its
/// peak above what it starts with (CountingAllocator), for
/// make_checkpoint_models.py's `name` checkpointed at every block and fed
/// randn [batch, 16]; left empty where the model did not load (the failure
/// recorded).
void checkpointed_backward_peak(const std::string& name, int64_t batch,
                                const std::function<at::Tensor(const at::Tensor&)>& loss_of,
                                std::optional<int64_t>& peak) {
  OptimizeScope optimize(false);
  LOAD_OR_SKIP(ckpt, test_model(name));
  apply_checkpointing(ckpt, parse_checkpoint_plan("all"));
  ckpt.train(true);
  CountingAllocator counter;
  const std::vector<c10::IValue> inputs{at::randn({batch, 16})};
  at::Tensor loss = loss_of(ckpt.forward(inputs).toTensor());
  const int64_t start = CountingAllocator::live();
  CountingAllocator::reset_peak();
  loss.backward();
  peak = CountingAllocator::peak() - start;
}

// The recomputed outputs are the graph's (Note [Recomputed outputs are the
// graph's], strategies/recompute_op.cpp): two blocks of Linear(16, 16) and
// exp, whose backward saves its result (the block's output), under
// out.sum(), whose gradient is a view of the loss's (4 bytes). With N the
// bytes of one activation [B, 16], above what backward starts with (the
// second block's input, N, saved): the second block's backward recomputes
// its output (N; the Linear's output, N, goes once exp has run), makes
// ExpBackward0's gradient (N) and, once that node has run and freed the
// output, the input's gradient (N) and the block's weight and bias
// gradients: 2N and those. Held to the block's end, as before, the output
// made it 3N. The first block then gets that gradient (N), its input is
// freed (-N), and its recomputation holds its Linear's output and its own
// (2N) and the CPU generator's state that it puts back afterwards (Note
// [Recompute RNG]): 2N, the state and the second block's parameter
// gradients, the step's peak, as PyTorch's checkpoint(use_reentrant=False)
// frees each recomputed tensor once the node that saved it has run.
TEST(CheckpointMemory, ARecomputedOutputGoesOnceTheNodeThatSavedItHasRun) {
  constexpr int64_t kBatch = 4096;
  constexpr int64_t kActivation = kBatch * 16 * 4;             // N
  constexpr int64_t kParameterGradients = (16 * 16 + 16) * 4;  // one block's weight and bias
  std::optional<int64_t> peak;
  checkpointed_backward_peak(
      "saved_output.pt", kBatch, [](const at::Tensor& out) { return out.sum(); }, peak);
  if (!peak) return;
  const int64_t rng_state = at::globalContext().defaultGenerator(c10::Device(c10::kCPU)).get_state().nbytes();
  EXPECT_EQ(*peak, 2 * kActivation + rng_state + kParameterGradients + 4);
}

// The gradient that comes into a block goes once the block's first backward
// node has run (Note [Incoming gradients are the graph's],
// strategies/recompute_op.cpp): two blocks of Linear(16, 64), exp and
// Linear(64, 16) under exp(out).sum(). With N the bytes of one activation
// [B, 16] and W = 4 N those of one [B, 64], above what backward starts with
// (the loss's gradient, 4 bytes, is held throughout): the head's ExpBackward0
// makes the second block's incoming gradient G (N) and frees the head's
// result (N); the recomputation holds up's output and exp's (2W) until exp
// has run (its output alone is saved), and the block's output (N) not at
// all; down's AddmmBackward0 makes exp's gradient (W) and down's weight and
// bias gradients, and G is no longer needed; ExpBackward0 then makes up's
// gradient (W) beside exp's output and gradient: 3W - N (the head's result
// gone), the step's peak, with down's parameter gradients (the first
// block's backward stays under it, the second block's input freed too).
// With G held to the block's end it was 3W, and still is with libtorch
// 1.13 (compat::kCustomFunctionGetsItsGradients). PyTorch 2.11's
// checkpoint(use_reentrant=False) on the CPU frees G at the same point: after
// down's AddmmBackward0, before ExpBackward0 (torch.profiler's allocations).
TEST(CheckpointMemory, TheIncomingGradientGoesOnceTheBlocksFirstNodeHasRun) {
  constexpr int64_t kBatch = 4096;
  constexpr int64_t kActivation = kBatch * 16 * 4;        // N
  constexpr int64_t kWide = kBatch * 64 * 4;              // W
  constexpr int64_t kDownGradients = (64 * 16 + 16) * 4;  // down's weight and bias
  std::optional<int64_t> peak;
  checkpointed_backward_peak(
      "widening.pt", kBatch, [](const at::Tensor& out) { return at::exp(out).sum(); }, peak);
  if (!peak) return;
  const int64_t held = compat::kCustomFunctionGetsItsGradients ? 0 : kActivation;  // G
  EXPECT_EQ(*peak, 3 * kWide - kActivation + held + kDownGradients + 4) << "N = " << kActivation;
}

// --- Bad plans ------------------------------------------------------------

template <typename F>
std::string config_error_message(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return "";
}

TEST(CheckpointErrors, NoBlocksAndNoPathsNamesTheModelAndItsChildren) {
  LOAD_OR_SKIP(model, test_model("no_blocks.pt"));
  const std::string message =
      config_error_message([&] { apply_checkpointing(model, parse_checkpoint_plan("all"), "no_blocks.pt"); });
  EXPECT_NE(message.find("no_blocks.pt"), std::string::npos) << message;
  EXPECT_NE(message.find("no repeated blocks"), std::string::npos) << message;
  EXPECT_NE(message.find("fc1 (Linear), fc2 (Linear), fc3 (Linear)"), std::string::npos) << message;
  EXPECT_EQ(count_checkpoint_nodes(model), 0);
  // Named paths still work on such a model.
  const CheckpointReport report = apply_checkpointing(model, parse_checkpoint_plan("paths:fc2"));
  EXPECT_EQ(paths_of(report.checkpointed), std::vector<std::string>{"fc2"});
}

TEST(CheckpointErrors, UnknownPathListsTheDetectedBlocks) {
  LOAD_OR_SKIP(gpt, example_model("gpt.pt"));
  const std::string message =
      config_error_message([&] { apply_checkpointing(gpt, parse_checkpoint_plan("paths:blocks.9"), "gpt.pt"); });
  EXPECT_NE(message.find("gpt.pt"), std::string::npos) << message;
  EXPECT_NE(message.find("'blocks.9'"), std::string::npos) << message;
  EXPECT_NE(message.find("blocks.0, blocks.1, blocks.2, blocks.3"), std::string::npos) << message;
  EXPECT_EQ(count_checkpoint_nodes(gpt), 0);
}

TEST(CheckpointErrors, FirstNPastTheBlockCount) {
  LOAD_OR_SKIP(gpt, example_model("gpt.pt"));
  const std::string message = config_error_message([&] { apply_checkpointing(gpt, parse_checkpoint_plan("first:5")); });
  EXPECT_NE(message.find("1 <= n <= 4"), std::string::npos) << message;
  EXPECT_NE(message.find("got 5"), std::string::npos) << message;
}

TEST(CheckpointErrors, TensorsInsideADictArgumentAreRefused) {
  LOAD_OR_SKIP(model, test_model("dict_arg.pt"));
  const std::string message = config_error_message([&] { apply_checkpointing(model, parse_checkpoint_plan("all")); });
  EXPECT_NE(message.find("cannot checkpoint 'blocks.0' (__torch__.DictArgBlock)"), std::string::npos) << message;
  EXPECT_NE(message.find("takes (Dict[str, Tensor]) and returns Tensor"), std::string::npos) << message;
  EXPECT_EQ(message.find("compilation unit"), std::string::npos) << message;
  EXPECT_EQ(count_checkpoint_nodes(model), 0);
}

// --- Argument writes found in the graph -------------------------------------

/// "make_checkpoint_models.py:LINE:" of the first line holding `code` after
/// the line that starts `class <klass>(` in the script that wrote the test
/// models: the source an ArgumentWrite must name.
std::string script_line(const std::string& klass, const std::string& code) {
  std::ifstream script(std::string(OOMTUNE_SOURCE_DIR) + "/tests/strategies/make_checkpoint_models.py");
  std::string line;
  bool in_class = false;
  for (int number = 1; std::getline(script, line); ++number) {
    in_class = in_class || line.rfind("class " + klass + "(", 0) == 0;
    if (in_class && line.find(code) != std::string::npos)
      return "make_checkpoint_models.py:" + std::to_string(number) + ":";
  }
  ADD_FAILURE() << "no '" << code << "' in class " << klass;
  return "?";
}

std::optional<ArgumentWrite> block_write(const torch::jit::Module& model, const std::string& path) {
  for (const auto& entry : model.named_modules())
    if (entry.name == path) return certain_argument_write(entry.value.get_method("forward").function());
  ADD_FAILURE() << "no submodule " << path;
  return std::nullopt;
}

/// A module with the TorchScript `source` as its methods.
torch::jit::Module defined(const std::string& source) {
  torch::jit::Module module("Block");
  module.define(source);
  return module;
}

// The write, its argument and the script's line, in the test models:
// in_place.pt's x.mul_(0.5); appending.pt's xs.append(y), which changes the
// list itself; pre_activation.pt's nn.ReLU(inplace=True), whose forward calls
// F.relu(input, True), whose `if inplace:` takes the aten::relu_ branch,
// named at the block's own line rather than torch's.
TEST(ArgumentWrites, FoundInTheTestModelsWithTheirLine) {
  struct Case {
    std::string model, block, klass, code, argument;
    bool list;
    std::string op;
  };
  const std::vector<Case> cases = {
      {"in_place.pt", "blocks.0", "ScalingBlock", "x.mul_(0.5)", "x", false, "aten::mul_"},
      {"appending.pt", "blocks.1", "AppendingBlock", "xs.append(y)", "xs", true, "aten::append"},
      {"pre_activation.pt", "blocks.0", "PreActivationBlock", "y = self.relu(x)", "x", false, "aten::relu_"},
  };
  for (const Case& c : cases) {
    LOAD_OR_SKIP(model, test_model(c.model));
    const std::optional<ArgumentWrite> write = block_write(model, c.block);
    ASSERT_TRUE(write) << c.model;
    EXPECT_EQ(write->argument, c.argument) << c.model;
    EXPECT_EQ(write->list, c.list) << c.model;
    EXPECT_EQ(write->op, c.op) << c.model;
    EXPECT_NE(write->source.find(script_line(c.klass, c.code)), std::string::npos) << write->source;
    const std::string expected = c.list ? "changes its List[Tensor] argument " + c.argument + " (" + c.op + " at "
                                        : "modifies its argument " + c.argument + " in place (" + c.op + " at ";
    EXPECT_EQ(describe(*write).rfind(expected, 0), 0) << describe(*write);
  }
}

TEST(ArgumentWrites, ViewsAndElementsOfTheArgumentAreTheArgument) {
  struct Case {
    const char* source;
    const char* argument;
    bool list;
    const char* op;  // "": not checked
  };
  const std::vector<Case> cases = {
      {"def forward(self, x: Tensor) -> Tensor:\n  x.t().mul_(0.5)\n  return x\n", "x", false, "aten::mul_"},
      // The compiler lowers it (aten::copy_ into a select of a slice in 1.13).
      {"def forward(self, x: Tensor) -> Tensor:\n  x[:, 0] = 0.0\n  return x\n", "x", false, ""},
      {"def forward(self, x: Tensor, y: Tensor) -> Tensor:\n  y.add_(x)\n  return y\n", "y", false, "aten::add_"},
      {"def forward(self, xs: List[Tensor]) -> Tensor:\n  xs[0].add_(1.0)\n  return xs[0]\n", "xs", false,
       "aten::add_"},
      {"def forward(self, xs: List[Tensor]) -> Tensor:\n  y = xs.pop()\n  return y\n", "xs", true, "aten::pop"},
      {"def forward(self, p: Tuple[Tensor, Tensor]) -> Tensor:\n  a, b = p\n  b.zero_()\n  return a\n", "p", false,
       "aten::zero_"},
      {"def forward(self, x: Tensor, inplace: bool) -> Tensor:\n  return self.act(x, True)\n"
       "def act(self, x: Tensor, inplace: bool) -> Tensor:\n  if inplace:\n    x.relu_()\n  return x\n",
       "x", false, "aten::relu_"},
      // A loop that certainly runs: its first iteration writes the argument,
      // also when the loop carries a new value afterwards.
      {"def forward(self, x: Tensor) -> Tensor:\n  for i in range(2):\n    x.add_(1.0)\n  return x\n", "x", false,
       "aten::add_"},
      {"def forward(self, x: Tensor) -> Tensor:\n  for i in range(2):\n    x.add_(1.0)\n    x = x * 2.0\n  return x\n",
       "x", false, "aten::add_"},
      {"def forward(self, x: Tensor) -> Tensor:\n  while True:\n    x.sub_(1.0)\n    if x.sum() < 0.0:\n      break\n"
       "  return x\n",
       "x", false, "aten::sub_"},
  };
  for (const Case& c : cases) {
    const torch::jit::Module module = defined(c.source);
    const std::optional<ArgumentWrite> write = certain_argument_write(module.get_method("forward").function());
    ASSERT_TRUE(write) << c.source;
    EXPECT_EQ(write->argument, c.argument) << c.source;
    EXPECT_EQ(write->list, c.list) << c.source;
    if (*c.op != '\0') {
      EXPECT_EQ(write->op, c.op) << c.source;
    }
  }
}

// Writes that may not run, or may not reach the argument, are left to the
// recompute operator: a false refusal here would take checkpointing away
// from a block that trains correctly with it.
TEST(ArgumentWrites, WritesThatMayNotHappenAreLeftToTheOperator) {
  const std::vector<std::string> sources = {
      "def forward(self, x: Tensor) -> Tensor:\n  if x.dim() == 2:\n    x.mul_(0.5)\n  return x\n",
      "def forward(self, x: Tensor) -> Tensor:\n  for i in range(x.size(0)):\n    x.add_(1.0)\n  return x\n",
      "def forward(self, x: Tensor) -> Tensor:\n  for i in range(0):\n    x.add_(1.0)\n  return x\n",
      // After the first iteration the loop carries a new Tensor.
      "def forward(self, x: Tensor) -> Tensor:\n  for i in range(2):\n    x = x * 2.0\n    x.add_(1.0)\n  return x\n",
      // A break may come before the write.
      "def forward(self, x: Tensor) -> Tensor:\n  for i in range(2):\n    if x.sum() < 0.0:\n      break\n"
      "    x.add_(1.0)\n  return x\n",
      "def forward(self, x: Tensor) -> Tensor:\n  for i in range(2):\n    if x.sum() < 0.0:\n      continue\n"
      "    x.add_(1.0)\n  return x\n",
      // The loop's result may be a new Tensor.
      "def forward(self, x: Tensor) -> Tensor:\n  for i in range(2):\n    x = x + 1.0\n  x.mul_(2.0)\n  return x\n",
      "def forward(self, x: Tensor) -> Tensor:\n  y = x.reshape([-1])\n  y.mul_(0.5)\n  return x\n",
      "def forward(self, x: Tensor) -> Tensor:\n  y = x.clone()\n  y.mul_(0.5)\n  return y\n",
      "def forward(self, x: Tensor) -> Tensor:\n  y = x * 2.0\n  y.relu_()\n  return y\n",
      "def forward(self, x: Tensor, n: int) -> Tensor:\n  return self.act(x, n > 1)\n"
      "def act(self, x: Tensor, inplace: bool) -> Tensor:\n  if inplace:\n    x.relu_()\n  return x\n",
  };
  for (const std::string& source : sources) {
    const torch::jit::Module module = defined(source);
    EXPECT_FALSE(certain_argument_write(module.get_method("forward").function())) << source;
  }
  for (const char* name : {"in_place_branch.pt", "appending_branch.pt"}) {
    LOAD_OR_SKIP(model, test_model(name));
    EXPECT_FALSE(block_write(model, "blocks.0")) << name;
  }
}

// No false refusal on real blocks: the example GPT's, ResNet-50's
// Bottlenecks (ReLU(inplace=True) on their own intermediate tensors, a
// BatchNorm's num_batches_tracked.add_), the DenseNet-style layers and the
// traced Llama decoder's layers.
TEST(ArgumentWrites, TheBlocksOfRealModelsWriteNoArgument) {
  const std::vector<std::string> paths = {example_model("gpt.pt"), example_model("resnet50.pt"), test_model("dense.pt"),
                                          test_model("llama_trace.pt")};
  for (const std::string& path : paths) {
    LOAD_OR_SKIP(model, path);
    const std::vector<BlockInfo> blocks = detect_blocks(model);
    EXPECT_FALSE(blocks.empty()) << path;
    for (const BlockInfo& block : blocks) {
      for (const auto& entry : model.named_modules()) {
        if (entry.name != block.path) continue;
        for (const torch::jit::Method& method : entry.value.get_methods())
          EXPECT_FALSE(certain_argument_write(method.function())) << path << " " << block.path << "." << method.name();
      }
    }
  }
}

// apply_checkpointing refuses the class before anything runs or is
// rewritten, naming the first block, the argument, the operator and the
// line; the blocks of other classes are listed for a retry.
TEST(CheckpointErrors, ABlockWhoseGraphWritesItsInputIsRefusedBeforeItRuns) {
  LOAD_OR_SKIP(model, test_model("in_place.pt"));
  try {
    apply_checkpointing(model, parse_checkpoint_plan("all"), "in_place.pt");
    FAIL() << "no CheckpointRefused";
  } catch (const CheckpointRefused& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("in_place.pt: cannot checkpoint 'blocks.0': forward of __torch__.ScalingBlock modifies "
                            "its argument x in place (aten::mul_ at ",
                            0),
              0)
        << message;
    EXPECT_NE(message.find(script_line("ScalingBlock", "x.mul_(0.5)")), std::string::npos) << message;
    EXPECT_EQ(e.block_class(), "__torch__.ScalingBlock");
    EXPECT_EQ(e.chosen_blocks(), (std::vector<std::string>{"blocks.0", "blocks.1"}));
    EXPECT_TRUE(e.other_blocks().empty());
  }
  EXPECT_EQ(count_checkpoint_nodes(model), 0);
  EXPECT_EQ(take_refused_block_class(), std::nullopt);
  // Unchecked, the model runs as it was loaded.
  EXPECT_EQ(model.forward({at::ones({2, 16})}).toTensor().sizes(), (std::vector<int64_t>{2, 16}));
}

// What a retry may still checkpoint: the other classes' blocks, in order,
// whether the refusal came from the graph or from the operator.
TEST(CheckpointErrors, TheBlocksOfOtherClassesKeepTheirOrder) {
  const std::vector<CheckpointedBlock> blocks = {{"encoder.0", "__torch__.Enc"},
                                                 {"decoder.0", "__torch__.Halving"},
                                                 {"encoder.1", "__torch__.Enc"},
                                                 {"decoder.1", "__torch__.Halving"},
                                                 {"head", "__torch__.Head"}};
  EXPECT_EQ(blocks_of_other_classes(blocks, "__torch__.Halving"),
            (std::vector<std::string>{"encoder.0", "encoder.1", "head"}));
  EXPECT_EQ(blocks_of_other_classes(blocks, "__torch__.Absent"),
            (std::vector<std::string>{"encoder.0", "decoder.0", "encoder.1", "decoder.1", "head"}));
  EXPECT_TRUE(blocks_of_other_classes({{"a.0", "__torch__.A"}}, "__torch__.A").empty());
}

}  // namespace
}  // namespace oomtune
