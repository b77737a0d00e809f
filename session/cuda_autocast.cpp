#include "session/cuda_autocast.h"

#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

// The lists, in PyTorch 2's header.
#if defined(AT_FORALL_LOWER_PRECISION_FP) && defined(AT_FORALL_FP32) && defined(AT_FORALL_FP32_SET_OPT_DTYPE) && \
    defined(AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE) && defined(AT_FORALL_PROMOTE) && defined(ADD_NS)
#define OOMTUNE_CUDA_AUTOCAST_LISTS 1
#endif

namespace oomtune {
namespace {

#ifdef OOMTUNE_CUDA_AUTOCAST_LISTS
using at::autocast::CastPolicy;

constexpr c10::DispatchKey kKey = c10::DispatchKey::AutocastPrivateUse1;

thread_local at::ScalarType tls_dtype = at::kBFloat16;

// The weight casts of this thread's autocast region: the source is held
// weakly so that its address is not reused while the entry lives (ATen's
// cached_casts keeps the same weak reference).
struct CachedCast {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> source;
  at::Tensor cast;
};
// In the order they were made, which is the order the cache frees them in:
// ATen's frees them in its hash map's order, which follows the weights'
// addresses, so the caching allocator's blocks would come back in an order
// that differs between a CPU and a meta trial of one configuration, and
// between runs (the predicted reserved bytes with them: a 2 MiB segment
// for the example GPT under bf16 autocast).
thread_local std::vector<CachedCast> tls_casts;
thread_local std::unordered_map<c10::TensorImpl*, std::size_t> tls_cast_index;  // into tls_casts

// CUDA's is_eligible with the CPU and meta in CUDA's place.
bool eligible(const at::Tensor& t) {
  return t.defined() && (t.is_cpu() || t.is_meta()) && t.is_floating_point() && t.scalar_type() != at::kDouble;
}

// ATen's cached_cast (autocast_mode.cpp): fp32 leaves that require grad
// are cast once per region when cast to the autocast dtype.
at::Tensor cast(at::ScalarType to, const at::Tensor& t) {
  if (!eligible(t) || t.scalar_type() == to) return t;
  const bool cacheable = to == tls_dtype && t.scalar_type() == at::kFloat && t.requires_grad() && t.is_leaf() &&
                         !t.is_view() && at::autocast::is_autocast_cache_enabled();
  if (!cacheable) return t.to(to);
  const auto found = tls_cast_index.find(t.unsafeGetTensorImpl());
  if (found != tls_cast_index.end()) return tls_casts[found->second].cast;
  at::Tensor copy = t.to(to);
  tls_cast_index.emplace(t.unsafeGetTensorImpl(), tls_casts.size());
  tls_casts.push_back(
      CachedCast{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()), copy});
  return copy;
}

std::optional<at::Tensor> cast(at::ScalarType to, const std::optional<at::Tensor>& t) {
  if (!t) return t;
  return cast(to, *t);
}

std::vector<at::Tensor> cast(at::ScalarType to, at::TensorList list) {
  std::vector<at::Tensor> out;
  out.reserve(list.size());
  for (const at::Tensor& t : list) out.push_back(cast(to, t));
  return out;
}

// Every other argument passes through.
template <typename T>
T cast(at::ScalarType /*to*/, T arg) {
  return arg;
}

// ATen's set_opt_dtype: an unset optional dtype becomes `to`.
std::optional<at::ScalarType> set_opt_dtype(at::ScalarType to, const std::optional<at::ScalarType>& dtype) {
  return dtype.has_value() ? dtype : to;
}

template <typename T>
T set_opt_dtype(at::ScalarType /*to*/, T arg) {
  return arg;
}

// ATen's prioritize: the widest floating dtype among the eligible tensors
// (double ignored; fp32 wins over the autocast dtype).
at::ScalarType widest(at::ScalarType current, const at::Tensor& t) {
  if (!eligible(t)) return current;
  const at::ScalarType next = t.scalar_type();
  if (current == at::kFloat || next == at::kFloat) return at::kFloat;
  TORCH_CHECK(current == next, "Unexpected floating ScalarType in oomtune's CUDA autocast: ", current, " and ", next);
  return current;
}

template <typename T>
at::ScalarType widest(at::ScalarType current, const T& /*not a tensor*/) {
  return current;
}

template <typename... Args>
at::ScalarType promote_type(at::ScalarType current, const Args&... args) {
  ((current = widest(current, args)), ...);
  return current;
}

template <typename... Args>
bool first_is_eligible(const at::Tensor& first, const Args&... /*rest*/) {
  return eligible(first);
}

template <typename... Args>
at::ScalarType type_from_first(at::ScalarType to, const at::Tensor& first, const Args&... /*rest*/) {
  return eligible(first) ? to : first.scalar_type();
}

// ATen's WrapFunction_, one policy per branch, redispatching below kKey.
template <CastPolicy policy, class Redispatch, Redispatch* F, class Ret, class ArgList>
struct Wrap_ {};

template <CastPolicy policy, class Redispatch, Redispatch* F, class Ret, class... Args>
struct Wrap_<policy, Redispatch, F, Ret, c10::guts::typelist::typelist<Args...>> {
  static Ret call(Args... args) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
    if constexpr (policy == CastPolicy::lower_precision_fp) {
      return (*F)(cast(tls_dtype, args)...);
    } else if constexpr (policy == CastPolicy::fp32) {
      return (*F)(cast(at::kFloat, args)...);
    } else if constexpr (policy == CastPolicy::fp32_set_opt_dtype) {
      if (first_is_eligible(args...)) return (*F)(set_opt_dtype(at::kFloat, args)...);
      return (*F)(args...);
    } else if constexpr (policy == CastPolicy::fp32_append_dtype) {
      const at::ScalarType out_type = type_from_first(at::kFloat, args...);
      return (*F)(args..., out_type);
    } else {
      const at::ScalarType to = promote_type(tls_dtype, args...);
      return (*F)(cast(to, args)...);
    }
  }
};

