#pragma once
// The budget on a GPU is the caching allocator's own limit (issue #44,
// item 3): each trial process caps it with
// c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device), and
// a request past the cap raises c10::OutOfMemoryError as a full GPU would.
// In PyTorch 2.11 (c10/cuda/CUDACachingAllocator.cpp,
// DeviceCachingAllocator::setMemoryFraction and alloc_block): the fraction
// must be in [0, 1]; below 1 the limit is
// static_cast<size_t>(fraction * static_cast<double>(totalGlobalMem)), 1
// means none; and the limit caps *reserved* bytes (a new segment is refused
// when reserved + its size would pass it), so a budget on a GPU is compared
// with measured reserved bytes. The fraction is chosen for that product
// never to pass the budget.

#include <cstdint>

namespace oomtune {

/// The limit in bytes the caching allocator sets for `fraction` of a device
/// of `total_bytes` (cudaDeviceProp::totalGlobalMem): floor(fraction *
/// total); the whole device for 1 and above.
int64_t allocator_limit_bytes(double fraction, int64_t total_bytes);

/// A fraction f in (0, 1) whose allocator_limit_bytes(f, total) is the
/// budget or one byte below it (budgets under 2^52 bytes); 1 when the
/// budget is the whole device or more. Throws std::invalid_argument when
/// either is not positive.
double allocator_fraction(int64_t budget_bytes, int64_t total_bytes);

}  // namespace oomtune
