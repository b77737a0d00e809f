#pragma once
// The one place where libtorch 1.13 (Debian) and libtorch 2.x (PyTorch 2.11
// on the GPU machine) differ for oomtune. Everything else includes this
// header instead of testing TORCH_VERSION_* itself.
//
// Differences handled here (checked against the headers of both versions):
// - c10::Allocator gained a pure virtual copy_data() and lost the const on
//   allocate() in PyTorch 2.3 (c10/core/Allocator.h):
//   OOMTUNE_ALLOCATOR_COPY_DATA declares the former, OOMTUNE_ALLOCATE_CONST
//   spells the latter.
// - Autocast switches: 1.13 has at::autocast::set_cpu_enabled /
//   set_autocast_cpu_dtype (and is_*/get_* for CPU and CUDA); 2.x has
//   set_autocast_enabled(device_type, bool) / set_autocast_dtype(device_type,
//   dtype) / is_autocast_enabled / get_autocast_dtype (ATen/autocast_mode.h,
//   2.4+). In both, autocast is on while its dispatch key is *not* in the
//   thread's excluded set.
// - The meta device (issue #46): 2.x's at::detail::empty_meta takes storage
//   from c10::GetAllocator(kMeta), so a registered allocator can count meta
//   tensors; 1.13's takes a static allocator of its own and has no meta
//   kernel for aten::embedding (aten/src/ATen/native/MetaTensor.cpp, 1.13).
// - Optimizer state keys: 1.13 keys param state by the string of the
//   TensorImpl pointer, 2.x by the void* itself (torch/optim/optimizer.h).
// - Optimizer kernels (strategies/eager_adamw.h): 1.13 has no
//   aten::_foreach_lerp_ and no aten::_fused_adamw_ (its _fused_adam_ is
//   Adam's, CUDA only) and no aten::_fused_sgd_; 2.x has all three,
//   _fused_adamw_ and _fused_sgd_ with CPU and CUDA kernels and none for
//   meta (ATen/ops/_fused_adamw_*_dispatch.h, _fused_sgd_*_dispatch.h, 2.11).

#include <cstring>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <ATen/Functions.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 3)
#define OOMTUNE_TORCH_HAS_COPY_DATA 1
#else
#define OOMTUNE_TORCH_HAS_COPY_DATA 0
#endif

/// at::_grouped_mm (the grouped matmul of mixture-of-experts layers,
/// transformers' default experts implementation) exists from PyTorch 2.8 on.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
#define OOMTUNE_TORCH_HAS_GROUPED_MM 1
#else
#define OOMTUNE_TORCH_HAS_GROUPED_MM 0
#endif

#if OOMTUNE_TORCH_HAS_COPY_DATA
/// Declares c10::Allocator::copy_data in a custom allocator (pure in 2.3+).
#define OOMTUNE_ALLOCATOR_COPY_DATA \
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
/// allocate() is `DataPtr allocate(size_t)` (non-const) from 2.3 on.
#define OOMTUNE_ALLOCATE_CONST
#else
#define OOMTUNE_ALLOCATOR_COPY_DATA
#define OOMTUNE_ALLOCATE_CONST const
#endif

