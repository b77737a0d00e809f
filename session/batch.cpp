#include "session/batch.h"

#include <unistd.h>

#include <stdexcept>

#include <fmt/format.h>

#include <ATen/ATen.h>

#include "common/byte_size.h"
#include "common/error.h"

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

// Bytes of a tensor of `shape` (the shape's checks keep the product within int64).
int64_t bytes_of(const std::vector<int64_t>& shape, at::ScalarType type) {
  int64_t n = static_cast<int64_t>(c10::elementSize(type));
  for (int64_t d : shape) n *= d;
  return n;
}

// Whether a tensor of `shape` fits in the machine's physical memory.
bool fits_in_memory(const std::vector<int64_t>& shape, at::ScalarType type) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return true;
  return static_cast<double>(bytes_of(shape, type)) <= static_cast<double>(pages) * static_cast<double>(page);
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
    // An input this machine cannot hold is the job's to fix, named here
    // rather than by libtorch's allocator message.
    if (!fits_in_memory(shape, type))
      throw InputError(fmt::format("{}: input '{}' of {} samples needs {}, more than this machine's memory",
                                   job.spec_path.empty() ? "the job" : job.spec_path, input.name, size,
                                   format_bytes(bytes_of(shape, type))));
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
