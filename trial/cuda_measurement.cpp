#include "trial/cuda_measurement.h"

#ifdef OOMTUNE_WITH_CUDA
#include <algorithm>
#include <filesystem>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <torch/csrc/cuda/memory_snapshot.h>

#include "common/atomic_file.h"
#include "common/byte_size.h"
#include "probes/cuda_allocator_trace.h"
#include "probes/cuda_budget.h"
#include "probes/cuda_stats_source.h"
#include "probes/device_phase_meter.h"
#endif

namespace oomtune {

#ifdef OOMTUNE_WITH_CUDA
namespace {

class CudaMeasurementImpl final : public CudaMeasurement {
 public:
  CudaMeasurementImpl(MemoryTracker& tracker, int device, int64_t cap_bytes, bool marks)
      : cap_bytes_(cap_bytes), marks_(marks), source_(device), feed_(tracker, device), meter_(source_) {}

  void begin_phase(Phase phase) override {
    close_mark();
    meter_.begin_phase(phase);
    if (!marks_) return;
    marked_ = std::string("oomtune:") + std::string(phase_name(phase));
    c10::cuda::CUDACachingAllocator::recordAnnotation({{"name", marked_}, {"stage", "START"}});
  }
  void end_phase() override {
    close_mark();
    meter_.end_phase();
  }
  void reset_statistics() override { meter_.reset_statistics(); }
  PhaseMemory phase(Phase phase) const override { return meter_.phase(phase); }
  int64_t peak_bytes() const override { return meter_.peak_bytes(); }
  MeasuredReserved measured_reserved() const override { return meter_.measured_reserved(); }

  std::string allocator_state() override {
    const DeviceStatsSample now = source_.read();
    std::string text = fmt::format("allocator: allocated {}, reserved {}", format_bytes(now.allocated_bytes),
                                   format_bytes(now.reserved_bytes));
    if (cap_bytes_ > 0) text += fmt::format(" (cap {})", format_bytes(cap_bytes_));
    const int64_t free = feed_.oom_free_bytes();
    if (free >= 0) text += fmt::format(", device free {}", format_bytes(free));
    return text;
  }

  int64_t pinned_host_bytes() override { return at::getHostAllocator(at::kCUDA)->get_stats().active_bytes.current; }

  void write_snapshot(const std::string& path) override {
    close_mark();
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    write_file_atomically(path, torch::cuda::_memory_snapshot_pickled());
  }

  AllocatableRecord allocatable(int64_t bound_bytes) override {
    constexpr int64_t kGranularity = int64_t{2} << 20;  // kLargeBuffer, c10/cuda/CUDACachingAllocator.cpp
    AllocatableRecord a;
    size_t free = 0, total = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    a.device_free_bytes = static_cast<int64_t>(free);
    a.device_total_bytes = static_cast<int64_t>(total);
    const auto try_allocate = [](int64_t bytes) {
      try {
        at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
        return true;
      } catch (const c10::OutOfMemoryError&) {
        return false;
      }
    };
    a.bound_bytes = std::min(bound_bytes, cap_bytes_ > 0 ? cap_bytes_ : a.device_total_bytes);
    a.largest_block_bytes = largest_allocatable(try_allocate, a.bound_bytes, kGranularity, &a.attempts);
    c10::cuda::CUDACachingAllocator::emptyCache();  // the tries' segments go back to the device
    return a;
  }

 private:
  // The END of the phase marked last, if still open.
  void close_mark() {
    if (marked_.empty()) return;
    c10::cuda::CUDACachingAllocator::recordAnnotation({{"name", marked_}, {"stage", "END"}});
    marked_.clear();
  }

  int64_t cap_bytes_;   // the allocator's limit (bytes); 0 = none
  bool marks_;          // phases marked in the recorded history
  std::string marked_;  // the open mark's name ("" = none)
  CudaStatsSource source_;
  CudaTraceFeed feed_;
  DevicePhaseMeter meter_;
};

}  // namespace

std::unique_ptr<CudaMeasurement> CudaMeasurement::start(MemoryTracker& tracker, std::optional<int64_t> budget_bytes,
                                                        bool record_history) {
  at::globalContext().lazyInitDevice(at::kCUDA);
  // Events with their TorchScript frames (stacks "python": no Python here,
  // so the script frames alone; C++ frames would cost a symbolization per
  // stack), 100,000 at most (a ring buffer).
  constexpr size_t kMaxEntries = 100000;
  if (record_history)
    torch::cuda::_record_memory_history(std::optional<std::string>("all"), std::optional<std::string>("all"), "python",
                                        kMaxEntries);
  const c10::DeviceIndex device = c10::cuda::current_device();
  int64_t cap = 0;
  if (budget_bytes) {
    cudaDeviceProp properties{};
    C10_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    const auto total = static_cast<int64_t>(properties.totalGlobalMem);
    const double fraction = allocator_fraction(*budget_bytes, total);
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device);
    cap = allocator_limit_bytes(fraction, total);
  }
  return std::make_unique<CudaMeasurementImpl>(tracker, device, cap, record_history);
}
#else
std::unique_ptr<CudaMeasurement> CudaMeasurement::start(MemoryTracker&, std::optional<int64_t>, bool) {
  return nullptr;
}
#endif

}  // namespace oomtune
