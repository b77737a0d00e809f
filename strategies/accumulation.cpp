#include "strategies/accumulation.h"

#include <fmt/format.h>

#include "common/error.h"

namespace oomtune {

std::vector<MicroBatchSlice> split_global_batch(int64_t global_batch, int64_t micro_batch, bool allow_remainder) {
  if (micro_batch < 1) throw ConfigError(fmt::format("micro_batch must be >= 1, got {}", micro_batch));
  if (micro_batch > global_batch)
    throw ConfigError(fmt::format("micro_batch {} is larger than the global batch {}", micro_batch, global_batch));
  if (global_batch % micro_batch != 0 && !allow_remainder)
    throw ConfigError(fmt::format(
        "global batch {} is not a multiple of micro_batch {}; choose a divisor or set remainder = \"last_smaller\"",
        global_batch, micro_batch));
  std::vector<MicroBatchSlice> slices;
  for (int64_t start = 0; start < global_batch; start += micro_batch) {
    const int64_t length = std::min(micro_batch, global_batch - start);
    slices.push_back({start, length, static_cast<double>(length) / static_cast<double>(global_batch)});
  }
  return slices;
}

int64_t micro_batch_count(int64_t global_batch, int64_t micro_batch) {
  return global_batch / micro_batch + (global_batch % micro_batch != 0);
}

std::string divisible_global_batches(int64_t global_batch, int64_t micro_batch) {
  const int64_t below = global_batch / micro_batch * micro_batch;
  const int64_t above = micro_batch_count(global_batch, micro_batch) * micro_batch;
  return below == above ? std::to_string(below) : std::to_string(below) + " or " + std::to_string(above);
}

}  // namespace oomtune
