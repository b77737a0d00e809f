#include "probes/memory_tracker.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "common/byte_size.h"

namespace oomtune {

// Counts what the outermost operator call `run` did, now that it has
// returned (friend of MemoryTracker; called from the RecordFunction exit
// callback).
void settle_outermost_call(uint32_t run);
// Notes that an operator which calls cuBLAS on CUDA began now (friend of
// MemoryTracker; called from the RecordFunction enter callback).
void note_cublas_call(bool lt);
// Counts an operator call that CUDA runs with cuDNN in `counter` (Note
// [cuDNN calls]).
void note_cudnn_call(int64_t CudnnCalls::*counter);

namespace {

// Bytes in front of each block: keeps the block size and pool, and keeps the
// 64-byte alignment c10::alloc_cpu gives (c10/core/impl/alloc_cpu.cpp).
constexpr std::size_t kHeaderBytes = 64;
// SetCPUAllocator keeps the allocator whose priority is >= the installed one.
constexpr uint8_t kAllocatorPriority = 255;

struct BlockHeader {
  int64_t bytes;
  int32_t pool;
  uint32_t generation;
};
static_assert(sizeof(BlockHeader) <= kHeaderBytes);

// Note [Kernel scratch]
// Rationale: a CPU trial counts bytes a CUDA run of the same step never
// allocates: oneDNN's scratchpads and reordered (blocked) copies of weights
// and activations, which libtorch's oneDNN glue takes from the CPU
// allocator through raw_allocate (ATen/native/mkldnn/IDeepRegistration.cpp),
// per-thread reduction buffers (native_layer_norm_backward's), 0-dim
// tensors wrapping scalars (a CPU tensor on CUDA too), and the temporaries
// of whichever CPU algorithm ran. Their size depends on the CPU's
// instruction set and the thread count: with bf16 emulated (AVX-512
// without AVX512_BF16, DNNL_MAX_CPU_ISA=AVX512_CORE_VNNI here) the small
// test GPT's lm-head MmBackward0 held a 131,200 B oneDNN buffer (its
// 512 x 64 weight in fp32, + 128 B), which moved backward's peak at
// micro-batch 1 up by 32,896 B and not at 2; bf16's
// backward line lost 32,896 B per sample of slope, and 8-bit AdamW + bf16
// at 8 x 1 was predicted 175,214 B (3.7 %) below its run (issue #43).
// Approach: a block is scratch when it is freed through raw_deleter() (not
// a tensor), or inside the call of the kernel that made it, a kernel being
// an operator with an implementation of its own for the device rather than
// a decomposition into other operators (is_kernel): its outputs and what
// autograd saves are the same on every device, its temporaries are not. A
// decomposition's temporaries (aten::matmul's, aten::linear's) are made on
// CUDA too and stay counted. Whether a block is scratch is known only when
// it is freed, so everything inside an outermost operator call waits in a
// log and is counted when that call returns, in order: live bytes, peaks,
// phases, the largest allocation and the event stream see tensors only,
// exactly as they happened. Scratch counts apart (KernelScratch), and the
// budget leaves it out too (Note [Budget and kernel scratch]).
// The OpenMP workers of a kernel's parallel regions allocate for it too
// (Note [OpenMP workers]).
// Checked: every byte figure of the test GPT, ResNet-50 and the Hugging
// Face GPT-2 fixtures (the SDPA one on PyPI's libtorch 2.11) equal with
// oneDNN as the CPU runs it, capped at AVX512_CORE_BF16, AVX512_CORE or
// AVX2 (DNNL_MAX_CPU_ISA), without oneDNN, with ATen's default kernels
// (ATEN_CPU_CAPABILITY) and with 1, 2 or 3 OpenMP threads
// (tests/autotune/machine_independence_test.cpp).
// Limitations: raw_allocate outside any operator (and outside any kernel
// call's parallel region) cannot be told apart in time:
// KernelScratch::raw_bytes_counted says how much there was; 0 in the
// example models' and the Hugging Face GPT-2 fixtures' trials.

// Note [Budget and kernel scratch]
// Rationale: the budget stands for a GPU's memory, which a CPU kernel's
// scratch never takes. Counted against it, scratch made verification
// depend on the CPU: on an AVX-only CPU (an AMD EPYC without AVX2, PyPI's
// libtorch 2.11) ResNet-50's ConvolutionBackward0 asked for a 72.04 MiB
// block of scratch (81.04 MiB at most at once) and plain 8 x 1 ran out of a
// 342 MiB budget in backward, where its tensors peak at 301.68 MiB and an
// AVX2 or AVX-512 CPU verifies it (Autotune.PlainFitOnResNet50AndHeldBackPrediction).
// Approach: whether a block is scratch is known when it is freed, so an
// allocation inside a kernel call (is_kernel) is checked against the bytes
// held before that call began: those are tensors (a block made inside an
// earlier kernel call that outlived it is one). What the call itself holds
// may pass the budget, up to the budget again (kKernelScratchAllowance,
// which bounds the host memory a trial takes); what it leaves behind is
// judged at the next allocation, inside a kernel call or not. Outside
// kernel calls every byte counts as it is asked for, as before.
// Limitations: a kernel's output that takes the tensors past the budget is
// refused one allocation late, at the next one (possibly in the next
// phase); one that is the step's last allocation is refused by none, and
// the trial's peak says it is over (a verification compares its peak with
// the budget too: search/choose.cpp).
constexpr int64_t kKernelScratchAllowance = 2;  // a kernel call may hold this many budgets at once

// The device whose kernels' scratch is found (Note [Kernel scratch]).
constexpr c10::DispatchKey kKernelKey = c10::DispatchKey::CPU;

std::mutex g_mutex;  // guards g_active and every tracker's State
MemoryTracker* g_active = nullptr;
uint32_t g_active_generation = 0;
std::atomic<uint32_t> g_next_generation{1};

thread_local MemoryPool t_pool = MemoryPool::kDevice;

struct OpFrame {
  const char* name;
  bool backward;
  uint32_t run;  // this call's number (TrackedEvent::frame_run)
};
thread_local std::vector<OpFrame> t_ops;
std::atomic<uint32_t> g_next_run{1};
// The run of the outermost kernel call on this thread's stack (is_kernel);
// 0 = none.
thread_local uint32_t t_kernel_run = 0;
// The run of the kernel call of another thread that this OpenMP worker's
// own operator calls run inside (Note [OpenMP workers]); 0 = none.
thread_local uint32_t t_parent_run = 0;

// classify(fn) for `fn`'s operator, worked out once per thread: cached by
// the schema's name, which lives as long as the operator (each classify,
// a lambda of its own type, has its own cache). String-named records (user
// scopes, autograd nodes) are no operator: T{}.
template <typename T, typename Classify>
T per_operator(const at::RecordFunction& fn, Classify classify) {
  if (fn.scope() != at::RecordScope::FUNCTION) return T{};
  thread_local std::unordered_map<const char*, T> known;
  const char* name = fn.name();
  if (const auto it = known.find(name); it != known.end()) return it->second;
  return known.emplace(name, classify(fn)).first->second;
}

// Whether `fn` runs a kernel for kKernelKey: one registered for that key
// (aten::mm, aten::native_layer_norm_backward) or for every device with its
// own derivative, CompositeExplicitAutograd (aten::convolution_backward,
// aten::mkldnn_convolution in libtorch 1.13), and not a decomposition into
// other operators, CompositeImplicitAutograd (aten::linear, aten::matmul),
// whose temporaries a CUDA run makes too (c10/core/DispatchKey.h; the
// dispatcher runs a backend kernel before a CompositeImplicitAutograd one).
bool is_kernel(const at::RecordFunction& fn) {
  return per_operator<bool>(fn, [](const at::RecordFunction& f) {
    const auto op_name = f.operator_name();
    if (!op_name) return false;
    const auto op = c10::Dispatcher::singleton().findOp(*op_name);
    return op && op_name->name.rfind("oomtune::", 0) != 0 &&
           (op->hasKernelForDispatchKey(kKernelKey) ||
            (op->hasComputedKernelForDispatchKey(kKernelKey) &&
             !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)));
  });
}

// Note [cuBLAS calls]
// Rationale: a CUDA run holds bytes no tensor owns: the workspace of each
// cuBLAS handle, which PyTorch 2.11 takes from the caching allocator when
// the handle is first used on a stream and keeps for the life of the
// process (aten/src/ATen/cuda/CublasHandlePool.cpp: getCurrentCUDABlasHandle
// fills cublas_handle_stream_to_workspace, keyed by (handle, stream)).
// Handles are per thread (DeviceThreadHandlePool), and a CUDA backward runs
// on autograd's device thread, so a step whose forward and backward both
// multiply matrices holds two; one whose kernels are all cuDNN's or
// elementwise (embeddings, convolutions without a linear layer) holds none.
// Approach: the operators that reach cuBLAS on CUDA (kCublasOps: the matrix
// products that linear, matmul, einsum and attention's math path decompose
// into) mark the first event of their thread's workspace; the thread is the
// training thread but in backward, whose operators (recomputation
// included) run on autograd's. Operators inside a KernelScratchScope compute
// what the CUDA target computes with kernels of its own (the fused
// attention kernels, which call no cuBLAS) and do not count.
// cuBLASLt, which addmm uses for a matmul with a bias epilogue
// (aten/src/ATen/native/cuda/Blas.cpp, useLtInterface), takes a workspace
// of its own on that thread: +1 MiB at the first linear layer with a bias
// on an H200 with PyTorch 2.11, on top of the 32 MiB cuBLAS workspace
// (scripts/workspace_probe.py, 2026-11-29), though CublasHandlePool.cpp
// reads as if the two were unified. kCublasLtOps mark it the same way.
// Limitations: the set of operators is PyTorch 2.11's CUDA dispatch for
// float types; linalg's solvers (cuSOLVER) and user streams are not
// followed (one stream assumed); an addmm whose bias is not a vector
// (which does not take the cuBLASLt path) is counted as one that does.
const std::unordered_set<std::string_view> kCublasOps = {"aten::mm",   "aten::addmm",      "aten::_addmm_activation",
                                                         "aten::bmm",  "aten::baddbmm",    "aten::addbmm",
                                                         "aten::mv",   "aten::addmv",      "aten::dot",
                                                         "aten::vdot", "aten::_scaled_mm", "aten::_int_mm"};

const std::unordered_set<std::string_view> kCublasLtOps = {"aten::addmm", "aten::_addmm_activation"};

bool in_kernel_scratch_scope() {
  return std::any_of(t_ops.begin(), t_ops.end(),
                     [](const OpFrame& f) { return std::string_view(f.name) == kKernelScratchScopeName; });
}

// Whether `fn` is one of kCublasOps outside a KernelScratchScope.
bool calls_cublas(const at::RecordFunction& fn) {
  const bool cublas =
      per_operator<bool>(fn, [](const at::RecordFunction& f) { return kCublasOps.count(f.name()) > 0; });
  return cublas && !in_kernel_scratch_scope();
}

// Whether `fn` is one of kCublasLtOps outside a KernelScratchScope. A
// lambda of its own: per_operator keeps one answer per name and lambda.
bool calls_cublaslt(const at::RecordFunction& fn) {
  const bool lt = per_operator<bool>(fn, [](const at::RecordFunction& f) { return kCublasLtOps.count(f.name()) > 0; });
  return lt && !in_kernel_scratch_scope();
}

// Note [cuDNN calls]
// Rationale: on CUDA, convolutions and fp32/fp16 batch norms run cuDNN's
// kernels, which take a workspace from the caching allocator for the call
// (and batch norm a reserve space it keeps for backward), sized by cuDNN's
// choice of algorithm on that GPU at run time (Normalization.cpp,
// _select_batch_norm_backend picks cuDNN for fp32 and fp16 inputs). A CPU or
// meta probe cannot see those bytes; what the operators return and what
// autograd saves it counts as CUDA does. A convolution's workspace is not a
// need: aten/src/ATen/native/cudnn/Conv_v8.cpp allocates it after the
// output and, when the allocator raises OutOfMemoryError for it (after
// freeing its cached blocks), tries the next engine the heuristics list, then
// the fallback list (try_configs), and a cached engine's failure sends it
// back to that list. Capped at its budget, a step whose tensors fit runs
// with slower engines instead of running out of memory: simulated on the
// H200's eager steps of ResNet-50 checkpointed (docs/validation.md, "cuDNN's
// workspaces under a cap"), each ran capped at oomtune's predicted reserved
// bytes although it reserved up to 19 % more without a cap.
// Approach: the report names how many such calls the measured step made
// (CudnnCalls), and says that their workspaces are not counted and give way
// under a cap, instead of guessing workspace sizes.
// Limitations: the calls are counted by their ATen entry points
// (aten::convolution, aten::convolution_backward, aten::batch_norm);
// channels-last or depthwise paths that bypass cuDNN on CUDA are counted
// too. Batch norm's workspace and reserve space do not give way (at::empty,
// BatchNorm.cpp); on the H200 each call's extra was at most 1.06 MiB
// (scripts/conv_workspaces.py, 2026-12-04).

// The CudnnCalls counter of `fn`'s operator; nullptr for any other.
int64_t CudnnCalls::*cudnn_counter(const at::RecordFunction& fn) {
  return per_operator<int64_t CudnnCalls::*>(fn, [](const at::RecordFunction& f) -> int64_t CudnnCalls::* {
    const std::string_view n(f.name());
    return n == "aten::convolution"            ? &CudnnCalls::convolutions
           : n == "aten::convolution_backward" ? &CudnnCalls::convolution_backwards
           : n == "aten::batch_norm"           ? &CudnnCalls::batch_norms
                                               : nullptr;
  });
}

// A frame the model's own ops run inside: an autograd node in backward, or an
// operator oomtune registers around a part of the model (the recompute
// operator oomtune::checkpoint, strategies/recompute_op.h), which would
// otherwise be the outermost op of every allocation in a checkpointed block.
bool is_enclosing_frame(const OpFrame& frame) {
  return frame.backward || std::string_view(frame.name).rfind("oomtune::", 0) == 0;
}

// The index in t_ops of the innermost enclosing frame; t_ops.size() when
// there is none.
std::size_t innermost_frame() {
  for (std::size_t i = t_ops.size(); i-- > 0;)
    if (is_enclosing_frame(t_ops[i])) return i;
  return t_ops.size();
}

// An operator's name in a label. Autograd's engine runs each node inside
// "autograd::engine::evaluate_function: NODE" and, after the node's own
// frame has closed, adds its outputs into the next nodes' input buffers:
// what it allocates there is a gradient summed from two paths (a residual
// branch's and the block's) or cast to its input's dtype, named
// "NODE > gradient sum".
std::string operator_label(std::string_view op) {
  if (op.rfind(kAutogradEngineFrame, 0) != 0) return std::string(op);
  return fmt::format("{} > gradient sum", op.substr(kAutogradEngineFrame.size()));
}

// An autograd node's name in a label. oomtune's own autograd functions are
// CppNode<...> to RecordFunction ("torch::autograd::CppNode<oomtune::
// (anonymous namespace)::RecomputeFunction>"): the function's name alone,
// and the checkpoint's backward by what it does.
std::string node_label(std::string_view node) {
  constexpr std::string_view kCppNode = "torch::autograd::CppNode<";
  if (node.rfind(kCppNode, 0) != 0 || node.back() != '>') return operator_label(node);
  node = node.substr(kCppNode.size(), node.size() - kCppNode.size() - 1);
  if (const std::size_t scope = node.rfind("::"); scope != std::string_view::npos) node = node.substr(scope + 2);
  return node == "RecomputeFunction" ? "checkpoint recomputation" : std::string(node);
}

// Where on an operator stack an allocation is made: what its label and its
// event's frame_run and op_call say.
struct OpSite {
  const char* node = nullptr;  // the innermost enclosing frame (innermost_frame); nullptr = none
  const char* op = nullptr;    // the outermost aten op under it (or on the stack, without one); nullptr = none
  uint32_t frame_run = 0;      // node's call; 0 = none
  uint32_t op_call = 0;        // op's call, else node's; 0 outside every op
};

// This thread's OpSite now.
OpSite op_site() {
  const std::size_t frame = innermost_frame();
  const std::size_t first_op = frame < t_ops.size() ? frame + 1 : 0;
  OpSite site;
  if (frame < t_ops.size()) {
    site.node = t_ops[frame].name;
    site.frame_run = t_ops[frame].run;
  }
  site.op_call = site.frame_run;
  if (first_op < t_ops.size()) {
    site.op = t_ops[first_op].name;
    site.op_call = t_ops[first_op].run;
  }
  return site;
}

// "aten::linear" in forward; "MmBackward0 > aten::mm" in backward;
// "oomtune::checkpoint > aten::linear" in a checkpointed block, and
// "checkpoint recomputation > aten::linear" in its backward: the outermost
// aten op under the innermost enclosing frame.
std::string op_label(const OpSite& site) {
  if (!site.op) return site.node ? node_label(site.node) : "(unknown)";
  const std::string op = operator_label(site.op);
  return site.node ? fmt::format("{} > {}", node_label(site.node), op) : op;
}

// Note [OpenMP workers]
// Rationale: a kernel's parallel regions (at::parallel_for) run on OpenMP's
// worker threads too, whose operator stacks are empty: what a worker
// allocated counted as a tensor at once, outside every kernel call, though
// it is that kernel's scratch as much as what the calling thread allocates.
// PyTorch 2.11's CPU attention backward (bf16, on a CPU with AMX) made
// blocks of 4, 22,272 and 26,240 B on its workers and called aten::empty
// there: probing examples/hf_gpt2.toml with the SDPA fixture at micro-batch
// 2, backward's allocated_bytes was 27,816,240 B as the CPU ran,
// 26,218,800 B at DNNL_MAX_CPU_ISA=AVX512_CORE and 25,549,872 B on one
// OpenMP thread (raw_bytes_counted 6,796,032 B in one run and 11,326,720 B
// in another as the CPU ran, 2,003,712 B capped, 0 on one thread), and a
// worker's block at backward's peak would have moved the peak. Now all
// three are 25,549,872 B, raw_bytes_counted 0.
// Approach: each open kernel call is registered (KernelCall: its run, the
// outermost call whose log its blocks wait in, its OpSite, its bytes). A
// thread with no operator of its own open, inside a parallel region
// (at::in_parallel_region()), while exactly one kernel call is open on
// another thread, works for that call: its blocks are the call's, logged
// and labelled as the calling thread's are and scratch when freed before
// the call returns (on whichever thread), and its own operator calls run
// inside the call (no kernel call, log, cuBLAS or cuDNN call of their own);
// they go to the pool the calling thread allocates to (HostMemoryScope).
// Limitations: with kernel calls open on two threads at once (none in a
// trial: the step runs on one thread, and so does a CPU backward) a worker
// cannot tell whose it is, and its blocks count at once, as before; so do
// those of a parallel region opened outside every kernel call.

// A kernel call open on some thread (is_kernel, or a KernelScratchScope).
struct KernelCall {
  uint32_t run = 0;                       // t_kernel_run on its thread
  uint32_t outer_run = 0;                 // the outermost call on its thread, whose log its blocks wait in
  OpSite site;                            // where it was called
  MemoryPool pool = MemoryPool::kDevice;  // the pool its thread allocated to (HostMemoryScope)
  int64_t bytes = 0;                      // device bytes alive that it made (Note [Budget and kernel scratch])
};
std::vector<KernelCall> g_kernel_calls;  // guarded by g_mutex

// The open kernel call `run`; nullptr when it is not open. Under g_mutex.
KernelCall* find_kernel_call(uint32_t run) {
  const auto it =
      std::find_if(g_kernel_calls.begin(), g_kernel_calls.end(), [&](const KernelCall& c) { return c.run == run; });
  return it == g_kernel_calls.end() ? nullptr : &*it;
}

// The kernel call of another thread that this one, an OpenMP worker with no
// operator of its own open, works for (Note [OpenMP workers]); nullptr for
// none. Under g_mutex.
KernelCall* parent_kernel_call() {
  if (t_parent_run != 0) return find_kernel_call(t_parent_run);
  if (!t_ops.empty() || !at::in_parallel_region() || g_kernel_calls.size() != 1) return nullptr;
  return &g_kernel_calls.front();  // not this thread's: its stack is empty
}

// Where this thread's allocations and frees go now.
struct CallContext {
  uint32_t outer_run = 0;         // the outermost call whose log they wait in; 0 = counted at once
  KernelCall* kernel = nullptr;   // the kernel call they are made in; nullptr = none
  bool for_other_thread = false;  // kernel is another thread's (Note [OpenMP workers])
};

// This thread's CallContext. Under g_mutex.
CallContext call_context() {
  if (KernelCall* parent = parent_kernel_call()) return {parent->outer_run, parent, true};
  if (t_ops.empty()) return {};
  return {t_ops.front().run, t_kernel_run != 0 ? find_kernel_call(t_kernel_run) : nullptr, false};
}

// Opens kernel call `run`, the top of this thread's stack, unless one is
// open (then the enclosing call's rule applies); closes it when `run` is
// the open one.
void open_kernel_call(uint32_t run) {
  if (t_kernel_run != 0) return;
  t_kernel_run = run;
  const KernelCall call{run, t_ops.front().run, op_site(), t_pool, 0};
  std::lock_guard<std::mutex> lock(g_mutex);
  g_kernel_calls.push_back(call);
}
void close_kernel_call(uint32_t run) {
  if (t_kernel_run != run) return;
  t_kernel_run = 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_kernel_calls.erase(
      std::remove_if(g_kernel_calls.begin(), g_kernel_calls.end(), [&](const KernelCall& c) { return c.run == run; }),
      g_kernel_calls.end());
}

std::unique_ptr<at::ObserverContext> on_op_enter(const at::RecordFunction& fn) {
  const uint32_t run = g_next_run++;
  if (t_ops.empty() && at::in_parallel_region()) {
    std::lock_guard<std::mutex> lock(g_mutex);
    const KernelCall* parent = parent_kernel_call();
    t_parent_run = parent ? parent->run : 0;
  }
  t_ops.push_back({fn.name(), fn.scope() == at::RecordScope::BACKWARD_FUNCTION, run});
  if (t_parent_run != 0) return nullptr;  // inside another thread's kernel call
  if (calls_cublas(fn)) note_cublas_call(calls_cublaslt(fn));
  if (int64_t CudnnCalls::*counter = cudnn_counter(fn)) note_cudnn_call(counter);
  if (t_kernel_run == 0 && is_kernel(fn)) open_kernel_call(run);
  return nullptr;
}

void on_op_exit(const at::RecordFunction&, at::ObserverContext*) {
  if (t_ops.empty()) return;
  const uint32_t run = t_ops.back().run;
  t_ops.pop_back();
  close_kernel_call(run);
  if (!t_ops.empty()) return;
  if (t_parent_run != 0)
    t_parent_run = 0;  // what it did waits in the parent's log
  else
    settle_outermost_call(run);
}

// A live block the tracker made.
struct Block {
  int64_t bytes = 0;
  MemoryPool pool = MemoryPool::kDevice;
  uint32_t outer_run = 0;   // the outermost operator call it was made in, until that returns; 0 = counted
  uint32_t kernel_run = 0;  // the kernel call it was made in (is_kernel); 0 = none
  std::size_t entry = 0;    // its allocation's index in the outermost call's log
  uint64_t serial = 0;      // its place among the blocks counted (forget_blocks_since)
};

// What happened inside one outermost operator call, in order, counted when
// it returns (Note [Kernel scratch]).
struct PendingEvent {
  TrackedEvent event;    // op and frame_run set for an allocation
  bool scratch = false;  // the allocation is kernel scratch, or this frees one
};

}  // namespace

