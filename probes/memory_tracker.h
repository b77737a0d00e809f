#pragma once
// MemoryTracker, CPU backend: a counting c10::Allocator installed as the CPU
// allocator for its lifetime. It counts live bytes per memory pool, the peak
// and allocation count of each phase of a training step, the largest single
// allocation with the operator that asked for it, and (optionally) every
// allocation and free as an event stream for the caching-allocator simulator.
//
// Rules:
// - Bytes are the bytes requested (c10 adds no rounding on CPU); the tracker's
//   own 64-byte header per block is not counted.
// - Pools: everything is "device" unless allocated inside a HostMemoryScope
//   (the offloaded optimizer's state), so a CPU-only run still tells device
//   bytes from host bytes.
// - With a budget, an allocation that would take live device bytes past it
//   throws c10::OutOfMemoryError, as the CUDA caching allocator does; the
//   caller records it as an out-of-memory result. Inside a kernel call,
//   whose blocks may be scratch, only one past twice the budget throws at
//   once; tensors the call leaves past the budget make the next allocation
//   throw (Note [Budget and kernel scratch] in memory_tracker.cpp).
// - Operator attribution uses an at::RecordFunction callback: the outermost
//   aten op, under the innermost autograd node ("MmBackward0 > aten::mm") or
//   oomtune operator ("oomtune::checkpoint > aten::linear" in a checkpointed
//   block).
// - Kernel scratch (with attribution on): a block that an operator's CPU
//   kernel allocates and frees before it returns is counted apart
//   (KernelScratch), in no peak, phase, largest allocation or event, since
//   its size depends on the CPU and a CUDA run has none of it. Its fate is
//   known when the kernel returns, so a kernel's allocations are counted
//   then, in their order (Note [Kernel scratch] in memory_tracker.cpp).
//   The budget leaves them out too: inside a kernel call it counts in full
//   only the bytes held before the call, and judges what the call leaves
//   behind at the next allocation (Note [Budget and kernel scratch]).
//
// - Meta (TrackerOptions::count_meta, issue #46): the tracker also counts
//   what the meta device allocates, into the same records (one block table,
//   one event stream, the same phases and operator labels). Meta tensors
//   then are the device's memory and every CPU allocation is host memory
//   (the generated batch, CPU scalars); HostMemoryScope still sends meta
//   allocations to the host pool (an offloaded optimizer's state kept on
//   meta). A meta block has no memory behind it: its address is a unique
//   number outside user space that nothing dereferences (meta kernels read
//   shapes, never data).
//
// - Device feed (TrackerOptions::device_feed, CUDA trials, issue #44 item
//   2): the GPU's blocks come from the CUDA caching allocator's trace
//   (probes/cuda_allocator_trace.h), through device_alloc() and
//   device_free(), into the same records; every CPU allocation is then
//   host memory. They count when they happen, in order, with this thread's
//   operator label: on a GPU a kernel's own buffers (cuDNN and cuBLAS
//   workspaces) come from the caching allocator and raise its peak, so
//   nothing of the device is kernel scratch. The budget is the allocator's
//   own cap there (probes/cuda_budget.h), not the tracker's.
//
// Technique (DESIGN.md, checked on libtorch 1.13): DataPtr with data ==
// context (ops using raw_allocate assert it), a raw_deleter, block size kept
// in a header before the returned pointer, and SetCPUAllocator at priority
// 255, which always wins (c10/core/Allocator.cpp compares with >=). The meta
// counter is registered the same way with c10::SetAllocator(DeviceType::Meta,
// ..., 255): PyTorch 2.x's at::detail::empty_meta and empty_strided_meta take
// their storage from c10::GetAllocator(kMeta) (aten/src/ATen/EmptyTensor.cpp);
// 1.13's take a static allocator of their own, so there nothing is counted
// (compat::kMetaDeviceCounted).

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <ATen/record_function.h>
#include <c10/core/Allocator.h>

#include "common/phase.h"
#include "compat/torch_compat.h"
#include "probes/memory_records.h"

