#pragma once
// Plain records of measured memory, shared by the tracker (which fills them)
// and the search and reports (which only read them). No libtorch.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/phase.h"

namespace oomtune {

/// Where a block would live on a GPU machine.
enum class MemoryPool : int { kDevice = 0, kHost, kNumPools };
constexpr std::size_t kNumMemoryPools = static_cast<std::size_t>(MemoryPool::kNumPools);

/// Memory of one phase of a training step (device pool unless named host).
struct PhaseMemory {
  int64_t start_bytes = 0;      // SUM: live device bytes when the phase began
  int64_t peak_bytes = 0;       // SUM: highest live device bytes during the phase
  int64_t end_bytes = 0;        // SUM: live device bytes when the phase ended
  int64_t allocations = 0;      // COUNT: device allocations made in the phase
  int64_t allocated_bytes = 0;  // SUM: bytes of those allocations
  int64_t host_peak_bytes = 0;  // SUM: highest live host-pool bytes during the phase
  // SUM: highest CPU kernel scratch (KernelScratch) live at once during the
  // phase; not in any other field.
  int64_t kernel_scratch_peak_bytes = 0;
  // SUM: highest bytes the CUDA caching allocator held from cudaMalloc
  // during the phase, measured on a GPU (probes/device_phase_meter.h); 0
  // where the CPU measured.
  int64_t reserved_peak_bytes = 0;
};

/// What the CUDA caching allocator reserved and did during a trial's
/// measured steps, read from its own counters on a GPU (c10::
/// CachingDeviceAllocator::DeviceStats), beside what the simulator predicts
/// from the same allocations (ReservedPrediction).
struct MeasuredReserved {
  int64_t peak_reserved_bytes = 0;  // SUM: highest reserved bytes
  int64_t peak_active_bytes = 0;    // SUM: highest bytes in active blocks
  int64_t segment_allocations = 0;  // COUNT: cudaMalloc calls
  int64_t num_alloc_retries = 0;    // COUNT: cudaMalloc failures retried after freeing cached blocks
  int64_t num_ooms = 0;             // COUNT: out-of-memory errors the allocator raised
};

/// Device-pool bytes that CPU kernels allocated for their own use and freed
/// before returning: oneDNN scratchpads and reordered weights, per-thread
/// reduction buffers. How much depends on the CPU's instruction set and the
/// thread count, and a CUDA run has none of it, so it is counted here and
/// nowhere else: not in any peak, event or prediction (probes/
/// memory_tracker.cpp, Note [Kernel scratch]).
struct KernelScratch {
  int64_t peak_bytes = 0;               // SUM: highest scratch live at once
  int64_t allocations = 0;              // COUNT: scratch blocks
  int64_t allocated_bytes = 0;          // SUM: bytes of those blocks
  std::string op;                       // the operator whose scratch reached peak_bytes
  int64_t peak_with_scratch_bytes = 0;  // SUM: highest device-pool bytes with scratch: what the CPU held
  // SUM: bytes freed through c10::Allocator::raw_deallocate (not tensors)
  // but counted as tensors, having been allocated outside any operator
  // call; 0 in every trial measured so far.
  int64_t raw_bytes_counted = 0;
};

/// The largest single allocation seen.
struct LargestAllocation {
  int64_t bytes = 0;  // SUM: bytes requested
  std::string op;     // "aten::mm", "MmBackward0 > aten::mm", or "(unknown)"
  Phase phase = Phase::kLoad;
};

/// The blocks live at the measured step's peak that one operator allocated
/// in one phase (probes/peak_composition.h).
struct PeakShare {
  std::string op;              // the tracker's label: "aten::convolution", "MmBackward0 > aten::mm", "(unknown)"
  Phase phase = Phase::kLoad;  // the phase the operator ran in
  bool earlier_step = false;   // allocated before the measured step: at load, or in the warm-up step
  int64_t bytes = 0;           // SUM: bytes requested
  int64_t blocks = 0;          // COUNT
  bool operator==(const PeakShare& o) const {
    return op == o.op && phase == o.phase && earlier_step == o.earlier_step && bytes == o.bytes && blocks == o.blocks;
  }
};

/// What was live at the measured step's first highest moment, from the
/// recorded events: requested bytes, so on a GPU the allocator's rounding
/// (512 B blocks) is not in them.
struct PeakComposition {
  Phase phase = Phase::kLoad;     // the phase that moment fell in
  int64_t live_bytes = 0;         // SUM: device bytes live then; 0 = not measured
  std::vector<PeakShare> shares;  // every group, largest first
};

/// Backward between two gradients: the highest live device bytes while
/// exactly the gradients made so far existed (memory_model.cpp, Note
/// [Backward by gradients]).
struct GradientLevel {
  int64_t gradient_bytes = 0;  // SUM: gradients this backward had made by then
  int64_t live_bytes = 0;      // SUM: the highest live device bytes among those moments
  // SUM: the same span run as a later micro-batch of an accumulated step,
  // as BackwardActivationPeak::accumulating_bytes: its highest live bytes
  // less the stored gradients.
  int64_t accumulating_bytes = 0;
  bool operator==(const GradientLevel& o) const {
    return gradient_bytes == o.gradient_bytes && live_bytes == o.live_bytes &&
           accumulating_bytes == o.accumulating_bytes;
  }
};

/// Backward's activation peak: the moment of one backward pass when its live
/// device bytes less the parameter gradients it had created so far were
/// highest (activations, their gradients and temporaries at their height).
/// The backward phase's own peak can hide it: at small micro-batches that
/// peak is the end of backward, all gradients created, and grows with
/// nothing; this moment grows with the micro-batch (search/
/// memory_model.cpp, Note [Backward activation peak]).
struct BackwardActivationPeak {
  int64_t live_bytes = 0;      // SUM: live device bytes then; 0 = not measured
  int64_t gradient_bytes = 0;  // SUM: of those, gradients this backward created
  // The same backward as a later micro-batch of an accumulated step would
  // run it: each gradient is added into the stored one once the autograd
  // node that made it has finished, and then freed. Its highest live bytes
  // less the stored gradients (SUM; 0 = not measured).
  int64_t accumulating_bytes = 0;
  // One level per gradient made, the first before any: the whole backward,
  // its peak the largest live_bytes. Its moments do not depend on the
  // micro-batch (the parameters' gradients are made in the same order at
  // every size), so a line per level through probes at two sizes gives
  // backward's peak at a third as the largest of those lines. Empty: not
  // measured.
  std::vector<GradientLevel> by_gradients;
};

/// A step's first operator that needs a cuBLAS handle on one thread of a
/// CUDA run: where, among the tracker's events, it began.
struct CublasCall {
  std::size_t event = 0;  // COUNT: events recorded before it (MemoryTracker::event_count())
  Phase phase = Phase::kLoad;
};

/// The first cuBLAS operator (aten::mm, addmm, bmm, ...) on each thread a
/// CUDA run calls cuBLAS from: each such thread's handle gets a workspace
/// from the caching allocator then and keeps it for the life of the
/// process (probes/memory_tracker.cpp, Note [cuBLAS calls]).
struct CublasCalls {
  std::optional<CublasCall> training_thread;  // forward, loss, optimizer: the thread that runs the step
  std::optional<CublasCall> autograd_thread;  // backward (recomputation too): autograd's device thread
  /// The first cuBLASLt operator (aten::addmm, _addmm_activation: a matmul
  /// with a bias epilogue) on each thread: its handle's cuBLASLt workspace
  /// comes then (Note [cuBLAS calls]).
  std::optional<CublasCall> lt_training_thread;
  std::optional<CublasCall> lt_autograd_thread;
  /// COUNT: the handles, hence the cuBLAS workspaces, a CUDA run holds (0 to 2).
  int handles() const { return (training_thread ? 1 : 0) + (autograd_thread ? 1 : 0); }
  /// COUNT: the cuBLASLt workspaces a CUDA run holds (0 to 2).
  int lt_handles() const { return (lt_training_thread ? 1 : 0) + (lt_autograd_thread ? 1 : 0); }
};

/// Calls of a step's operators that CUDA runs with cuDNN, whose kernels
/// take per-call workspaces (and batch norm a reserve space) that cuDNN
/// sizes on the GPU at run time: a CPU or meta probe counts their outputs
/// and what autograd saves, not those (probes/memory_tracker.cpp, Note
/// [cuDNN calls]). Of the measured step.
struct CudnnCalls {
  int64_t convolutions = 0;           // COUNT: aten::convolution (forward and recomputation)
  int64_t convolution_backwards = 0;  // COUNT: aten::convolution_backward
  int64_t batch_norms = 0;            // COUNT: aten::batch_norm (forward and recomputation)
  bool any() const { return convolutions + convolution_backwards + batch_norms > 0; }
};

/// One allocation or free, in the order they happened.
struct TrackedEvent {
  enum class Kind : uint8_t { kAlloc, kFree };
  Kind kind = Kind::kAlloc;
  MemoryPool pool = MemoryPool::kDevice;
  Phase phase = Phase::kLoad;
  uint64_t address = 0;  // the block's address (an id: alloc and free pair up)
  int64_t bytes = 0;     // SUM: bytes requested
  uint32_t op = 0;       // index into MemoryTracker::op_names() (0 = "(unknown)")
  // Of an allocation: which run of its innermost enclosing frame (an
  // autograd node, an oomtune operator) made it; every run has its own
  // number. 0 = none, or a free.
  uint32_t frame_run = 0;
  // Of an allocation: which call of the operator its label names (the
  // outermost operator under that frame, or the frame itself) made it;
  // allocations of one kernel call share it (allocsim::AllocEvent::call).
  // 0 = none, or a free.
  uint32_t op_call = 0;
};

}  // namespace oomtune