struct MemoryTracker::State {
  uint32_t generation = 0;
  std::optional<int64_t> budget;
  std::array<int64_t, kNumMemoryPools> live{};  // counted: scratch is not
  std::array<int64_t, kNumMemoryPools> peak{};
  std::array<int64_t, kNumMemoryPools> held{};     // every byte, scratch and uncounted kernel blocks too
  int64_t held_peak = 0;                           // highest held device bytes
  std::array<int64_t, kNumMemoryPools> scratch{};  // scratch live, as counted when its kernels return
  std::array<PhaseMemory, kNumPhases> phases{};
  std::array<bool, kNumPhases> phase_seen{};
  Phase phase = Phase::kLoad;
  bool in_phase = false;
  LargestAllocation largest;
  KernelScratch kernel_scratch;
  std::unordered_map<const void*, Block> blocks;
  uint64_t blocks_counted = 0;
  std::unordered_map<uint32_t, std::vector<PendingEvent>> pending;  // by outermost call, until it returns
  bool record_events = false;
  std::vector<TrackedEvent> events;
  std::vector<std::string> op_names{"(unknown)"};
  std::unordered_map<std::string, uint32_t> op_index;
  int64_t out_of_memory = 0;
  CublasCalls cublas;
  CudnnCalls cudnn;