namespace oomtune {

/// Options of a MemoryTracker.
struct TrackerOptions {
  std::optional<int64_t> budget_bytes;  // device live-byte limit; nullopt = none
  bool record_events = false;           // keep every alloc/free (for the simulator)
  bool attribute_ops = true;            // RecordFunction callback: op names and kernel scratch
  bool count_meta = false;              // count meta tensors as the device, CPU ones as host (see above)
  bool device_feed = false;             // the device's blocks come from device_alloc/device_free (see above)
};

/// Counting CPU allocator (and, with options.count_meta, meta allocator).
/// Construct to install, destroy to restore the previous allocators. One at
/// a time per process (a second throws std::logic_error). With count_meta,
/// throws std::logic_error when this libtorch makes a meta tensor without
/// asking the registered meta allocator (libtorch 1.13; checked by making
/// one). Thread-safe: intra-op threads allocate too, for the kernel call
/// whose parallel region they run (Note [OpenMP workers] in
/// memory_tracker.cpp).
class MemoryTracker final : public c10::Allocator {
 public:
  explicit MemoryTracker(TrackerOptions options = {});
  ~MemoryTracker() override;
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  /// Ends the current phase and begins `phase`: its peak starts from the
  /// current live bytes.
  void begin_phase(Phase phase);
  /// Ends the current phase (its end_bytes become the current live bytes).
  /// Until the next begin_phase(), blocks count toward live and peak bytes
  /// and the event stream, but toward no phase and not as the largest
  /// allocation.
  void end_phase();
  /// Forgets phase statistics and the largest allocation; live bytes and
  /// recorded events stay (the allocator simulator replays the whole run).
  /// Call between a warm-up step and the measured step.
  void reset_statistics();

  /// Live bytes now in `pool`.
  int64_t live_bytes(MemoryPool pool = MemoryPool::kDevice) const;
  /// Highest live bytes in `pool` since construction or reset_statistics().
  int64_t peak_bytes(MemoryPool pool = MemoryPool::kDevice) const;
  /// Statistics of one phase since the last reset.
  PhaseMemory phase(Phase phase) const;
  /// The largest single allocation since the last reset (bytes, operator, phase).
  LargestAllocation largest() const;
  /// Bytes of the tracked live block at `data`, or 0 if the tracker did not
  /// allocate it (or it was freed).
  int64_t block_bytes(const void* data) const;
  /// CPU kernel scratch since construction or reset_statistics().
  KernelScratch kernel_scratch() const;
  /// Recorded events (empty unless options.record_events).
  std::vector<TrackedEvent> events() const;
  /// How many events are recorded so far: an index into events() that
  /// marks a moment (0 unless options.record_events).
  std::size_t event_count() const;
  /// Operator labels that events refer to by index; [0] is "(unknown)".
  std::vector<std::string> op_names() const;
  /// The first operators that would call cuBLAS on each thread of a CUDA
  /// run, since construction (Note [cuBLAS calls] in memory_tracker.cpp):
  /// kept by reset_statistics(), as a CUDA run keeps its workspaces. Empty
  /// without options.attribute_ops.
  CublasCalls cublas_calls() const;
  /// The convolutions and batch norms since construction or
  /// reset_statistics() (Note [cuDNN calls] in memory_tracker.cpp). Zero
  /// without options.attribute_ops.
  CudnnCalls cudnn_calls() const;
  /// Number of allocations refused for the budget.
  int64_t out_of_memory_count() const;
  /// Changes the budget (nullopt removes it).
  void set_budget(std::optional<int64_t> budget_bytes);

  /// A point in this tracker's counting, for forget_blocks_since().
  struct Mark {
    uint64_t blocks = 0;     // COUNT: blocks counted before it (CPU, meta and fed device blocks)
    std::size_t events = 0;  // COUNT: events recorded before it
  };
  /// Now, as a Mark.
  Mark mark() const;
  /// Forgets what was counted after `mark` but the blocks alive now whose
  /// address (a storage's data pointer) is in `keep`: a block made since
  /// and freed already leaves the event stream, allocation and free; one
  /// still alive leaves the live counts and the event stream, and its free
  /// is ignored, as for a block made before the tracker. Peaks stay. For
  /// what loading a TorchScript file makes that no tensor of the model
  /// holds (Note [Loader records] in trial/trial_runner.cpp). Call between
  /// operators (no call open on this thread). Returns the bytes of the
  /// alive blocks forgotten.
  int64_t forget_blocks_since(const Mark& mark, const std::unordered_set<const void*>& keep);

