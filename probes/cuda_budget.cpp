#include "probes/cuda_budget.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace oomtune {

int64_t allocator_limit_bytes(double fraction, int64_t total_bytes) {
  if (fraction >= 1.0) return total_bytes;  // no limit but the device
  return static_cast<int64_t>(static_cast<std::size_t>(fraction * static_cast<double>(total_bytes)));
}

double allocator_fraction(int64_t budget_bytes, int64_t total_bytes) {
  if (budget_bytes <= 0 || total_bytes <= 0)
    throw std::invalid_argument("allocator_fraction: budget " + std::to_string(budget_bytes) + " B and device " +
                                std::to_string(total_bytes) + " B must both be positive");
  if (budget_bytes >= total_bytes) return 1.0;
  double fraction = static_cast<double>(budget_bytes) / static_cast<double>(total_bytes);
  // The quotient and the allocator's product each round to nearest: the
  // limit lands on the budget or a byte below, or a byte above, which one
  // step down mends.
  while (allocator_limit_bytes(fraction, total_bytes) > budget_bytes) fraction = std::nextafter(fraction, 0.0);
  return fraction;
}

}  // namespace oomtune