  uint32_t intern(const std::string& label) {
    auto [it, inserted] = op_index.emplace(label, static_cast<uint32_t>(op_names.size()));
    if (inserted) op_names.push_back(label);
    return it->second;
  }

  PhaseMemory& current() { return phases[static_cast<std::size_t>(phase)]; }

  // Between end_phase() and the next begin_phase() (a step's first copy of
  // its batch, made before its forward) a block counts toward the live and
  // peak bytes but toward no phase and is no phase's largest allocation, as
  // torch.cuda's peaks, reset at each phase's start, leave it out.
  void count_alloc(const TrackedEvent& e) {
    const auto p = static_cast<std::size_t>(e.pool);
    live[p] += e.bytes;
    peak[p] = std::max(peak[p], live[p]);
    PhaseMemory& in = current();
    if (e.pool == MemoryPool::kDevice) {
      if (in_phase) {
        in.peak_bytes = std::max(in.peak_bytes, live[p]);
        ++in.allocations;
        in.allocated_bytes += e.bytes;
        if (e.bytes > largest.bytes) largest = {e.bytes, op_names[e.op], phase};
      }
    } else if (in_phase) {
      in.host_peak_bytes = std::max(in.host_peak_bytes, live[p]);
    }
    if (record_events) events.push_back(e);
  }

