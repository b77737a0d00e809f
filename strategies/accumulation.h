#pragma once
// Micro-batches with gradient accumulation: how a global batch is split.
//
// Rules:
// - Saves: activation memory scales with the micro-batch, not the global batch.
// - Costs: more, smaller kernels (lower throughput per sample), one optimizer
//   step per global batch as before.
// - Remainder: a global batch the micro-batch does not divide is refused,
//   unless the job sets remainder = "last_smaller": then the last
//   micro-batch holds the rest and every loss is weighted by its share.

#include <cstdint>
#include <string>
#include <vector>

namespace oomtune {

/// One micro-batch of a split: samples [start, start + length).
struct MicroBatchSlice {
  int64_t start = 0;       // COUNT: first sample
  int64_t length = 0;      // COUNT: samples
  double loss_weight = 0;  // length / global: scales a mean-reduced loss
};

/// Splits `global_batch` samples into micro-batches of `micro_batch`
/// (the last may be smaller when `allow_remainder`). Throws ConfigError when
/// micro_batch < 1, micro_batch > global_batch, or the split leaves a
/// remainder that is not allowed.
std::vector<MicroBatchSlice> split_global_batch(int64_t global_batch, int64_t micro_batch, bool allow_remainder);

/// Micro-batches per optimizer step: ceil(global_batch / micro_batch), the
/// last one smaller when micro_batch does not divide global_batch (as
/// split_global_batch with allow_remainder). Requires micro_batch >= 1;
/// no overflow near INT64_MAX.
int64_t micro_batch_count(int64_t global_batch, int64_t micro_batch);

/// The global batches next to `global_batch` that `micro_batch` divides, as
/// a clause: "24 or 32" for 31 and 8 (the multiple below, then the one
/// above; just one when micro_batch divides global_batch). Requires
/// 1 <= micro_batch <= global_batch.
std::string divisible_global_batches(int64_t global_batch, int64_t micro_batch);

}  // namespace oomtune
