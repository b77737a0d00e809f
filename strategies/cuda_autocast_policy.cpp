#include "strategies/cuda_autocast_policy.h"

#include <mutex>
#include <string>

#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

// The lists and ATen's registration macros, in PyTorch 2's header.
#if defined(AT_FORALL_LOWER_PRECISION_FP) && defined(AT_FORALL_FP32) && defined(AT_FORALL_FP32_SET_OPT_DTYPE) && \
    defined(AT_FORALL_PROMOTE) && defined(KERNEL1) && defined(KERNEL2)
#define OOMTUNE_CUDA_AUTOCAST_LISTS 1
#endif

namespace oomtune {
namespace {

#ifdef OOMTUNE_CUDA_AUTOCAST_LISTS
constexpr bool kAvailable = true;

// Whether CPU autocast has a policy of its own for the operator.
bool cpu_has_policy(const char* name, const char* overload) {
  const auto op = c10::Dispatcher::singleton().findOp({name, overload});
  return op && op->hasKernelForDispatchKey(c10::DispatchKey::AutocastCPU);
}

// ATen's KERNEL1 / KERNEL2 (ATen/autocast_mode.h) with CPU as the device,
// for an op CPU autocast has no policy for.
#define OOMTUNE_POLICY1(POLICY, OP) \
  if (!cpu_has_policy("aten::" #OP, "")) KERNEL1(c10::DeviceType::CPU, OP, POLICY)
#define OOMTUNE_POLICY2(POLICY, OP, OVERLOAD) \
  if (!cpu_has_policy("aten::" #OP, #OVERLOAD)) KERNEL2(c10::DeviceType::CPU, OP, OVERLOAD, POLICY)
// An entry of the lists is (OP) or (OP, OVERLOAD).
#define OOMTUNE_NARG_IMPL(_1, _2, N, ...) N
#define OOMTUNE_NARG(...) OOMTUNE_NARG_IMPL(__VA_ARGS__, 2, 1)
#define OOMTUNE_POLICY(POLICY, ...) C10_CONCATENATE(OOMTUNE_POLICY, OOMTUNE_NARG(__VA_ARGS__))(POLICY, __VA_ARGS__)

#define OOMTUNE_LOWER_PRECISION_FP(...) OOMTUNE_POLICY(lower_precision_fp, __VA_ARGS__);
#define OOMTUNE_FP32(...) OOMTUNE_POLICY(fp32, __VA_ARGS__);
#define OOMTUNE_FP32_SET_OPT_DTYPE(...) OOMTUNE_POLICY(fp32_set_opt_dtype, __VA_ARGS__);
#define OOMTUNE_PROMOTE(...) OOMTUNE_POLICY(promote, __VA_ARGS__);

void register_policy(torch::Library& m) {
  AT_FORALL_LOWER_PRECISION_FP(OOMTUNE_LOWER_PRECISION_FP)
  AT_FORALL_FP32(OOMTUNE_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(OOMTUNE_FP32_SET_OPT_DTYPE)
  AT_FORALL_PROMOTE(OOMTUNE_PROMOTE)
}

#else
constexpr bool kAvailable = false;
#endif

}  // namespace

void install_cuda_autocast_policy() {
#ifdef OOMTUNE_CUDA_AUTOCAST_LISTS
  static std::once_flag once;
  std::call_once(once, [] {
    // Lives as long as the process: the dispatcher keeps the kernels while
    // their Library does.
    static torch::Library library(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
    register_policy(library);
  });
#endif
}

bool cuda_autocast_policy_available() { return kAvailable; }

}  // namespace oomtune