// ATen's WrapFunction: the registered signature's arguments, redispatched
// to F.
template <CastPolicy policy, class Registered, class Redispatch, Redispatch* F>
struct Wrap {
  using type = Wrap_<policy, Redispatch, F, typename c10::guts::function_traits<Registered>::return_type,
                     typename c10::guts::function_traits<Registered>::parameter_types>;
};

// ATen's KERNEL1 / KERNEL2 / KERNEL_DIFFERENT_REDISPATCH_SIGNATURE for kKey.
#define OOMTUNE_KERNEL1(POLICY, OP) \
  m.impl("aten::" #OP,              \
         &Wrap<CastPolicy::POLICY, decltype(ATEN_FN(OP)), decltype(ATEN_FN(OP)), &ATEN_FN(OP)>::type::call);
#define OOMTUNE_KERNEL2(POLICY, OP, OVERLOAD)                                                    \
  m.impl("aten::" #OP "." #OVERLOAD, &Wrap<CastPolicy::POLICY, decltype(ATEN_FN2(OP, OVERLOAD)), \
                                           decltype(ATEN_FN2(OP, OVERLOAD)), &ATEN_FN2(OP, OVERLOAD)>::type::call);
// An entry of the lists is (OP) or (OP, OVERLOAD).
#define OOMTUNE_NARG_IMPL(_1, _2, N, ...) N
#define OOMTUNE_NARG(...) OOMTUNE_NARG_IMPL(__VA_ARGS__, 2, 1)
#define OOMTUNE_KERNEL(POLICY, ...) C10_CONCATENATE(OOMTUNE_KERNEL, OOMTUNE_NARG(__VA_ARGS__))(POLICY, __VA_ARGS__)

#define OOMTUNE_LOWER_PRECISION_FP(...) OOMTUNE_KERNEL(lower_precision_fp, __VA_ARGS__)
#define OOMTUNE_FP32(...) OOMTUNE_KERNEL(fp32, __VA_ARGS__)
#define OOMTUNE_FP32_SET_OPT_DTYPE(...) OOMTUNE_KERNEL(fp32_set_opt_dtype, __VA_ARGS__)
#define OOMTUNE_PROMOTE(...) OOMTUNE_KERNEL(promote, __VA_ARGS__)
#define OOMTUNE_REDISPATCH(FUNC, NAME, REGISTERED, REDISPATCH, POLICY) \
  m.impl("aten::" NAME, &Wrap<CastPolicy::POLICY, REGISTERED, REDISPATCH, &FUNC>::type::call);

void register_policies(torch::Library& m) {
  // The signatures of AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE name ATen's
  // types unqualified (it is expanded in at::autocast).
  using at::DimnameList;
  using at::IntArrayRef;
  using at::Scalar;
  using at::ScalarType;
  using at::Tensor;
  AT_FORALL_LOWER_PRECISION_FP(OOMTUNE_LOWER_PRECISION_FP)
  AT_FORALL_FP32(OOMTUNE_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(OOMTUNE_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(OOMTUNE_REDISPATCH)
  AT_FORALL_PROMOTE(OOMTUNE_PROMOTE)
}

void register_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Live as long as the process: the dispatcher keeps the kernels while
    // their Library does.
    static torch::Library fallback(torch::Library::IMPL, "_", kKey, __FILE__, __LINE__);
    fallback.fallback(torch::CppFunction::makeFallthrough());
    static torch::Library policies(torch::Library::IMPL, "aten", kKey, __FILE__, __LINE__);
    register_policies(policies);
  });
}
#endif

}  // namespace

#ifdef OOMTUNE_CUDA_AUTOCAST_LISTS
bool cuda_autocast_available() { return true; }

void set_emulated_cuda_autocast(bool enabled, at::ScalarType dtype) {
  if (enabled) register_once();
  // On while the key is included and not excluded: the default excluded
  // set holds every Autocast key (c10::default_excluded_set).
  c10::impl::tls_set_dispatch_key_included(kKey, enabled);
  c10::impl::tls_set_dispatch_key_excluded(kKey, !enabled);
  tls_dtype = dtype;
}

bool emulated_cuda_autocast_enabled() {
  return c10::impl::tls_is_dispatch_key_included(kKey) && !c10::impl::tls_is_dispatch_key_excluded(kKey);
}

at::ScalarType emulated_cuda_autocast_dtype() { return tls_dtype; }

void clear_emulated_cuda_autocast_cache() {
  for (CachedCast& entry : tls_casts) entry.cast.reset();  // first made, first freed
  tls_casts.clear();
  tls_cast_index.clear();
}
#else
bool cuda_autocast_available() { return false; }

void set_emulated_cuda_autocast(bool enabled, at::ScalarType /*dtype*/) {
  if (enabled) throw std::logic_error("this libtorch has no CUDA autocast lists to emulate (PyTorch 2 has them)");
}

bool emulated_cuda_autocast_enabled() { return false; }

at::ScalarType emulated_cuda_autocast_dtype() { return at::kBFloat16; }

void clear_emulated_cuda_autocast_cache() {}
#endif

}  // namespace oomtune
