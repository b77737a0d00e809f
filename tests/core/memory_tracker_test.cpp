#include "probes/memory_tracker.h"

#include <atomic>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/library.h>

#include "probes/backward_activation_peak.h"

namespace oomtune {
namespace {

constexpr int64_t kFloats = 1 << 20;  // 4 MiB of float32
constexpr int64_t kBytes = kFloats * 4;

// An operator's implementation with a temporary of its own (kScratchFloats,
// freed when it returns) beside its output (kOutputFloats).
constexpr int64_t kScratchFloats = 3000, kOutputFloats = 500;
at::Tensor temporary_then_output(const at::Tensor& x) {
  at::Tensor temporary = at::empty({kScratchFloats}, x.options());
  temporary.fill_(1);
  return at::empty({kOutputFloats}, x.options());
}

// Registered as a CPU kernel (a temporary a CUDA kernel need not have:
// kernel scratch) and as a decomposition, CompositeImplicitAutograd (which
// makes the same temporary on any device).
TORCH_LIBRARY(oomtune_test, m) {
  m.def("kernel_with_scratch(Tensor x) -> Tensor");
  m.def("composite_with_temporary(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(oomtune_test, CPU, m) { m.impl("kernel_with_scratch", temporary_then_output); }
TORCH_LIBRARY_IMPL(oomtune_test, CompositeImplicitAutograd, m) {
  m.impl("composite_with_temporary", temporary_then_output);
}

at::Tensor call(const char* op, const at::Tensor& x) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(op, "").typed<at::Tensor(const at::Tensor&)>().call(x);
}

TEST(MemoryTracker, CountsLiveAndPeakBytesPerPhase) {
  MemoryTracker tracker;
  const int64_t base = tracker.live_bytes();
  tracker.begin_phase(Phase::kForward);
  {
    at::Tensor a = at::empty({kFloats}, at::kFloat);
    at::Tensor b = at::empty({kFloats}, at::kFloat);
    EXPECT_EQ(tracker.live_bytes() - base, 2 * kBytes);
    EXPECT_EQ(tracker.block_bytes(a.data_ptr()), kBytes);
  }
  EXPECT_EQ(tracker.live_bytes(), base);
  tracker.begin_phase(Phase::kBackward);
  at::Tensor c = at::empty({kFloats / 2}, at::kFloat);
  tracker.end_phase();
  const PhaseMemory forward = tracker.phase(Phase::kForward);
  EXPECT_EQ(forward.peak_bytes - forward.start_bytes, 2 * kBytes);
  EXPECT_EQ(forward.allocations, 2);
  EXPECT_EQ(forward.allocated_bytes, 2 * kBytes);
  EXPECT_EQ(forward.end_bytes, base);
  const PhaseMemory backward = tracker.phase(Phase::kBackward);
  EXPECT_EQ(backward.end_bytes - base, kBytes / 2);
  EXPECT_EQ(tracker.peak_bytes() - base, 2 * kBytes);
}

TEST(MemoryTracker, RestoresThePreviousAllocator) {
  c10::Allocator* before = c10::GetCPUAllocator();
  at::Tensor survivor;
  {
    MemoryTracker tracker;
    EXPECT_EQ(c10::GetCPUAllocator(), &tracker);
    survivor = at::ones({1000}, at::kFloat);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  // A block that outlives its tracker is still readable and freed cleanly.
  EXPECT_FLOAT_EQ(survivor.sum().item<float>(), 1000.0f);
  survivor = at::Tensor();
  MemoryTracker second;  // a new tracker starts from zero
  EXPECT_EQ(second.live_bytes(), 0);
}

// Every tensor here is made inside a kernel call (aten::empty), where a
// block may be the kernel's scratch, which no GPU holds (Note [Budget and
// kernel scratch] in probes/memory_tracker.cpp): one that takes the bytes
// past twice the budget is refused at once, one that takes the tensors
// past the budget at the next allocation, when the call has returned.
TEST(MemoryTracker, BudgetThrowsOutOfMemoryAndLeavesNothingBehind) {
  TrackerOptions options;
  options.budget_bytes = 3 * kBytes;
  MemoryTracker tracker(options);
  at::Tensor a = at::empty({kFloats}, at::kFloat);
  at::Tensor b = at::empty({kFloats}, at::kFloat);
  EXPECT_THROW(at::empty({5 * kFloats}, at::kFloat), c10::OutOfMemoryError);
  EXPECT_EQ(tracker.out_of_memory_count(), 1);
  EXPECT_EQ(tracker.live_bytes(), 2 * kBytes);
  at::Tensor c = at::empty({2 * kFloats}, at::kFloat);
  EXPECT_THROW(at::empty({1}, at::kFloat), c10::OutOfMemoryError);
  EXPECT_EQ(tracker.out_of_memory_count(), 2);
  EXPECT_EQ(tracker.live_bytes(), 4 * kBytes);
  a = at::Tensor();
  b = at::Tensor();
  c = at::Tensor();
  EXPECT_EQ(tracker.live_bytes(), 0);
  EXPECT_NO_THROW(at::empty({3 * kFloats}, at::kFloat));
}

TEST(MemoryTracker, HostScopeSeparatesHostFromDeviceBytes) {
  MemoryTracker tracker;
  at::Tensor device = at::empty({kFloats}, at::kFloat);
  at::Tensor host;
  {
    HostMemoryScope scope;
    EXPECT_EQ(current_memory_pool(), MemoryPool::kHost);
    host = at::empty({2 * kFloats}, at::kFloat);
  }
  EXPECT_EQ(current_memory_pool(), MemoryPool::kDevice);
  EXPECT_EQ(tracker.live_bytes(MemoryPool::kDevice), kBytes);
  EXPECT_EQ(tracker.live_bytes(MemoryPool::kHost), 2 * kBytes);
  host = at::Tensor();
  EXPECT_EQ(tracker.live_bytes(MemoryPool::kHost), 0);
}

// A tracker that counts from after the operands of a 64 x 256 by 256 x 4096
// matmul were made (its output: 1 MiB).
class MatmulLabel : public ::testing::Test {
 protected:
  void SetUp() override { tracker.reset_statistics(); }
  MemoryTracker tracker;
  at::Tensor x = at::randn({64, 256});
  at::Tensor w = at::randn({256, 4096});
};

TEST_F(MatmulLabel, LargestAllocationNamesItsOperatorAndPhase) {
  tracker.begin_phase(Phase::kForward);
  at::Tensor y = at::mm(x, w);  // 64 * 4096 * 4 = 1 MiB, the largest
  at::Tensor z = at::relu(at::randn({16}));
  tracker.end_phase();
  const LargestAllocation largest = tracker.largest();
  EXPECT_EQ(largest.bytes, 64 * 4096 * 4);
  EXPECT_EQ(largest.op, "aten::mm");
  EXPECT_EQ(largest.phase, Phase::kForward);
}

TEST_F(MatmulLabel, OpsInsideAnOomtuneOperatorAreNamedUnderIt) {
  // A checkpointed block's ops run inside the recompute operator
  // oomtune::checkpoint; the label names the model's op under it.
  tracker.begin_phase(Phase::kForward);
  at::Tensor y;
  {
    RECORD_FUNCTION("oomtune::checkpoint", std::vector<c10::IValue>());
    y = at::mm(x, w);
  }
  tracker.end_phase();
  EXPECT_EQ(tracker.largest().op, "oomtune::checkpoint > aten::mm");
}

// oomtune's own autograd functions reach RecordFunction as CppNode<...>:
// the label keeps the function's name, and calls the checkpoint's backward
// what it is.
TEST_F(MatmulLabel, OomtunesAutogradFunctionsAreNamedByTheirFunction) {
  tracker.begin_phase(Phase::kBackward);
  auto largest_under = [&](const char* node, int64_t columns) {
    RECORD_FUNCTION_WITH_SCOPE(at::RecordScope::BACKWARD_FUNCTION, node, std::vector<c10::IValue>());
    return at::mm(x, w.narrow(1, 0, columns));
  };
  at::Tensor a = largest_under("torch::autograd::CppNode<oomtune::(anonymous namespace)::FusedAttention>", 1024);
  EXPECT_EQ(tracker.largest().op, "FusedAttention > aten::mm");
  at::Tensor b = largest_under("torch::autograd::CppNode<oomtune::(anonymous namespace)::RecomputeFunction>", 2048);
  EXPECT_EQ(tracker.largest().op, "checkpoint recomputation > aten::mm");
  at::Tensor c = largest_under("MmBackward0", 4096);
  EXPECT_EQ(tracker.largest().op, "MmBackward0 > aten::mm");
  tracker.end_phase();
}

// `a + a`: AddBackward0 hands its one gradient to both of a's edges, and the
// engine sums the two into a new tensor after the node has returned (a
// residual block's input gradient is made so): the label names the node
// whose outputs were summed.
TEST(MemoryTracker, TheEnginesGradientSumsAreNamedAfterTheNode) {
  TrackerOptions options;
  options.record_events = true;
  MemoryTracker tracker(options);
  const at::Tensor w = at::randn({64, 256}).requires_grad_(true);
  const at::Tensor x = at::randn({256, 512});
  tracker.reset_statistics();
  tracker.begin_phase(Phase::kBackward);
  const at::Tensor a = at::mm(w, x);
  (a + a).sum().backward();
  tracker.end_phase();
  const std::vector<std::string> names = tracker.op_names();
  int64_t summed = 0;
  for (const TrackedEvent& e : tracker.events())
    if (e.kind == TrackedEvent::Kind::kAlloc && names.at(e.op) == "AddBackward0 > gradient sum") summed += e.bytes;
  EXPECT_EQ(summed, 64 * 512 * 4);  // one [64, 512] fp32 sum
}

TEST(MemoryTracker, RecordsEventsInOrderWhenAsked) {
  TrackerOptions options;
  options.record_events = true;
  options.attribute_ops = true;
  MemoryTracker tracker(options);
  tracker.begin_phase(Phase::kBackward);
  { at::Tensor a = at::zeros({kFloats}, at::kFloat); }
  const auto events = tracker.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, TrackedEvent::Kind::kAlloc);
  EXPECT_EQ(events[1].kind, TrackedEvent::Kind::kFree);
  EXPECT_EQ(events[0].address, events[1].address);
  EXPECT_EQ(events[0].bytes, kBytes);
  EXPECT_EQ(events[0].phase, Phase::kBackward);
  EXPECT_EQ(tracker.op_names()[events[0].op], "aten::zeros");
}

// Note [cuBLAS calls]: the first matrix product of the forward (the
// training thread's handle) and of the backward (autograd's) are where a
// CUDA run allocates its two cuBLAS workspaces; elementwise operators and
// products inside a KernelScratchScope (which the CUDA target computes with
// kernels of its own) call none, and reset_statistics() keeps them.
TEST(MemoryTracker, FindsTheFirstCublasOperatorOfEachThread) {
  TrackerOptions options;
  options.record_events = true;
  MemoryTracker tracker(options);
  const at::Tensor a = at::ones({4, 4});
  tracker.begin_phase(Phase::kForward);
  at::Tensor sum = a + a;  // elementwise: no cuBLAS
  EXPECT_EQ(tracker.cublas_calls().handles(), 0);
  {
    KernelScratchScope scope;
    at::Tensor inside = at::mm(a, a);
  }
  EXPECT_EQ(tracker.cublas_calls().handles(), 0);
  const std::size_t before_linear = tracker.event_count();
  at::Tensor product = at::linear(a, a);  // aten::linear > aten::mm
  at::Tensor again = at::mm(a, a);
  tracker.begin_phase(Phase::kLoss);
  at::Tensor scale = at::matmul(a, a);  // the training thread's handle again
  tracker.begin_phase(Phase::kBackward);
  at::Tensor elementwise = sum * 2;
  const std::size_t before_bmm = tracker.event_count();
  at::Tensor batched = at::bmm(a.unsqueeze(0), a.unsqueeze(0));
  tracker.reset_statistics();
  const CublasCalls calls = tracker.cublas_calls();
  ASSERT_TRUE(calls.training_thread && calls.autograd_thread);
  EXPECT_EQ(calls.handles(), 2);
  EXPECT_EQ(calls.training_thread->event, before_linear);
  EXPECT_EQ(calls.training_thread->phase, Phase::kForward);
  EXPECT_EQ(calls.autograd_thread->event, before_bmm);
  EXPECT_EQ(calls.autograd_thread->phase, Phase::kBackward);
  EXPECT_EQ(calls.lt_handles(), 0) << "no matmul with a bias: no cuBLASLt";
}

// Note [cuBLAS calls]: the first matmul with a bias epilogue (aten::addmm,
// as a 2-D linear layer with a bias calls it) is where a CUDA run takes
// cuBLASLt's workspace on that thread; plain products before it are not.
TEST(MemoryTracker, FindsTheFirstCublasLtOperatorOfEachThread) {
  TrackerOptions options;
  options.record_events = true;
  MemoryTracker tracker(options);
  const at::Tensor a = at::ones({4, 4});
  const at::Tensor bias = at::ones({4});
  tracker.begin_phase(Phase::kForward);
  at::Tensor plain = at::mm(a, a);
  EXPECT_EQ(tracker.cublas_calls().lt_handles(), 0);
  const std::size_t before_addmm = tracker.event_count();
  at::Tensor with_bias = at::addmm(bias, a, a);
  tracker.begin_phase(Phase::kBackward);
  at::Tensor backward_product = at::mm(a, a);  // autograd's thread: cuBLAS, no cuBLASLt
  const CublasCalls calls = tracker.cublas_calls();
  EXPECT_EQ(calls.handles(), 2);
  ASSERT_TRUE(calls.lt_training_thread.has_value());
  EXPECT_EQ(calls.lt_training_thread->event, before_addmm);
  EXPECT_EQ(calls.lt_training_thread->phase, Phase::kForward);
  EXPECT_FALSE(calls.lt_autograd_thread.has_value());
  EXPECT_EQ(calls.lt_handles(), 1);
}

// Note [cuDNN calls]: a convolution's forward and backward and a batch
// norm are counted by their ATen entry points, from reset_statistics() on.
TEST(MemoryTracker, CountsTheCallsCudaGivesToCudnn) {
  MemoryTracker tracker;
  const at::Tensor weight = at::ones({2, 1, 3, 3}).requires_grad_();
  const at::Tensor x = at::ones({1, 1, 5, 5});
  at::conv2d(x, weight);  // the warm-up's call: forgotten below
  tracker.reset_statistics();
  tracker.begin_phase(Phase::kForward);
  at::Tensor y = at::conv2d(x, weight);
  y = at::batch_norm(y, {}, {}, {}, {}, /*training=*/true, 0.1, 1e-5, /*cudnn_enabled=*/true);
  at::Tensor product = at::mm(at::ones({2, 2}), at::ones({2, 2}));  // not cuDNN's
  tracker.begin_phase(Phase::kBackward);
  y.sum().backward();
  const CudnnCalls calls = tracker.cudnn_calls();
  EXPECT_EQ(calls.convolutions, 1);
  EXPECT_EQ(calls.convolution_backwards, 1);
  EXPECT_EQ(calls.batch_norms, 1);
}

// Note [Loader records]: of the blocks made after a mark, those alive and
// not kept leave the live bytes and the event stream, their later free is
// not counted; those made and freed since leave the event stream; a block
// from before the mark, its free after it, and a kept block stay.
TEST(MemoryTracker, ForgetsTheBlocksSinceAMarkThatNothingKeeps) {
  TrackerOptions options;
  options.record_events = true;
  MemoryTracker tracker(options);
  at::Tensor before = at::empty({kFloats}, at::kFloat);
  at::Tensor freed_after_mark = at::empty({kFloats / 16}, at::kFloat);
  const MemoryTracker::Mark mark = tracker.mark();
  EXPECT_EQ(mark.events, 2u);
  freed_after_mark = at::Tensor();
  at::Tensor kept = at::empty({kFloats / 2}, at::kFloat);
  at::Tensor record = at::empty({kFloats / 4}, at::kFloat);
  { at::Tensor gone = at::empty({kFloats / 8}, at::kFloat); }
  const int64_t live = tracker.live_bytes();
  EXPECT_EQ(tracker.events().size(), 7u);

  EXPECT_EQ(tracker.forget_blocks_since(mark, {kept.data_ptr()}), kBytes / 4);
  EXPECT_EQ(tracker.live_bytes(), live - kBytes / 4);
  EXPECT_EQ(tracker.block_bytes(record.data_ptr()), 0);
  EXPECT_EQ(tracker.block_bytes(kept.data_ptr()), kBytes / 2);
  EXPECT_EQ(tracker.block_bytes(before.data_ptr()), kBytes);
  std::vector<std::pair<TrackedEvent::Kind, int64_t>> stream;
  for (const TrackedEvent& e : tracker.events()) stream.emplace_back(e.kind, e.bytes);
  using K = TrackedEvent::Kind;
  EXPECT_EQ(stream,
            (std::vector<std::pair<K, int64_t>>{
                {K::kAlloc, kBytes}, {K::kAlloc, kBytes / 16}, {K::kFree, kBytes / 16}, {K::kAlloc, kBytes / 2}}));

  record = at::Tensor();  // freed uncounted
  EXPECT_EQ(tracker.live_bytes(), live - kBytes / 4);
  EXPECT_EQ(tracker.events().size(), 4u);
}

// The device feed (CUDA trials: probes/cuda_allocator_trace.h) by hand: an
// operator whose kernel takes a workspace and its output from the device's
// allocator and frees the workspace before it returns, as cuDNN's
// convolution does. On a GPU that workspace raises the peak, so it counts
// at once, in order, under the operator's name; no kernel scratch; and
// every CPU allocation is host memory.
MemoryTracker* g_fed = nullptr;
constexpr uint64_t kWorkspaceAddress = 0x7f0000000000, kOutputAddress = 0x7f0000100000;
constexpr int64_t kWorkspaceBytes = 1 << 20, kDeviceOutputBytes = 2 << 20;
at::Tensor device_kernel(const at::Tensor& x) {
  g_fed->device_alloc(kWorkspaceAddress, kWorkspaceBytes);
  g_fed->device_alloc(kOutputAddress, kDeviceOutputBytes);
  g_fed->device_free(kWorkspaceAddress);
  return x;
}
TORCH_LIBRARY_FRAGMENT(oomtune_test, m) { m.def("device_kernel(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(oomtune_test, CPU, m) { m.impl("device_kernel", device_kernel); }

TEST(MemoryTracker, FedDeviceBlocksCountAtOnceUnderTheirOperatorAndCpuBlocksAreHost) {
  TrackerOptions options;
  options.record_events = true;
  options.device_feed = true;
  MemoryTracker tracker(options);
  g_fed = &tracker;
  tracker.begin_phase(Phase::kForward);
  at::Tensor host = at::empty({kFloats}, at::kFloat);
  EXPECT_EQ(tracker.live_bytes(MemoryPool::kHost), kBytes);
  EXPECT_EQ(tracker.live_bytes(), 0);
  call("oomtune_test::device_kernel", host);
  tracker.device_free(0x1234);  // allocated before the tracker: ignored
  tracker.end_phase();
  g_fed = nullptr;

  EXPECT_EQ(tracker.live_bytes(), kDeviceOutputBytes);
  EXPECT_EQ(tracker.block_bytes(reinterpret_cast<const void*>(kOutputAddress)), kDeviceOutputBytes);
  const PhaseMemory forward = tracker.phase(Phase::kForward);
  EXPECT_EQ(forward.peak_bytes, kWorkspaceBytes + kDeviceOutputBytes);
  EXPECT_EQ(forward.allocations, 2);
  EXPECT_EQ(forward.end_bytes, kDeviceOutputBytes);
  EXPECT_EQ(tracker.peak_bytes(), kWorkspaceBytes + kDeviceOutputBytes);
  EXPECT_EQ(tracker.kernel_scratch().peak_bytes, 0);
  EXPECT_EQ(tracker.largest().bytes, kDeviceOutputBytes);
  EXPECT_EQ(tracker.largest().op, "oomtune_test::device_kernel");

  std::vector<std::tuple<TrackedEvent::Kind, uint64_t, int64_t>> device_events;
  for (const TrackedEvent& e : tracker.events())
    if (e.pool == MemoryPool::kDevice) device_events.emplace_back(e.kind, e.address, e.bytes);
  const std::vector<std::tuple<TrackedEvent::Kind, uint64_t, int64_t>> expected = {
      {TrackedEvent::Kind::kAlloc, kWorkspaceAddress, kWorkspaceBytes},
      {TrackedEvent::Kind::kAlloc, kOutputAddress, kDeviceOutputBytes},
      {TrackedEvent::Kind::kFree, kWorkspaceAddress, kWorkspaceBytes}};
  EXPECT_EQ(device_events, expected);
}

// A backward pass by hand, 1000 bytes live at its start, four autograd node
// runs: the moment where live bytes less the gradients made so far are
// highest, and the same backward as a later micro-batch of an accumulated
// step (a gradient is pending, beside the stored ones, until its run ends),
// worked out below as (live, gradients, pending).
TEST(BackwardActivationPeak, IsWhereLiveBytesLessNewGradientsAreHighest) {
  using K = TrackedEvent::Kind;
  auto event = [](K kind, uint64_t address, int64_t bytes, uint32_t run, MemoryPool pool = MemoryPool::kDevice) {
    return TrackedEvent{kind, pool, Phase::kBackward, address, bytes, 0, run};
  };
  const std::vector<TrackedEvent> events = {
      event(K::kAlloc, 1, 100, 1),                      // logits' gradient: (1100, 0, 0)
      event(K::kAlloc, 2, 400, 2),                      // run 2: gradient of W2: (1500, 400, 400)
      event(K::kAlloc, 3, 300, 2),                      // and of h: (1800, 400, 400) -> later 1800
      event(K::kFree, 1, 100, 0),                       // 1700
      event(K::kAlloc, 4, 2000, 3, MemoryPool::kHost),  // host: not counted
      event(K::kAlloc, 5, 350, 3),                      // run 3, a temporary: (2050, 400, 0) -> 1650
      event(K::kFree, 5, 350, 0),                       // 1700
      event(K::kFree, 3, 300, 0),                       // 1400
      event(K::kAlloc, 5, 50, 4),                       // run 4: gradient of W1 at that address: (1450, 450, 50)
  };
  const std::unordered_set<uint64_t> gradients = {2, 5};
  using Peak = std::tuple<int64_t, int64_t, int64_t>;  // live, gradients, accumulating
  using Levels = std::vector<GradientLevel>;           // {gradients made, live, accumulating}
  auto find = [&](std::size_t begin, std::size_t end, int64_t live, const std::unordered_set<uint64_t>& named) {
    const BackwardActivationPeak p = find_backward_activation_peak(events, begin, end, live, named);
    return Peak{p.live_bytes, p.gradient_bytes, p.accumulating_bytes};
  };
  auto levels = [&](std::size_t begin, std::size_t end, int64_t live, const std::unordered_set<uint64_t>& named) {
    return find_backward_activation_peak(events, begin, end, live, named).by_gradients;
  };
  EXPECT_EQ(find(0, events.size(), 1000, gradients), Peak(2050, 400, 1800));
  // By gradients made: none (1100), W2's (up to 2050 with the temporary;
  // as a later micro-batch 1800, with W2's pending), W1's too (1450; less
  // both, with W1's pending, 1050).
  EXPECT_EQ(levels(0, events.size(), 1000, gradients), (Levels{{0, 1100, 1100}, {400, 2050, 1800}, {450, 1450, 1050}}));
  // Before the temporary: the gradient of h, with W2's pending.
  EXPECT_EQ(find(0, 3, 1000, gradients), Peak(1800, 400, 1800));
  EXPECT_EQ(levels(0, 3, 1000, gradients), (Levels{{0, 1100, 1100}, {400, 1800, 1800}}));
  // No gradients named: the highest live bytes, both ways, one level.
  EXPECT_EQ(find(0, events.size(), 1000, {}), Peak(2050, 0, 2050));
  EXPECT_EQ(levels(0, events.size(), 1000, {}), (Levels{{0, 2050, 2050}}));
  // Nothing happened: the start.
  EXPECT_EQ(find(3, 3, 1340, gradients), Peak(1340, 0, 1340));
  EXPECT_EQ(levels(3, 3, 1340, gradients), (Levels{{0, 1340, 1340}}));
  EXPECT_THROW(find_backward_activation_peak(events, 4, 3, 0, gradients), std::out_of_range);
  EXPECT_THROW(find_backward_activation_peak(events, 0, events.size() + 1, 0, gradients), std::out_of_range);
}

// native_batch_norm_backward as two CPU kernels run it (Note [Kernel output
// order]): grad_input (address 1) before grad_weight and grad_bias (2, 3),
// as oneDNN's bf16 kernel does on a CPU with AMX, or after them, as ATen's
// does; 1000 bytes live before, then the next node's 2048 B, then
// grad_input freed. Both read as grad_input first, the order of the frees,
// worked out as (live, gradients, pending): grad_input (9192, 0, 0),
// grad_weight (17384, 8192, 8192), grad_bias (25576, 16384, 16384), the
// next node's output (27624, 16384, 0: another run).
TEST(BackwardActivationPeak, EqualOutputsOfOneKernelCallReadAsInTheOrderOfTheirFrees) {
  using K = TrackedEvent::Kind;
  auto event = [](K kind, uint64_t address, int64_t bytes, uint32_t call) {
    return TrackedEvent{kind, MemoryPool::kDevice, Phase::kBackward, address, bytes, 0, call, call};
  };
  const std::unordered_set<uint64_t> gradients = {2, 3};
  for (const bool grad_input_first : {true, false}) {
    SCOPED_TRACE(grad_input_first ? "grad_input first" : "grad_input last");
    std::vector<TrackedEvent> events = {event(K::kAlloc, 2, 8192, 5), event(K::kAlloc, 3, 8192, 5)};
    events.insert(grad_input_first ? events.begin() : events.end(), event(K::kAlloc, 1, 8192, 5));
    events.push_back(event(K::kAlloc, 4, 2048, 6));
    events.push_back(event(K::kFree, 1, 8192, 0));
    const BackwardActivationPeak peak = find_backward_activation_peak(events, 0, events.size(), 1000, gradients);
    EXPECT_EQ(peak.by_gradients,
              (std::vector<GradientLevel>{{0, 9192, 9192}, {8192, 17384, 17384}, {16384, 27624, 25576}}));
    EXPECT_EQ(std::make_tuple(peak.live_bytes, peak.gradient_bytes, peak.accumulating_bytes),
              std::make_tuple(int64_t{27624}, int64_t{16384}, int64_t{25576}));
  }
}

// Allocations name the run of their innermost enclosing frame: two calls of
// the same operator are two runs, and an op outside any frame has none.
TEST(MemoryTracker, EventsNameTheRunOfTheirEnclosingFrame) {
  TrackerOptions options;
  options.record_events = true;
  MemoryTracker tracker(options);
  { at::Tensor outside = at::zeros({16}, at::kFloat); }
  for (int call = 0; call < 2; ++call) {
    RECORD_FUNCTION("oomtune::checkpoint", std::vector<c10::IValue>());
    at::Tensor a = at::zeros({16}, at::kFloat);
    at::Tensor b = at::zeros({16}, at::kFloat);
  }
  std::vector<uint32_t> runs;
  for (const TrackedEvent& e : tracker.events())
    if (e.kind == TrackedEvent::Kind::kAlloc) runs.push_back(e.frame_run);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(runs[0], 0u);
  EXPECT_NE(runs[1], 0u);
  EXPECT_EQ(runs[1], runs[2]);
  EXPECT_NE(runs[3], runs[1]);
  EXPECT_EQ(runs[3], runs[4]);
}

// Allocations name the call of the operator their label names: the outputs
// of one call share it (aminmax: two outputs of one size), two calls differ
// inside one frame and outside any (allocsim::order_interchangeable_allocations
// reorders equal sizes within one call only).
TEST(MemoryTracker, EventsNameTheCallOfTheirOperator) {
  TrackerOptions options;
  options.record_events = true;
  MemoryTracker tracker(options);
  const at::Tensor x = at::ones({64, 16}, at::kFloat);
  const std::size_t before = tracker.event_count();
  { auto [low, high] = at::aminmax(x, /*dim=*/1); }
  {
    at::Tensor a = at::zeros({16}, at::kFloat);
    at::Tensor b = at::zeros({16}, at::kFloat);
  }
  {
    RECORD_FUNCTION("oomtune::checkpoint", std::vector<c10::IValue>());
    at::Tensor c = at::zeros({16}, at::kFloat);
    at::Tensor d = at::zeros({16}, at::kFloat);
  }
  const std::vector<TrackedEvent> events = tracker.events();
  std::vector<uint32_t> calls, runs;
  for (std::size_t i = before; i < events.size(); ++i)
    if (events[i].kind == TrackedEvent::Kind::kAlloc) {
      calls.push_back(events[i].op_call);
      runs.push_back(events[i].frame_run);
    }
  ASSERT_EQ(calls.size(), 6u);
  for (uint32_t call : calls) EXPECT_NE(call, 0u);
  EXPECT_EQ(calls[0], calls[1]);  // aminmax's min and max
  EXPECT_NE(calls[2], calls[1]);
  EXPECT_NE(calls[3], calls[2]);  // two zeros outside any frame
  EXPECT_NE(calls[5], calls[4]);  // two zeros in one checkpoint frame...
  EXPECT_EQ(runs[5], runs[4]);    // ...which is one run
}

// ---- Kernel scratch (Note [Kernel scratch] in probes/memory_tracker.cpp).

// A tracker that records events, an input made before it resets its
// statistics, and where the live bytes and the events stood then.
class ScratchTest : public ::testing::Test {
 protected:
  ScratchTest() : tracker(recording()), x(at::ones({4})) {
    tracker.reset_statistics();
    base = tracker.live_bytes();
    events_before = tracker.event_count();
  }
  static TrackerOptions recording() {
    TrackerOptions options;
    options.record_events = true;
    return options;
  }

  MemoryTracker tracker;
  const at::Tensor x;
  int64_t base = 0;
  std::size_t events_before = 0;
};

TEST_F(ScratchTest, AKernelsOwnTemporaryIsScratchInNoPeakOrEvent) {
  tracker.begin_phase(Phase::kForward);
  const at::Tensor y = call("oomtune_test::kernel_with_scratch", x);
  tracker.end_phase();
  EXPECT_EQ(tracker.live_bytes() - base, 4 * kOutputFloats);
  EXPECT_EQ(tracker.peak_bytes() - base, 4 * kOutputFloats) << "the temporary is in no peak";
  const PhaseMemory forward = tracker.phase(Phase::kForward);
  EXPECT_EQ(forward.peak_bytes - base, 4 * kOutputFloats);
  EXPECT_EQ(forward.allocations, 1);
  EXPECT_EQ(forward.allocated_bytes, 4 * kOutputFloats);
  EXPECT_EQ(forward.kernel_scratch_peak_bytes, 4 * kScratchFloats);
  const KernelScratch scratch = tracker.kernel_scratch();
  EXPECT_EQ(scratch.peak_bytes, 4 * kScratchFloats);
  EXPECT_EQ(scratch.allocations, 1);
  EXPECT_EQ(scratch.allocated_bytes, 4 * kScratchFloats);
  EXPECT_EQ(scratch.op, "oomtune_test::kernel_with_scratch");
  // The output was made while the temporary was alive: the CPU held both.
  EXPECT_EQ(scratch.peak_with_scratch_bytes - base, 4 * (kScratchFloats + kOutputFloats));
  EXPECT_EQ(tracker.largest().bytes, 4 * kOutputFloats);
  const std::vector<TrackedEvent> events = tracker.events();
  ASSERT_EQ(events.size() - events_before, 1u) << "the output's allocation only";
  EXPECT_EQ(events.back().kind, TrackedEvent::Kind::kAlloc);
  EXPECT_EQ(events.back().bytes, 4 * kOutputFloats);
  EXPECT_EQ(events.back().address, reinterpret_cast<uint64_t>(y.data_ptr()));
}

TEST_F(ScratchTest, ADecompositionsTemporaryCountsInOrder) {
  const at::Tensor y = call("oomtune_test::composite_with_temporary", x);
  EXPECT_EQ(tracker.live_bytes() - base, 4 * kOutputFloats);
  EXPECT_EQ(tracker.peak_bytes() - base, 4 * (kScratchFloats + kOutputFloats)) << "a CUDA run makes it too";
  EXPECT_EQ(tracker.kernel_scratch().allocations, 0);
  const std::vector<TrackedEvent> events = tracker.events();
  ASSERT_EQ(events.size() - events_before, 3u);
  using K = TrackedEvent::Kind;
  const std::vector<std::pair<K, int64_t>> expected = {
      {K::kAlloc, 4 * kScratchFloats}, {K::kAlloc, 4 * kOutputFloats}, {K::kFree, 4 * kScratchFloats}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const TrackedEvent& e = events[events_before + i];
    EXPECT_EQ(std::make_pair(e.kind, e.bytes), expected[i]) << "event " << i;
  }
}

// raw_allocate hands out memory that is not a tensor (oneDNN's scratchpads
// and reorders come this way): scratch wherever it is freed inside an
// operator call, and flagged when it was counted, outside any.
TEST(MemoryTracker, RawAllocationsAreScratchInsideAnOperatorAndFlaggedOutside) {
  MemoryTracker tracker;
  c10::Allocator* allocator = c10::GetCPUAllocator();
  const int64_t base = tracker.live_bytes();
  {
    RECORD_FUNCTION("oomtune_test::region", std::vector<c10::IValue>());
    void* raw = allocator->raw_allocate(1000);
    allocator->raw_deallocate(raw);
  }
  EXPECT_EQ(tracker.peak_bytes(), base);
  EXPECT_EQ(tracker.kernel_scratch().allocated_bytes, 1000);
  EXPECT_EQ(tracker.kernel_scratch().raw_bytes_counted, 0);
  void* raw = allocator->raw_allocate(700);
  allocator->raw_deallocate(raw);
  EXPECT_EQ(tracker.peak_bytes() - base, 700) << "outside any operator, nothing tells it apart in time";
  EXPECT_EQ(tracker.kernel_scratch().raw_bytes_counted, 700);
}

// ---- OpenMP workers (Note [OpenMP workers] in probes/memory_tracker.cpp).

// A CPU kernel whose parallel region runs one chunk per thread, each making
// a temporary through an operator of its own (aten::empty), raw memory
// (oneDNN's way) and two blocks that outlive the region: out[i] and
// kept[i]. It returns out[1], which a worker made; out[0] and both kept
// blocks are freed as it returns, on the calling thread.
constexpr int64_t kChunks = 2, kRawBytes = 1000;
std::atomic<bool> g_worker_ran{false};
at::Tensor parallel_chunks(const at::Tensor& x) {
  std::vector<at::Tensor> out(kChunks), kept(kChunks);
  at::parallel_for(0, kChunks, 1, [&](int64_t begin, int64_t end) {
    if (at::get_thread_num() != 0) g_worker_ran = true;
    for (int64_t i = begin; i < end; ++i) {
      at::Tensor temporary = at::empty({kScratchFloats}, x.options());
      c10::Allocator* allocator = c10::GetCPUAllocator();
      allocator->raw_deallocate(allocator->raw_allocate(kRawBytes));
      out[i] = at::empty({kOutputFloats}, x.options());
      kept[i] = at::empty({kScratchFloats}, x.options());
    }
  });
  return out[1];
}
TORCH_LIBRARY_FRAGMENT(oomtune_test, m) { m.def("parallel_chunks(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(oomtune_test, CPU, m) { m.impl("parallel_chunks", parallel_chunks); }

// Runs parallel_chunks on two OpenMP threads; nullopt when a worker ran no
// chunk (libtorch without OpenMP).
std::optional<at::Tensor> call_on_two_threads(const at::Tensor& x) {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  g_worker_ran = false;
  std::optional<at::Tensor> y;
  try {
    y = call("oomtune_test::parallel_chunks", x);
  } catch (...) {
    at::set_num_threads(threads);
    throw;
  }
  at::set_num_threads(threads);
  if (!g_worker_ran) return std::nullopt;
  return y;
}

TEST_F(ScratchTest, AWorkersBlocksAreItsKernelCallsAndScratchWhenFreedInIt) {
  tracker.begin_phase(Phase::kForward);
  const std::optional<at::Tensor> y = call_on_two_threads(x);
  tracker.end_phase();
  if (!y) GTEST_SKIP() << "no OpenMP worker ran a chunk: this libtorch runs at::parallel_for on one thread";
  EXPECT_EQ(tracker.live_bytes() - base, 4 * kOutputFloats) << "out[1], made on a worker";
  EXPECT_EQ(tracker.peak_bytes() - base, 4 * kOutputFloats) << "no other block is in a peak";
  const PhaseMemory forward = tracker.phase(Phase::kForward);
  EXPECT_EQ(forward.allocations, 1);
  EXPECT_EQ(forward.allocated_bytes, 4 * kOutputFloats);
  const KernelScratch scratch = tracker.kernel_scratch();
  EXPECT_EQ(scratch.raw_bytes_counted, 0);
  // Per chunk: the temporary, the raw bytes, out[i] and kept[i]; less out[1].
  EXPECT_EQ(scratch.allocations, 4 * kChunks - 1);
  EXPECT_EQ(scratch.allocated_bytes,
            kChunks * (4 * (2 * kScratchFloats + kOutputFloats) + kRawBytes) - 4 * kOutputFloats);
  const std::vector<TrackedEvent> events = tracker.events();
  ASSERT_EQ(events.size() - events_before, 1u) << "out[1]'s allocation only";
  EXPECT_EQ(events.back().address, reinterpret_cast<uint64_t>(y->data_ptr()));
  EXPECT_EQ(tracker.op_names().at(events.back().op), "oomtune_test::parallel_chunks") << "the calling thread's label";
  EXPECT_NE(events.back().op_call, 0u);
}

// A worker allocates to the pool of the thread whose kernel call it works
// for: out[1] is host memory under a HostMemoryScope (an offloaded
// optimizer's step).
TEST_F(ScratchTest, AWorkerAllocatesToItsKernelCallsPool) {
  const int64_t host_base = tracker.live_bytes(MemoryPool::kHost);
  std::optional<at::Tensor> y;
  {
    HostMemoryScope host;
    y = call_on_two_threads(x);
  }
  if (!y) GTEST_SKIP() << "no OpenMP worker ran a chunk: this libtorch runs at::parallel_for on one thread";
  EXPECT_EQ(tracker.live_bytes(MemoryPool::kHost) - host_base, 4 * kOutputFloats);
  EXPECT_EQ(tracker.live_bytes() - base, 0);
  EXPECT_EQ(tracker.peak_bytes() - base, 0) << "nothing on the device";
}

// A worker's scratch is under the kernel call's allowance, as the calling
// thread's is (Note [Budget and kernel scratch]): the input (kInputFloats)
// and out[1] fill the budget; the call holds the two chunks' blocks besides,
// under twice the budget.
TEST(MemoryTracker, TheBudgetLeavesAWorkersScratchOut) {
  constexpr int64_t kInputFloats = 16000;
  static_assert(kInputFloats + kChunks * (2 * kScratchFloats + kOutputFloats) + kChunks * kRawBytes / 4 <=
                2 * (kInputFloats + kOutputFloats));
  TrackerOptions options;
  options.budget_bytes = 4 * (kInputFloats + kOutputFloats);
  MemoryTracker tracker(options);
  const at::Tensor x = at::ones({kInputFloats});
  std::optional<at::Tensor> y;
  EXPECT_NO_THROW(y = call_on_two_threads(x));
  if (!y) GTEST_SKIP() << "no OpenMP worker ran a chunk: this libtorch runs at::parallel_for on one thread";
  EXPECT_EQ(tracker.live_bytes(), *options.budget_bytes);
  EXPECT_EQ(tracker.out_of_memory_count(), 0);
}

// Note [Budget and kernel scratch]: a GPU never holds a CPU kernel's
// scratch, so the budget does not count it. The input and the output
// (kOutputFloats) are the tensors; the temporary (kScratchFloats) is not.
TEST(MemoryTracker, TheBudgetLeavesKernelScratchOut) {
  const auto tensors = [](int64_t input_floats) { return 4 * (input_floats + kOutputFloats); };
  {
    TrackerOptions options;
    options.budget_bytes = tensors(kScratchFloats);
    MemoryTracker tracker(options);
    const at::Tensor x = at::ones({kScratchFloats});
    at::Tensor y;
    EXPECT_NO_THROW(y = call("oomtune_test::kernel_with_scratch", x))
        << "the tensors fit exactly; the call held 4 x (3000 + 3000 + 500) bytes, under twice the budget";
    EXPECT_EQ(tracker.live_bytes(), tensors(kScratchFloats));
    y.reset();
    // One byte less: the output takes the tensors past the budget, which is
    // known only when the kernel has returned; the next allocation is
    // refused.
    tracker.set_budget(tensors(kScratchFloats) - 1);
    EXPECT_NO_THROW(y = call("oomtune_test::kernel_with_scratch", x));
    EXPECT_THROW(at::ones({1}), c10::OutOfMemoryError);
    EXPECT_EQ(tracker.out_of_memory_count(), 1);
  }
  // A kernel call may hold twice the budget, scratch included, no more:
  // the tensors fit (16 + 500 floats), the call would hold 16 + 3000 + 500.
  TrackerOptions options;
  options.budget_bytes = tensors(16);
  MemoryTracker tracker(options);
  const at::Tensor x = at::ones({16});
  EXPECT_THROW(call("oomtune_test::kernel_with_scratch", x), c10::OutOfMemoryError);
  EXPECT_EQ(tracker.live_bytes(), 4 * 16) << "nothing left behind";
}

// A convolution through oneDNN (libtorch's CPU default for float32) reorders
// its weights into buffers of its own, sized by the CPU's instruction set:
// none of them is counted, only the output (1 x 8 x 30 x 30 floats).
TEST(MemoryTracker, AOneDnnConvolutionLeavesOnlyItsOutput) {
  MemoryTracker tracker;
  const at::Tensor x = at::randn({1, 3, 32, 32});
  const at::Tensor w = at::randn({8, 3, 3, 3});
  tracker.reset_statistics();
  const int64_t base = tracker.live_bytes();
  const at::Tensor y = at::conv2d(x, w);
  EXPECT_EQ(tracker.live_bytes() - base, 4 * 8 * 30 * 30);
  EXPECT_EQ(tracker.peak_bytes() - base, 4 * 8 * 30 * 30);
  EXPECT_EQ(tracker.kernel_scratch().raw_bytes_counted, 0);
}

}  // namespace
}  // namespace oomtune
