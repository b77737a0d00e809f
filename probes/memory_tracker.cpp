#include "probes/memory_tracker.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "common/byte_size.h"

namespace oomtune {
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

std::mutex g_mutex;                       // guards g_active and every tracker's State
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

std::unique_ptr<at::ObserverContext> on_op_enter(const at::RecordFunction& fn) {
  t_ops.push_back({fn.name(), fn.scope() == at::RecordScope::BACKWARD_FUNCTION, g_next_run++});
  return nullptr;
}

void on_op_exit(const at::RecordFunction&, at::ObserverContext*) {
  if (!t_ops.empty()) t_ops.pop_back();
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

// "aten::linear" in forward; "MmBackward0 > aten::mm" in backward;
// "oomtune::checkpoint > aten::linear" in a checkpointed block: the outermost
// aten op under the innermost enclosing frame, t_ops[frame] (innermost_frame).
std::string op_label(std::size_t frame) {
  const char* node = frame < t_ops.size() ? t_ops[frame].name : nullptr;
  const std::size_t first_op = node ? frame + 1 : 0;
  if (first_op >= t_ops.size()) return node ? node : "(unknown)";
  return node ? fmt::format("{} > {}", node, t_ops[first_op].name) : std::string(t_ops[first_op].name);
}

// The run of the enclosing frame t_ops[frame] (innermost_frame); 0 for none.
uint32_t frame_run(std::size_t frame) { return frame < t_ops.size() ? t_ops[frame].run : 0; }

}  // namespace

struct MemoryTracker::State {
  uint32_t generation = 0;
  std::optional<int64_t> budget;
  std::array<int64_t, kNumMemoryPools> live{};
  std::array<int64_t, kNumMemoryPools> peak{};
  std::array<PhaseMemory, kNumPhases> phases{};
  std::array<bool, kNumPhases> phase_seen{};
  Phase phase = Phase::kLoad;
  bool in_phase = false;
  LargestAllocation largest;
  std::unordered_map<const void*, int64_t> blocks;
  std::vector<TrackedEvent> events;
  std::vector<std::string> op_names{"(unknown)"};
  std::unordered_map<std::string, uint32_t> op_index;
  int64_t out_of_memory = 0;

  uint32_t intern(const std::string& label) {
    auto [it, inserted] = op_index.emplace(label, static_cast<uint32_t>(op_names.size()));
    if (inserted) op_names.push_back(label);
    return it->second;
  }
};

MemoryTracker::MemoryTracker(TrackerOptions options) : options_(options), state_(new State) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_active) {
    delete state_;
    throw std::logic_error("MemoryTracker: another tracker is already installed");
  }
  state_->generation = g_next_generation++;
  state_->budget = options_.budget_bytes;
  previous_ = c10::GetCPUAllocator();
  g_active = this;
  g_active_generation = state_->generation;
  c10::SetCPUAllocator(this, kAllocatorPriority);
  if (options_.attribute_ops) {
    callback_ = at::addGlobalCallback(
        at::RecordFunctionCallback(on_op_enter, on_op_exit)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  }
}

MemoryTracker::~MemoryTracker() {
  if (callback_) at::removeCallback(*callback_);
  std::lock_guard<std::mutex> lock(g_mutex);
  c10::SetCPUAllocator(previous_, kAllocatorPriority);
  g_active = nullptr;
  g_active_generation = 0;
  delete state_;
}

c10::DataPtr MemoryTracker::allocate(size_t requested) OOMTUNE_ALLOCATE_CONST {
  const auto bytes = static_cast<int64_t>(requested);
  const MemoryPool pool = t_pool;
  const auto p = static_cast<std::size_t>(pool);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    State& s = *state_;
    if (pool == MemoryPool::kDevice && s.budget && s.live[p] + bytes > *s.budget) {
      ++s.out_of_memory;
      // The same words as the CUDA caching allocator, so users recognise it.
      C10_THROW_ERROR(OutOfMemoryError,
                      fmt::format("oomtune budget: tried to allocate {}; {} of {} budget in use",
                                  format_bytes(bytes), format_bytes(s.live[p]), format_bytes(*s.budget)));
    }
    s.live[p] += bytes;
    s.peak[p] = std::max(s.peak[p], s.live[p]);
    PhaseMemory& phase = s.phases[static_cast<std::size_t>(s.phase)];
    if (pool == MemoryPool::kDevice) {
      phase.peak_bytes = std::max(phase.peak_bytes, s.live[p]);
      ++phase.allocations;
      phase.allocated_bytes += bytes;
      if (bytes > s.largest.bytes) s.largest = {bytes, op_label(innermost_frame()), s.phase};
    } else {
      phase.host_peak_bytes = std::max(phase.host_peak_bytes, s.live[p]);
    }
  }
  void* base = c10::alloc_cpu(requested + kHeaderBytes);
  auto* header = static_cast<BlockHeader*>(base);
  header->bytes = bytes;
  header->pool = static_cast<int32_t>(pool);
  header->generation = state_->generation;
  void* data = static_cast<char*>(base) + kHeaderBytes;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    state_->blocks.emplace(data, bytes);
    if (options_.record_events) {
      const std::size_t frame = innermost_frame();  // one walk of the op stack for both
      TrackedEvent event{TrackedEvent::Kind::kAlloc, pool, state_->phase, reinterpret_cast<uint64_t>(data),
                         bytes, state_->intern(op_label(frame)), frame_run(frame)};
      state_->events.push_back(event);
    }
  }
  return {data, data, &MemoryTracker::delete_block, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr MemoryTracker::raw_deleter() const { return &MemoryTracker::delete_block; }

void MemoryTracker::delete_block(void* data) {
  if (!data) return;
  void* base = static_cast<char*>(data) - kHeaderBytes;
  const auto* header = static_cast<const BlockHeader*>(base);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    // A block that outlives its tracker is freed without counting.
    if (g_active && header->generation == g_active_generation)
      g_active->on_free(data, header->bytes, static_cast<MemoryPool>(header->pool));
  }
  c10::free_cpu(base);
}

void MemoryTracker::on_free(void* data, int64_t bytes, MemoryPool pool) {
  State& s = *state_;
  s.live[static_cast<std::size_t>(pool)] -= bytes;
  s.blocks.erase(data);
  if (options_.record_events)
    s.events.push_back({TrackedEvent::Kind::kFree, pool, s.phase, reinterpret_cast<uint64_t>(data), bytes, 0, 0});
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
  s.out_of_memory = 0;
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
  return it == state_->blocks.end() ? 0 : it->second;
}

std::vector<TrackedEvent> MemoryTracker::events() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return state_->events;
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

HostMemoryScope::HostMemoryScope() : previous_(t_pool) { t_pool = MemoryPool::kHost; }
HostMemoryScope::~HostMemoryScope() { t_pool = previous_; }

MemoryPool current_memory_pool() { return t_pool; }

}  // namespace oomtune
