#pragma once
// Batch: the named tensors of one (micro-)batch, made from the job's inputs.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "job/job_spec.h"

namespace oomtune {

/// Named tensors sharing one batch size. Shapes follow the InputSpecs with
/// the "batch" dimension set to `size`.
struct Batch {
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  std::vector<std::size_t> batch_axes;  // the batch dimension of each tensor
  int64_t size = 0;                     // COUNT: samples

  /// The tensor named `name`; throws std::out_of_range if absent.
  const at::Tensor& get(const std::string& name) const;
  /// Samples [start, start + length) of every tensor (views, no copy).
  Batch slice(int64_t start, int64_t length) const;
};

/// Makes a batch of `size` samples for `job`'s inputs (each "seq" dimension
/// job.seq_len tokens long), deterministically
/// from `seed`: integer inputs uniform in [low, high), float inputs normal(0,
/// 1) (or uniform in [low, high) when a range is given). CPU tensors.
Batch make_batch(const JobSpec& job, int64_t size, uint64_t seed);

}  // namespace oomtune