  void count_free(const TrackedEvent& e) {
    live[static_cast<std::size_t>(e.pool)] -= e.bytes;
    if (record_events) events.push_back(e);
  }

  void scratch_alloc(const TrackedEvent& e) {
    const auto p = static_cast<std::size_t>(e.pool);
    scratch[p] += e.bytes;
    if (e.pool != MemoryPool::kDevice) return;
    ++kernel_scratch.allocations;
    kernel_scratch.allocated_bytes += e.bytes;
    if (scratch[p] > kernel_scratch.peak_bytes) {
      kernel_scratch.peak_bytes = scratch[p];
      kernel_scratch.op = op_names[e.op];
    }
    current().kernel_scratch_peak_bytes = std::max(current().kernel_scratch_peak_bytes, scratch[p]);
  }

  // An outermost operator call returned: everything it did counts now, in
  // order, but its kernels' scratch, which counts apart.
  void settle(uint32_t run) {
    const auto it = pending.find(run);
    if (it == pending.end()) return;
    for (const PendingEvent& k : it->second) {
      const TrackedEvent& e = k.event;
      const bool alloc = e.kind == TrackedEvent::Kind::kAlloc;
      if (k.scratch) {
        if (alloc)
          scratch_alloc(e);
        else
          scratch[static_cast<std::size_t>(e.pool)] -= e.bytes;
        continue;
      }
      if (alloc) {
        const auto block = blocks.find(reinterpret_cast<const void*>(e.address));
        if (block != blocks.end() && block->second.outer_run == run) block->second.outer_run = 0;  // it lives on
        count_alloc(e);
      } else {
        count_free(e);
      }
    }
    pending.erase(it);
  }
};