namespace oomtune::compat {

/// "1.13.1" or "2.11.0": the libtorch oomtune was compiled against.
inline const char* torch_version() { return TORCH_VERSION; }

/// Major and minor version of the libtorch compiled against.
constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
constexpr int kTorchMinor = TORCH_VERSION_MINOR;

/// True when the libtorch compiled against has CUDA (OOMTUNE_WITH_CUDA, set
/// by CMakeLists.txt from the CAFFE2_USE_CUDA of Torch's CMake config).
constexpr bool cuda_compiled() {
#if defined(OOMTUNE_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

/// Whether meta tensors can be counted (see the header comment): PyTorch 2
/// and newer; the meta trials are tested with 2.11.
constexpr bool kMetaDeviceCounted = TORCH_VERSION_MAJOR >= 2;

/// Whether a torch::autograd::Function's backward is handed the engine's own
/// references to its incoming gradients, so that dropping them frees them:
/// 2.11's CppNode_apply_functional moves them into the list it passes to
/// T::backward (torch/csrc/autograd/custom_function.h); 1.13's
/// CppNode<T>::apply copies them and its argument keeps them to the end of
/// backward. Checked in those two versions.
constexpr bool kCustomFunctionGetsItsGradients = TORCH_VERSION_MAJOR >= 2;

/// Why device = "meta" cannot run with this libtorch, as the end of one line
/// after the job's name; "" where it can.
inline std::string meta_device_problem() {
  if (kMetaDeviceCounted) return "";
  return std::string(
             "device = \"meta\" needs libtorch 2 or newer (tested with 2.11), this oomtune is built against "
             "libtorch ") +
         TORCH_VERSION +
         ", whose meta tensors bypass the allocator oomtune counts with and which has no meta kernel for "
         "aten::embedding; build it against PyTorch 2 (OOMTUNE_TORCH=pypi ./setup.sh, then build-pypi/oomtune)";
}

/// Turns CPU autocast on or off with the given lower-precision dtype.
inline void set_cpu_autocast(bool enabled, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4)
  at::autocast::set_autocast_enabled(at::kCPU, enabled);
  at::autocast::set_autocast_dtype(at::kCPU, dtype);
#else
  at::autocast::set_cpu_enabled(enabled);
  at::autocast::set_autocast_cpu_dtype(dtype);
#endif
}

/// Whether CPU autocast is on.
inline bool cpu_autocast_enabled() {
#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4)
  return at::autocast::is_autocast_enabled(at::kCPU);
#else
  return at::autocast::is_cpu_enabled();
#endif
}

/// The dtype CPU autocast casts to (bf16 unless set).
inline at::ScalarType cpu_autocast_dtype() {
#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4)
  return at::autocast::get_autocast_dtype(at::kCPU);
#else
  return at::autocast::get_autocast_cpu_dtype();
#endif
}

/// Whether CUDA autocast is on (false on a CPU-only build: nothing sets it).
inline bool cuda_autocast_enabled() {
#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4)
  return at::autocast::is_autocast_enabled(at::kCUDA);
#else
  return at::autocast::is_enabled();
#endif
}

/// The dtype CUDA autocast casts to (fp16 unless set).
inline at::ScalarType cuda_autocast_dtype() {
#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4)
  return at::autocast::get_autocast_dtype(at::kCUDA);
#else
  return at::autocast::get_autocast_gpu_dtype();
#endif
}

/// Turns CUDA autocast on or off with the given dtype (CUDA builds only).
inline void set_cuda_autocast(bool enabled, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4)
  at::autocast::set_autocast_enabled(at::kCUDA, enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
  at::autocast::set_enabled(enabled);
  at::autocast::set_autocast_gpu_dtype(dtype);
#endif
}

/// Drops autocast's cast cache (call after each autocast region).
inline void clear_autocast_cache() { at::autocast::clear_cache(); }

/// The key of torch::optim::Optimizer::state() (per-parameter state). Its
/// type differs between libtorch versions: 1.13 keys by std::string
/// (c10::guts::to_string of the TensorImpl pointer, i.e. `ostream <<
/// pointer`), 2.x by the TensorImpl pointer as void* (torch/optim/
/// optimizer.h). The key type is read off the map itself, so no version
/// macro is needed.
using OptimizerStateKey = typename std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

/// The state() key of parameter `p`. (A template, so that the branch of
/// the other version is discarded, not compiled.)
template <typename Key = OptimizerStateKey>
Key optimizer_state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << p.unsafeGetTensorImpl();
    return out.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

/// at::_foreach_lerp_(self, ends, weight): self[i] += weight * (ends[i] -
/// self[i]) in place, no allocation. On 1.13 (no foreach lerp) the same
/// in-place lerp_ one tensor at a time, which is what the foreach op's CPU
/// kernel does (foreach_tensor_lerp_list_kernel_slow_).
inline void foreach_lerp_(at::TensorList self, at::TensorList ends, double weight) {
#if TORCH_VERSION_MAJOR >= 2
  at::_foreach_lerp_(self, ends, weight);
#else
  for (std::size_t i = 0; i < self.size(); ++i) self[i].lerp_(ends[i], weight);
#endif
}

/// at::_foreach_mul_(self, factor): self[i] *= factor, `factor` a [] tensor
/// read on the device, in place, no allocation (the overload clip_grad_norm_
/// calls, PyTorch 2.1 and later). Before 2.1 the same in-place mul_ one
/// tensor at a time, as the op's CPU kernel does
/// (foreach_tensor_mul_tensor_kernel_slow_).
inline void foreach_mul_(at::TensorList self, const at::Tensor& factor) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  at::_foreach_mul_(self, factor);
#else
  for (const at::Tensor& t : self) t.mul_(factor);
#endif
}

