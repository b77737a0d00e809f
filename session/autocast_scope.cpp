#include "session/autocast_scope.h"

#include "compat/torch_compat.h"
#include "session/cuda_autocast.h"

namespace oomtune {

AutocastScope::AutocastScope(c10::Device device, std::optional<c10::ScalarType> dtype)
    : cuda_(device.is_cuda()), emulated_(!cuda_ && cuda_autocast_available()), active_(dtype.has_value()) {
  if (active_) set(true, *dtype);
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  set(false, at::kBFloat16);
  compat::clear_autocast_cache();
  clear_emulated_cuda_autocast_cache();
}

void AutocastScope::set(bool enabled, c10::ScalarType dtype) const {
  if (cuda_)
    compat::set_cuda_autocast(enabled, enabled ? dtype : at::kHalf);
  else if (emulated_)
    set_emulated_cuda_autocast(enabled, dtype);
  else
    compat::set_cpu_autocast(enabled, dtype);
}

}  // namespace oomtune