void settle_outermost_call(uint32_t run) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_active) g_active->state_->settle(run);
}

void note_cublas_call(bool lt) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_active) return;
  MemoryTracker::State& s = *g_active->state_;
  const bool backward = s.phase == Phase::kBackward;
  std::optional<CublasCall>& first = backward ? s.cublas.autograd_thread : s.cublas.training_thread;
  if (!first) first = CublasCall{s.events.size(), s.phase};
  std::optional<CublasCall>& first_lt = backward ? s.cublas.lt_autograd_thread : s.cublas.lt_training_thread;
  if (lt && !first_lt) first_lt = CublasCall{s.events.size(), s.phase};
}

void note_cudnn_call(int64_t CudnnCalls::*counter) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_active) ++(g_active->state_->cudnn.*counter);
}

// Note [Meta addresses]
// A meta block needs an address: the tracker's block table and the event
// stream (the caching-allocator simulator pairs frees with allocations by
// it) are keyed by address, and storage_bytes() finds a tensor's block by
// its storage's data pointer. Meta storages own no memory, so the counter
// makes up the address: the top bit set (kernel space on x86-64 and
// AArch64, never a CPU block's address), the tracker's generation (a block
// that outlives its tracker is freed without counting, as a CPU block's
// header says), and a serial number in 64-byte steps (the alignment CPU
// blocks have). Nothing dereferences it: meta kernels compute shapes only,
// and copies to or from meta are refused by libtorch ("Cannot copy out of
// meta tensor; no data!").
constexpr uint64_t kMetaAddressBit = uint64_t{1} << 63;
constexpr int kMetaGenerationShift = 44;  // 2^38 blocks per tracker (serial << 6)
constexpr uint64_t kMetaGenerationMask = (uint64_t{1} << 19) - 1;

