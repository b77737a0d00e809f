#include "probes/largest_block.h"

#include <stdexcept>

namespace oomtune {

int64_t largest_allocatable(const std::function<bool(int64_t)>& try_allocate, int64_t upper_bytes, int64_t granularity,
                            int64_t* attempts) {
  if (granularity <= 0) throw std::invalid_argument("largest_allocatable: granularity must be positive");
  if (upper_bytes < 0) throw std::invalid_argument("largest_allocatable: upper bound must not be negative");
  int64_t calls = 0;
  auto fits = [&](int64_t units) {
    ++calls;
    return try_allocate(units * granularity);
  };
  // The answer, in units, lies in [low, high]: the bound first (it mostly
  // fits, or mostly does not), then halves.
  int64_t low = 0, high = upper_bytes / granularity;
  if (high > 0) {
    if (fits(high))
      low = high;
    else
      --high;
  }
  while (low < high) {
    const int64_t mid = low + (high - low + 1) / 2;
    if (fits(mid))
      low = mid;
    else
      high = mid - 1;
  }
  if (attempts) *attempts = calls;
  return low * granularity;
}

}  // namespace oomtune