/// Whether this libtorch registers operator `op` ("aten::NAME", overload
/// "") with a kernel for `key`; false for an operator it lacks.
inline bool has_kernel(const char* op, c10::DispatchKey key) {
  const auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
  return handle && handle->hasKernelForDispatchKey(key);
}

/// Whether this libtorch has kernels of GradScaler's operators
/// (aten::_amp_foreach_non_finite_check_and_unscale_, aten::_amp_update_scale_)
/// for the CPU: PyTorch 2.x does; libtorch 1.13 has CUDA ones only, so fp16
/// with dynamic loss scaling runs on the CPU with PyTorch 2 only.
inline bool has_cpu_grad_scaler_kernels() {
  return has_kernel("aten::_amp_foreach_non_finite_check_and_unscale_", c10::DispatchKey::CPU) &&
         has_kernel("aten::_amp_update_scale_", c10::DispatchKey::CPU);
}

/// Whether this libtorch has a kernel of operator `op` for tensors on
/// `device`: CPU and CUDA only (false for meta and others).
inline bool has_device_kernel(const char* op, const c10::Device& device) {
  if (device.is_cpu()) return has_kernel(op, c10::DispatchKey::CPU);
  if (device.is_cuda()) return has_kernel(op, c10::DispatchKey::CUDA);
  return false;
}

/// Whether this libtorch has a kernel of aten::_fused_adamw_ for tensors on
/// `device` (2.x: CPU and CUDA; never on 1.13, which lacks the operator).
inline bool has_fused_adamw_kernel(const c10::Device& device) {
  return has_device_kernel("aten::_fused_adamw_", device);
}

/// Whether this libtorch has a kernel of aten::_fused_sgd_ for tensors on
/// `device` (2.x: CPU and CUDA; never on 1.13, which lacks the operator).
inline bool has_fused_sgd_kernel(const c10::Device& device) { return has_device_kernel("aten::_fused_sgd_", device); }

/// `t` as an optional argument of an ATen operator: nullopt when undefined.
inline std::optional<at::Tensor> optional_tensor(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

/// Runs at::_fused_sgd_ (not maximize) over one device's and dtype's lists:
/// parameters and momentum buffers (empty without momentum) updated in
/// place; `is_first_step` copies the gradient into each buffer instead of
/// reading it. `grad_scale` and `found_inf` as for fused_adamw_ below. Call
/// only where has_fused_sgd_kernel(device) is true; on 1.13 it throws
/// std::logic_error.
inline void fused_sgd_(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                       double weight_decay, double momentum, double lr, double dampening, bool nesterov,
                       bool is_first_step, const at::Tensor& grad_scale = {}, const at::Tensor& found_inf = {}) {
#if TORCH_VERSION_MAJOR >= 2
  at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr, dampening, nesterov,
                  /*maximize=*/false, is_first_step, optional_tensor(grad_scale), optional_tensor(found_inf));
#else
  (void)params, (void)grads, (void)momentum_buffers, (void)weight_decay, (void)momentum, (void)lr, (void)dampening,
      (void)nesterov, (void)is_first_step, (void)grad_scale, (void)found_inf;
  throw std::logic_error("aten::_fused_sgd_ needs libtorch 2");
#endif
}

/// Runs at::_fused_adamw_ (AdamW, not amsgrad, not maximize) over one
/// device's and dtype's lists: every tensor updated in place, `steps` the
/// one-element float32 step counts after their increment. With
/// `grad_scale` defined the kernel divides each gradient by it and writes
/// it back unscaled; with `found_inf` set it updates nothing (GradScaler's
/// fused path, strategies/optimizer_step.h AmpScaledStep). Call only where
/// has_fused_adamw_kernel(device) is true; on 1.13 it throws
/// std::logic_error.
inline void fused_adamw_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                         at::TensorList exp_avg_sqs, at::TensorList steps, double lr, double beta1, double beta2,
                         double weight_decay, double eps, const at::Tensor& grad_scale = {},
                         const at::Tensor& found_inf = {}) {
#if TORCH_VERSION_MAJOR >= 2
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, lr, beta1, beta2, weight_decay, eps,
                    /*amsgrad=*/false, /*maximize=*/false, optional_tensor(grad_scale), optional_tensor(found_inf));
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)steps, (void)lr, (void)beta1, (void)beta2,
      (void)weight_decay, (void)eps, (void)grad_scale, (void)found_inf;
  throw std::logic_error("aten::_fused_adamw_ needs libtorch 2");
#endif
}

}  // namespace oomtune::compat