class MemoryTracker::MetaCounter final : public c10::Allocator {
 public:
  explicit MetaCounter(MemoryTracker& tracker) : tracker_(tracker) {}

  c10::DataPtr allocate(size_t requested) OOMTUNE_ALLOCATE_CONST override {
    const auto bytes = static_cast<int64_t>(requested);
    const MemoryPool pool = tracker_.reserve(bytes, /*meta=*/true);
    const uint64_t generation = tracker_.state_->generation & kMetaGenerationMask;
    void* data = reinterpret_cast<void*>(kMetaAddressBit | (generation << kMetaGenerationShift) | (++serial_ << 6));
    tracker_.record(data, bytes, pool);
    return {data, data, &MetaCounter::delete_block, c10::Device(c10::DeviceType::Meta)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &MetaCounter::delete_raw_block; }
  // Never called with meta data (nothing to copy); present because 2.3+
  // declares it pure.
  OOMTUNE_ALLOCATOR_COPY_DATA

  /// Allocations made so far (the constructor's check that libtorch asks).
  uint64_t allocations() const { return serial_.load(); }

 private:
  static void delete_block(void* data) { free_block(data, /*raw=*/false); }
  static void delete_raw_block(void* data) { free_block(data, /*raw=*/true); }
  static void free_block(void* data, bool raw) {
    if (!data) return;
    const auto address = reinterpret_cast<uint64_t>(data);
    const auto generation = static_cast<uint32_t>((address >> kMetaGenerationShift) & kMetaGenerationMask);
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_active && generation == (g_active_generation & kMetaGenerationMask)) g_active->on_free(data, raw);
  }

  MemoryTracker& tracker_;
  mutable std::atomic<uint64_t> serial_{0};  // allocate() is const in libtorch 1.13
};

MemoryTracker::MemoryTracker(TrackerOptions options) : options_(options), state_(new State) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_active) {
      delete state_;
      throw std::logic_error("MemoryTracker: another tracker is already installed");
    }
    state_->generation = g_next_generation++;
    state_->budget = options_.budget_bytes;
    state_->record_events = options_.record_events;
    previous_ = c10::GetCPUAllocator();
    g_active = this;
    g_active_generation = state_->generation;
    c10::SetCPUAllocator(this, kAllocatorPriority);
    if (options_.count_meta) {
      meta_ = std::make_unique<MetaCounter>(*this);
      previous_meta_ = c10::GetAllocator(c10::DeviceType::Meta);
      c10::SetAllocator(c10::DeviceType::Meta, meta_.get(), kAllocatorPriority);
    }
  }
  if (meta_) {
    // Whether this libtorch makes meta storage with the registered
    // allocator: make one empty meta tensor, then forget it was counted.
    at::empty({0}, at::TensorOptions().device(c10::DeviceType::Meta));
    if (meta_->allocations() == 0) {
      uninstall();
      throw std::logic_error(fmt::format(
          "MemoryTracker: libtorch {} makes meta tensors without c10::GetAllocator(kMeta); nothing can count them",
          compat::torch_version()));
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    auto fresh = std::make_unique<State>();
    fresh->generation = state_->generation;
    fresh->budget = state_->budget;
    fresh->record_events = state_->record_events;
    std::swap(*state_, *fresh);
  }
  if (options_.attribute_ops) {
    callback_ = at::addGlobalCallback(at::RecordFunctionCallback(on_op_enter, on_op_exit)
                                          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  }
}

MemoryTracker::~MemoryTracker() {
  if (callback_) at::removeCallback(*callback_);
  uninstall();
}

void MemoryTracker::uninstall() {
  std::lock_guard<std::mutex> lock(g_mutex);
  c10::SetCPUAllocator(previous_, kAllocatorPriority);
  if (meta_) c10::SetAllocator(c10::DeviceType::Meta, previous_meta_, kAllocatorPriority);
  g_active = nullptr;
  g_active_generation = 0;
  delete state_;
  state_ = nullptr;
}

MemoryPool MemoryTracker::reserve(int64_t bytes, bool meta) const {
  std::lock_guard<std::mutex> lock(g_mutex);
  State& s = *state_;
  const CallContext here = call_context();
  // Counting meta, the meta device is the device and the CPU is the host.
  // Fed the device's blocks by its allocator, every CPU block is host. A
  // worker allocates to its kernel call's pool (Note [OpenMP workers]).
  const MemoryPool pool = (options_.count_meta && !meta) || options_.device_feed ? MemoryPool::kHost
                          : here.for_other_thread                                ? here.kernel->pool
                                                                                 : t_pool;
  const auto p = static_cast<std::size_t>(pool);
  // Inside a kernel call, only the tensors held before it count in full
  // (Note [Budget and kernel scratch]).
  const bool over = [&] {
    if (pool != MemoryPool::kDevice || !s.budget) return false;
    const KernelCall* kernel = here.kernel;
    if (!kernel) return s.held[p] + bytes > *s.budget;
    return s.held[p] - kernel->bytes > *s.budget || s.held[p] + bytes > kKernelScratchAllowance * *s.budget;
  }();
  if (over) {
    ++s.out_of_memory;
    // The same words as the CUDA caching allocator, so users recognise it.
    C10_THROW_ERROR(OutOfMemoryError,
                    fmt::format("oomtune budget: tried to allocate {}; {} of {} budget in use", format_bytes(bytes),
                                format_bytes(s.held[p]), format_bytes(*s.budget)));
  }
  // The kernel call's bytes grow with the held ones, under one lock: added
  // later (in record), an OpenMP worker allocating in between saw the
  // calling thread's block in held and not in the call's bytes, so as held
  // before the call, and ran out of memory with the tensors under the budget
  // (MemoryTracker.TheBudgetLeavesAWorkersScratchOut, 3 runs in 100 under
  // load).
  s.held[p] += bytes;
  if (here.kernel && pool == MemoryPool::kDevice) here.kernel->bytes += bytes;
  if (pool == MemoryPool::kDevice) s.held_peak = std::max(s.held_peak, s.held[p]);
  return pool;
}

c10::DataPtr MemoryTracker::allocate(size_t requested) OOMTUNE_ALLOCATE_CONST {
  const auto bytes = static_cast<int64_t>(requested);
  const MemoryPool pool = reserve(bytes, /*meta=*/false);
  void* base = c10::alloc_cpu(requested + kHeaderBytes);
  auto* header = static_cast<BlockHeader*>(base);
  header->bytes = bytes;
  header->pool = static_cast<int32_t>(pool);
  header->generation = state_->generation;
  void* data = static_cast<char*>(base) + kHeaderBytes;
  record(data, bytes, pool);
  return {data, data, &MemoryTracker::delete_block, c10::Device(c10::DeviceType::CPU)};
}

void MemoryTracker::record(void* data, int64_t bytes, MemoryPool pool) const {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    State& s = *state_;
    const CallContext here = call_context();
    const OpSite site = here.for_other_thread ? here.kernel->site : op_site();
    const TrackedEvent event{
        TrackedEvent::Kind::kAlloc, pool,           s.phase,     reinterpret_cast<uint64_t>(data), bytes,
        s.intern(op_label(site)),   site.frame_run, site.op_call};
    Block block{bytes, pool, 0, here.kernel ? here.kernel->run : 0, 0, ++s.blocks_counted};
    if (here.outer_run != 0) {
      block.outer_run = here.outer_run;
      std::vector<PendingEvent>& log = s.pending[block.outer_run];
      block.entry = log.size();
      log.push_back({event});
    } else {
      s.count_alloc(event);
    }
    s.blocks[data] = block;
  }
}