  /// A device block the caching allocator handed out (its trace's ALLOC):
  /// `bytes` requested (before its 512-byte rounding) at `address`, counted
  /// now in the current phase and labelled with the calling thread's
  /// operator. For options.device_feed; any thread.
  void device_alloc(uint64_t address, int64_t bytes);
  /// That block freed (the trace's FREE_COMPLETED). An address this tracker
  /// did not count (allocated before it) is ignored.
  void device_free(uint64_t address);

  // c10::Allocator
  c10::DataPtr allocate(size_t bytes) OOMTUNE_ALLOCATE_CONST override;
  c10::DeleterFnPtr raw_deleter() const override;
  OOMTUNE_ALLOCATOR_COPY_DATA

 private:
  struct State;
  class MetaCounter;
  friend void settle_outermost_call(uint32_t run);
  friend void note_cublas_call(bool lt);
  friend void note_cudnn_call(int64_t CudnnCalls::*counter);
  // Counts a block of `bytes` at `data`, made on this thread now; throws
  // c10::OutOfMemoryError past the budget (before anything is counted:
  // reserve() first, then record()).
  MemoryPool reserve(int64_t bytes, bool meta) const;
  void record(void* data, int64_t bytes, MemoryPool pool) const;
  // Restores the previous allocators and forgets this tracker.
  void uninstall();
  static void delete_block(void* data);
  static void delete_raw_block(void* data);
  static void free_block(void* data, bool raw);
  void on_free(void* data, bool raw);

  TrackerOptions options_;
  c10::Allocator* previous_ = nullptr;
  c10::Allocator* previous_meta_ = nullptr;
  std::unique_ptr<MetaCounter> meta_;
  std::optional<at::CallbackHandle> callback_;
  State* state_;  // guarded by g_mutex (memory_tracker.cpp), which the allocator's static deleters reach too
};

/// While alive, allocations on this thread, and those of the OpenMP workers
/// of its kernels' parallel regions, count as host memory (the offloaded
/// optimizer's state and update). Nests.
class HostMemoryScope {
 public:
  HostMemoryScope();
  ~HostMemoryScope();
  HostMemoryScope(const HostMemoryScope&) = delete;
  HostMemoryScope& operator=(const HostMemoryScope&) = delete;

 private:
  MemoryPool previous_;
};

/// The pool that allocations on this thread go to now.
MemoryPool current_memory_pool();

/// The RecordFunction frame autograd's engine runs each node in, and then
/// adds the node's outputs into the next nodes' input buffers in, once the
/// node's own frame has closed: this prefix and the node's name
/// (torch/csrc/autograd/engine.cpp, thread_main; input_buffer.cpp).
constexpr std::string_view kAutogradEngineFrame = "autograd::engine::evaluate_function: ";

/// Whether this thread's innermost operator call is `op` (RecordFunction's
/// name, "aten::add") made by the frame just outside it, whose name starts
/// with `caller`: an autograd node's name ("IndexBackward0"), or
/// kAutogradEngineFrame for the engine's own calls (autograd's sum of two
/// gradients of one tensor, input_buffer.cpp accumulate). Known only while
/// a MemoryTracker is alive (its RecordFunction callback keeps the
/// operator stack): false otherwise. Throws nothing.
bool innermost_call_is(std::string_view op, std::string_view caller);

/// The operator label of a KernelScratchScope's frame.
constexpr const char* kKernelScratchScopeName = "oomtune.kernel_scratch";

/// While alive, this thread's allocations, and those of the OpenMP workers
/// of the parallel regions it opens, are those of one kernel call (Notes
/// [Kernel scratch] and [OpenMP workers] in memory_tracker.cpp): a block
/// made and freed inside is kernel scratch, in no peak, phase or event; a block that
/// outlives the scope counts when it ends, as a kernel's output does. For
/// code that computes values on the probe device that the CUDA target
/// computes differently (strategies/attention_op.h: the CPU's attention),
/// whose own bytes are then allocated outside the scope. Nests; scopes end
/// in reverse order of their start. Throws nothing.
class KernelScratchScope {
 public:
  KernelScratchScope();
  ~KernelScratchScope();
  KernelScratchScope(const KernelScratchScope&) = delete;
  KernelScratchScope& operator=(const KernelScratchScope&) = delete;

 private:
  uint32_t run_;
};

}  // namespace oomtune
