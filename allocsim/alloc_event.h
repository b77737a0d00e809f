#pragma once
// One allocation event: what the CPU memory tracker records per tensor
// allocation or free, and what the caching-allocator simulator replays
// (allocsim/caching_allocator_sim.h). A snapshot trace converts to the same
// record (scripts/snapshot_to_events.py, allocsim/allocsim_trace.h).

#include <cstdint>
#include <string>

#include "common/phase.h"

namespace oomtune::allocsim {

/// Whether an event asks for memory or gives it back.
enum class AllocEventKind : std::uint8_t {
  kAlloc,  ///< a request of `bytes` (c10 Allocator::allocate)
  kFree,   ///< the allocation named by `id` is freed (PyTorch's free_completed)
};

/// One allocation or free, in program order.
struct AllocEvent {
  AllocEventKind kind = AllocEventKind::kAlloc;
  /// Names the allocation: a free carries the id of its alloc. Any value that
  /// is unique among live allocations works: the data pointer (CPU tracker),
  /// the device address (snapshot trace) or a counter.
  std::uint64_t id = 0;
  /// Bytes requested, before any rounding (alloc). For a free: the requested
  /// bytes of the allocation if known, else 0; the simulator does not need it.
  int64_t bytes = 0;
  /// Position in the program's event order (monotone; gaps allowed).
  int64_t order = 0;
  /// Phase of the training step the event happened in.
  Phase phase = Phase::kLoad;
  /// Operator that made the request ("aten::mm"), or empty when unknown.
  std::string op;
  /// Which call of an operator made the request: equal for the allocations
  /// of one kernel call, different for two calls (of one operator or two),
  /// 0 when unknown. order_interchangeable_allocations reads it.
  std::uint64_t call = 0;
};

/// An alloc event (convenience for tests and generators).
inline AllocEvent alloc_event(std::uint64_t id, int64_t bytes, int64_t order = 0, Phase phase = Phase::kLoad) {
  AllocEvent event;
  event.kind = AllocEventKind::kAlloc;
  event.id = id;
  event.bytes = bytes;
  event.order = order;
  event.phase = phase;
  return event;
}

/// A free event for allocation `id`.
inline AllocEvent free_event(std::uint64_t id, int64_t order = 0, Phase phase = Phase::kLoad) {
  AllocEvent event;
  event.kind = AllocEventKind::kFree;
  event.id = id;
  event.order = order;
  event.phase = phase;
  return event;
}

}  // namespace oomtune::allocsim