c10::DeleterFnPtr MemoryTracker::raw_deleter() const { return &MemoryTracker::delete_raw_block; }

void MemoryTracker::delete_block(void* data) { free_block(data, /*raw=*/false); }
void MemoryTracker::delete_raw_block(void* data) { free_block(data, /*raw=*/true); }

void MemoryTracker::free_block(void* data, bool raw) {
  if (!data) return;
  void* base = static_cast<char*>(data) - kHeaderBytes;
  const auto* header = static_cast<const BlockHeader*>(base);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    // A block that outlives its tracker is freed without counting.
    if (g_active && header->generation == g_active_generation) g_active->on_free(data, raw);
  }
  c10::free_cpu(base);
}

void MemoryTracker::on_free(void* data, bool raw) {
  State& s = *state_;
  const auto it = s.blocks.find(data);
  if (it == s.blocks.end()) return;
  const Block block = it->second;
  s.blocks.erase(it);
  s.held[static_cast<std::size_t>(block.pool)] -= block.bytes;
  const TrackedEvent event{
      TrackedEvent::Kind::kFree, block.pool, s.phase, reinterpret_cast<uint64_t>(data), block.bytes, 0, 0};
  // Scratch: not a tensor (raw), or freed inside the kernel call that made
  // it (on whichever thread: Note [OpenMP workers]).
  const CallContext here = call_context();
  const bool in_its_kernel = here.kernel && block.kernel_run == here.kernel->run;
  const bool scratch = raw || in_its_kernel;
  if (in_its_kernel && block.pool == MemoryPool::kDevice) here.kernel->bytes -= block.bytes;
  if (block.outer_run != 0) {
    std::vector<PendingEvent>& log = s.pending.at(block.outer_run);
    log[block.entry].scratch = scratch;
    log.push_back({event, scratch});
    return;
  }
  if (raw) s.kernel_scratch.raw_bytes_counted += block.bytes;
  if (here.outer_run != 0)
    s.pending[here.outer_run].push_back({event});  // counted in order with the call's own
  else
    s.count_free(event);
}

void MemoryTracker::begin_phase(Phase phase) {
  std::lock_guard<std::mutex> lock(g_mutex);
  State& s = *state_;
  const int64_t live = s.live[static_cast<std::size_t>(MemoryPool::kDevice)];
  const int64_t host = s.live[static_cast<std::size_t>(MemoryPool::kHost)];
  if (s.in_phase) s.phases[static_cast<std::size_t>(s.phase)].end_bytes = live;
  s.phase = phase;
  s.in_phase = true;
  PhaseMemory& next = s.phases[static_cast<std::size_t>(phase)];
  if (!s.phase_seen[static_cast<std::size_t>(phase)]) {
    next.start_bytes = live;
    s.phase_seen[static_cast<std::size_t>(phase)] = true;
  }
  next.peak_bytes = std::max(next.peak_bytes, live);
  next.host_peak_bytes = std::max(next.host_peak_bytes, host);
}

void MemoryTracker::end_phase() {
  std::lock_guard<std::mutex> lock(g_mutex);
  State& s = *state_;
  if (s.in_phase)
    s.phases[static_cast<std::size_t>(s.phase)].end_bytes = s.live[static_cast<std::size_t>(MemoryPool::kDevice)];
  s.in_phase = false;
}

void MemoryTracker::reset_statistics() {
  std::lock_guard<std::mutex> lock(g_mutex);
  State& s = *state_;
  s.phases = {};
  s.phase_seen = {};
  s.in_phase = false;
  s.largest = {};
  s.peak = s.live;
  s.kernel_scratch = {};
  s.held_peak = s.held[static_cast<std::size_t>(MemoryPool::kDevice)];
  s.out_of_memory = 0;
  s.cudnn = {};
}

