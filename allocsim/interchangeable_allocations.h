#pragma once
// Allocations that no allocator can tell apart, put in one order.
//
// Requests of one size that one kernel call makes, with no free between
// them, ask the caching allocator for the same thing whichever output each
// one becomes; what tells them apart is which of them is freed first, and
// that follows the order in which the kernel made them, a choice of the
// kernel's. CPU kernels of the same operator differ there:
// native_batch_norm_backward's makes grad_weight and grad_bias before
// grad_input (ATen's native kernel), oneDNN's grad_input first, and a CUDA
// kernel has its own order. Replayed as recorded, the same training step
// then left one 2 MiB segment more on one CPU path than on another
// (ResNet-50, bf16, micro-batch 2: 43 vs 42 cudaMalloc calls). The replay
// takes such a group in the order its members are freed instead: the same
// stream on every path.
//
// Only within one call: the order of two calls is the program's, the same
// on every device. Reordered across calls (an `aten::add` output and the
// next `aten::mul`'s, both 2 MiB, in Hugging Face GPT-2's bf16 forward) the
// H200 allocator's own events of one step replayed to 142 MiB reserved, in
// their real order to 122, and the allocator reserved 124 over the whole
// trial (docs/allocator_simulator.md, "Which allocations are
// interchangeable").

#include <cstddef>
#include <vector>

#include "allocsim/alloc_event.h"

namespace oomtune::allocsim {

/// The order of `events` with interchangeable allocations in the order of
/// their frees, as indices: place i takes events[result[i]] (a permutation
/// of 0..size-1). In each run of consecutive alloc events (no free between
/// them), the allocations of one size and one kernel call (AllocEvent::call,
/// not 0) take the places of that size and call in the order they are freed
/// later in `events`, earliest first; those never freed there keep their
/// relative order after the freed ones. Allocations with call 0 (unknown)
/// and every free keep their places. A free whose id no earlier alloc names
/// (an allocation from before `events`) is left as it is. Also read by
/// find_backward_activation_peak (probes/backward_activation_peak.h), whose
/// levels by gradients made would otherwise follow the kernel's order too.
std::vector<std::size_t> interchangeable_order(const std::vector<AllocEvent>& events);

/// Reorders `events` in place by interchangeable_order. The places keep
/// their `order` values, so each request asks for the same bytes at the
/// same point.
void order_interchangeable_allocations(std::vector<AllocEvent>& events);

}  // namespace oomtune::allocsim
