#include "session/batch.h"

#include <stdexcept>

#include <ATen/ATen.h>

namespace oomtune {
namespace {

at::ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "float32") return at::kFloat;
  if (dtype == "float16") return at::kHalf;
  if (dtype == "bfloat16") return at::kBFloat16;
  if (dtype == "float64") return at::kDouble;
  if (dtype == "int64") return at::kLong;
  if (dtype == "int32") return at::kInt;
  return at::kBool;
}

}  // namespace

const at::Tensor& Batch::get(const std::string& name) const {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return tensors[i];
  throw std::out_of_range("Batch: no tensor named " + name);
}

Batch Batch::slice(int64_t start, int64_t length) const {
  Batch out;
  out.names = names;
  out.batch_axes = batch_axes;
  out.size = length;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    out.tensors.push_back(tensors[i].narrow(static_cast<int64_t>(batch_axes[i]), start, length));
  return out;
}

Batch make_batch(const JobSpec& job, int64_t size, uint64_t seed) {
  auto generator = at::detail::createCPUGenerator(seed);
  Batch batch;
  batch.size = size;
  for (const InputSpec& input : job.inputs) {
    std::vector<int64_t> shape = input.shape;
    for (int64_t& dim : shape)
      if (dim == kBatchDim)
        dim = size;
      else if (dim == kSeqDim)
        dim = job.seq_len.value_or(1);
    const at::ScalarType type = scalar_type(input.dtype);
    at::Tensor tensor;
    if (at::isIntegralType(type, /*includeBool=*/true)) {
      const auto low = static_cast<int64_t>(input.low.value_or(0));
      const auto high = static_cast<int64_t>(input.high.value_or(2));
      tensor = at::randint(low, high, shape, generator, at::TensorOptions().dtype(type));
    } else if (input.low && input.high) {
      tensor = at::empty(shape, at::kFloat).uniform_(*input.low, *input.high, generator).to(type);
    } else {
      tensor = at::randn(shape, generator, at::TensorOptions().dtype(at::kFloat)).to(type);
    }
    batch.names.push_back(input.name);
    batch.tensors.push_back(std::move(tensor));
    batch.batch_axes.push_back(input.batch_axis());
  }
  return batch;
}

}  // namespace oomtune