int64_t MemoryTracker::live_bytes(MemoryPool pool) const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_->live[static_cast<std::size_t>(pool)];
}

int64_t MemoryTracker::peak_bytes(MemoryPool pool) const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_->peak[static_cast<std::size_t>(pool)];
}

PhaseMemory MemoryTracker::phase(Phase phase) const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_->phases[static_cast<std::size_t>(phase)];
}

LargestAllocation MemoryTracker::largest() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_->largest;
}

int64_t MemoryTracker::block_bytes(const void* data) const {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = state_->blocks.find(data);
  return it == state_->blocks.end() ? 0 : it->second.bytes;
}

KernelScratch MemoryTracker::kernel_scratch() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  KernelScratch scratch = state_->kernel_scratch;
  scratch.peak_with_scratch_bytes = state_->held_peak;
  return scratch;
}

std::vector<TrackedEvent> MemoryTracker::events() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_->events;
}

CudnnCalls MemoryTracker::cudnn_calls() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_->cudnn;
}

CublasCalls MemoryTracker::cublas_calls() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_->cublas;
}

std::size_t MemoryTracker::event_count() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_->events.size();
}

std::vector<std::string> MemoryTracker::op_names() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_->op_names;
}

int64_t MemoryTracker::out_of_memory_count() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_->out_of_memory;
}

void MemoryTracker::set_budget(std::optional<int64_t> budget_bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  state_->budget = budget_bytes;
}

MemoryTracker::Mark MemoryTracker::mark() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return {state_->blocks_counted, state_->events.size()};
}

int64_t MemoryTracker::forget_blocks_since(const Mark& mark, const std::unordered_set<const void*>& keep) {
  std::lock_guard<std::mutex> lock(g_mutex);
  State& s = *state_;
  int64_t bytes = 0;
  std::unordered_set<uint64_t> forgotten;
  for (auto it = s.blocks.begin(); it != s.blocks.end();) {
    const Block& block = it->second;
    if (block.serial <= mark.blocks || block.outer_run != 0 || keep.count(it->first) != 0) {
      ++it;
      continue;
    }
    const auto p = static_cast<std::size_t>(block.pool);
    s.live[p] -= block.bytes;
    s.held[p] -= block.bytes;
    bytes += block.bytes;
    forgotten.insert(reinterpret_cast<uint64_t>(it->first));
    it = s.blocks.erase(it);
  }
  // Since the mark: a free closes the allocation open at its address
  // (addresses are reused), and both go; what is open at the end is alive,
  // and goes if it was forgotten. A free with nothing open since the mark
  // is a block's from before it, which stays.
  std::vector<bool> drop(s.events.size(), false);
  std::unordered_map<uint64_t, std::size_t> open;  // address -> its allocation's index
  for (std::size_t i = std::min(mark.events, s.events.size()); i < s.events.size(); ++i) {
    const TrackedEvent& e = s.events[i];
    if (e.kind == TrackedEvent::Kind::kAlloc) {
      open[e.address] = i;
    } else if (const auto found = open.find(e.address); found != open.end()) {
      drop[found->second] = drop[i] = true;
      open.erase(found);
    }
  }
  for (const auto& [address, index] : open)
    if (forgotten.count(address) != 0) drop[index] = true;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < s.events.size(); ++i)
    if (!drop[i]) s.events[kept++] = s.events[i];
  s.events.resize(kept);
  return bytes;
}

void MemoryTracker::device_alloc(uint64_t address, int64_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  State& s = *state_;
  constexpr auto kDevice = static_cast<std::size_t>(MemoryPool::kDevice);
  const OpSite site = op_site();
  s.held[kDevice] += bytes;
  s.held_peak = std::max(s.held_peak, s.held[kDevice]);
  s.blocks[reinterpret_cast<const void*>(address)] = Block{bytes, MemoryPool::kDevice, 0, 0, 0, ++s.blocks_counted};
  s.count_alloc({TrackedEvent::Kind::kAlloc, MemoryPool::kDevice, s.phase, address, bytes, s.intern(op_label(site)),
                 site.frame_run, site.op_call});
}

void MemoryTracker::device_free(uint64_t address) {
  std::lock_guard<std::mutex> lock(g_mutex);
  State& s = *state_;
  const auto it = s.blocks.find(reinterpret_cast<const void*>(address));
  if (it == s.blocks.end() || it->second.pool != MemoryPool::kDevice) return;
  const int64_t bytes = it->second.bytes;
  s.blocks.erase(it);
  s.held[static_cast<std::size_t>(MemoryPool::kDevice)] -= bytes;
  s.count_free({TrackedEvent::Kind::kFree, MemoryPool::kDevice, s.phase, address, bytes, 0, 0});
}

HostMemoryScope::HostMemoryScope() : previous_(t_pool) { t_pool = MemoryPool::kHost; }
HostMemoryScope::~HostMemoryScope() { t_pool = previous_; }

MemoryPool current_memory_pool() { return t_pool; }

bool innermost_call_is(std::string_view op, std::string_view caller) {
  const std::size_t n = t_ops.size();
  return n >= 2 && std::string_view(t_ops[n - 1].name) == op &&
         std::string_view(t_ops[n - 2].name).rfind(caller, 0) == 0;
}

// The scope is a kernel call of its own (Note [Kernel scratch]): a frame on
// this thread's operator stack, and the kernel run unless one is already
// open (then the enclosing kernel's rule applies, which also makes what is
// freed inside it scratch).
KernelScratchScope::KernelScratchScope() : run_(g_next_run++) {
  t_ops.push_back({kKernelScratchScopeName, false, run_});
  open_kernel_call(run_);
}

KernelScratchScope::~KernelScratchScope() {
  // Operator frames opened inside have closed: ours is the last.
  if (!t_ops.empty() && t_ops.back().run == run_) t_ops.pop_back();
  close_kernel_call(run_);
  if (t_ops.empty()) settle_outermost_call(run_);
}

}  // namespace oomtune
