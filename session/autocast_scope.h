#pragma once
// Autocast over a training step's forward and loss, as eager PyTorch's
// `with torch.autocast(device, dtype):` around both (torch.amp's recipe).
//
// Rules:
// - On a CUDA device, CUDA's autocast. On the CPU and on meta, CUDA's
//   autocast emulated (session/cuda_autocast.h), since oomtune answers for
//   eager CUDA training; on a libtorch without CUDA's lists (1.13), the
//   CPU's own autocast.
// - On leaving, autocast is off and both cast caches are cleared, as
//   torch.autocast's __exit__ does at nesting level 0: the cache holds the
//   weights' lower-precision copies, which a checkpointed model holds by no
//   other reference.
// - One scope at a time per thread: leaving turns autocast off rather than
//   restoring an outer scope's state.

#include <optional>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace oomtune {

/// Autocast on for `device`'s kind, casting to `dtype` (bf16 or fp16), while
/// alive; nothing when `dtype` is nullopt. Throws nothing of its own.
class AutocastScope {
 public:
  AutocastScope(c10::Device device, std::optional<c10::ScalarType> dtype);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  void set(bool enabled, c10::ScalarType dtype) const;

  bool cuda_, emulated_, active_;
};

}  // namespace oomtune
