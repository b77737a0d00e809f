#include "strategies/dropout_op.h"

#include <mutex>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <torch/library.h>

namespace oomtune {
namespace {

std::mutex g_dropout_mutex;
DropoutRecord g_dropout_record;  // guarded by g_dropout_mutex

at::Tensor dropout(const at::Tensor& input, double p, bool train) {
  // aten::dropout's condition for the fused kernel on CUDA, the device aside.
  if (!train || p <= 0 || p >= 1 || input.numel() == 0 || input.is_nested()) return at::dropout(input, p, train);
  {
    std::lock_guard<std::mutex> lock(g_dropout_mutex);
    ++g_dropout_record.calls;
    if (at::GradMode::is_enabled() && input.requires_grad()) {
      g_dropout_record.kept_bytes += input.numel();  // the bool mask
      g_dropout_record.composite_kept_bytes += input.numel() * static_cast<int64_t>(input.element_size());
    }
  }
  return std::get<0>(at::native_dropout(input, p, train));
}

TORCH_LIBRARY_FRAGMENT(oomtune, m) {
  m.def("dropout(Tensor input, float p, bool train) -> Tensor");
  m.impl("dropout", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(dropout));
}

}  // namespace

void ensure_dropout_op_registered() {}

DropoutRecord take_dropout_record() {
  std::lock_guard<std::mutex> lock(g_dropout_mutex);
  return std::exchange(g_dropout_record, DropoutRecord{});
}

}  // namespace oomtune
