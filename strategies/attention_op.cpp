#include "strategies/attention_op.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "compat/torch_compat.h"
#include "probes/memory_tracker.h"
#include "session/cuda_autocast.h"

namespace oomtune {
namespace {

std::mutex g_record_mutex;
CudaTarget g_target;       // guarded by g_record_mutex
AttentionRecord g_record;  // guarded by g_record_mutex

#if TORCH_VERSION_MAJOR >= 2

CudaTarget current_target() {
  std::lock_guard<std::mutex> lock(g_record_mutex);
  return g_target;
}

void count_call(const AttentionCall& call, AttentionKernel kernel, const AttentionBytes& bytes,
                const AttentionBytes& math) {
  std::lock_guard<std::mutex> lock(g_record_mutex);
  ++g_record.calls[static_cast<std::size_t>(kernel)];
  g_record.kept_bytes += bytes.kept_bytes;
  g_record.math_kept_bytes += math.kept_bytes;
  g_record.largest_backward_transient_bytes =
      std::max(g_record.largest_backward_transient_bytes, bytes.backward_transient_bytes);
  if (call.mask_requires_grad) {
    ++g_record.mask_gradient_calls;
    g_record.largest_mask_gradient_bytes = std::max(g_record.largest_mask_gradient_bytes, bytes.mask_gradient_bytes);
    if (cudnn_passed_over(call, g_target)) ++g_record.cudnn_passed_over_calls;
  }
  g_record.target = cuda_target_name(g_target);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

AttentionDtype attention_dtype(at::ScalarType type) {
  switch (type) {
    case at::kBFloat16:
      return AttentionDtype::kBFloat16;
    case at::kHalf:
      return AttentionDtype::kFloat16;
    case at::kDouble:
      return AttentionDtype::kFloat64;
    default:
      return AttentionDtype::kFloat32;
  }
}

// The call as the CUDA kernel sees it; query [B, H, T, E], key [B, Hk, S, E],
// value [B, Hk, S, Ev] (4-D only: the caller sends others to math).
AttentionCall describe(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                       double dropout, bool is_causal) {
  AttentionCall c;
  c.batch = q.size(0);
  c.heads = q.size(1);
  c.kv_heads = k.size(1);
  c.query_length = q.size(2);
  c.key_length = k.size(2);
  c.head_dim = q.size(3);
  c.value_head_dim = v.size(3);
  c.dtype = attention_dtype(q.scalar_type());
  c.has_mask = mask.defined();
  if (c.has_mask) {
    c.mask_elements = mask.numel();
    c.mask_last_dim = mask.dim() > 0 ? mask.size(-1) : 1;
    c.mask_is_bool = mask.scalar_type() == at::kBool;
    c.mask_requires_grad = at::GradMode::is_enabled() && mask.requires_grad();
  }
  c.dropout = dropout;
  c.is_causal = is_causal;
  c.requires_grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  c.last_dim_contiguous = q.stride(-1) == 1 && k.stride(-1) == 1 && v.stride(-1) == 1;
  return c;
}

// convert_boolean_attn_mask (aten/src/ATen/native/transformers/attention.cpp):
// a boolean mask becomes a bias of the query's dtype, -inf where masked out.
at::Tensor mask_bias(const at::Tensor& mask, const at::Tensor& query) {
  if (!mask.defined() || mask.scalar_type() != at::kBool) return mask;
  const auto options = query.options().dtype(query.scalar_type());
  // logical_not has no meta kernel in a C++ program: on meta, a bool tensor
  // of the same bytes stands for it.
  const at::Tensor masked_out = mask.is_meta() ? at::empty_like(mask) : mask.logical_not();
  return at::where(masked_out, at::scalar_tensor(-std::numeric_limits<double>::infinity(), options),
                   at::scalar_tensor(0.0, options));
}

constexpr int64_t kBiasAlignment = 16;  // the efficient kernel's, elements of the bias's last dimension

// The efficient kernel's bias (preprocess_mask in transformers/attention.cpp):
// the last dimension padded to a multiple of 16 (pad_bias, a copy), sliced
// back, expanded to [B, H, T, S]; under autograd, so that a mask that
// requires grad gets its gradient through them (Note [Mask gradients]).
at::Tensor efficient_bias(const at::Tensor& bias, const at::Tensor& q, const at::Tensor& k) {
  const int64_t last = bias.size(-1);
  at::Tensor aligned = bias;
  if (last % kBiasAlignment != 0)
    aligned = at::constant_pad_nd(bias, {0, kBiasAlignment - last % kBiasAlignment}, 0).narrow(-1, 0, last);
  return aligned.expand({q.size(0), q.size(1), q.size(2), k.size(2)});
}

/// The flash, efficient and cuDNN kernels' memory on the probe device (see
/// attention_op.h). forward returns the output in [B, T, H, Ev] layout.
class FusedAttention : public torch::autograd::Function<FusedAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& attn_mask, double dropout, bool is_causal,
                            std::optional<double> scale, bool enable_gqa, int64_t kernel_index, bool requires_grad) {
    const auto kernel = static_cast<AttentionKernel>(kernel_index);
    const at::Tensor mask = attn_mask ? *attn_mask : at::Tensor();
    // Grad mode is off inside forward: whether the call trains comes from
    // the caller.
    AttentionCall call = describe(q, k, v, mask, dropout, is_causal);
    call.requires_grad = requires_grad;
    const AttentionBytes bytes = attention_bytes(call, kernel);
    const bool compute = !q.is_meta();
    // The efficient kernel's mask comes as its bias already (efficient_bias).
    const at::Tensor bias = mask_bias(mask, q);
    const at::Tensor saved_bias = kernel == AttentionKernel::kFlash ? at::Tensor() : bias;
    at::Tensor rng_state;
    if (compute && dropout > 0) {
      HostMemoryScope host;
      auto generator = at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CPU));
      std::lock_guard<std::mutex> lock(generator.mutex());
      rng_state = generator.get_state();
    }
    const auto stats = q.options().dtype(at::kFloat);
    at::Tensor out = at::empty({call.batch, call.query_length, call.heads, call.value_head_dim}, q.options());
    at::Tensor logsumexp;
    std::vector<at::Tensor> device_rng;
    switch (kernel) {
      case AttentionKernel::kFlash:
        logsumexp = at::empty({call.batch, call.heads, call.query_length}, stats);
        device_rng.push_back(at::empty({2}, q.options().dtype(at::kLong)));  // rng_state
        device_rng.push_back(at::empty({}, q.options().dtype(at::kLong)));   // _unused
        break;
      case AttentionKernel::kEfficient:
        if (bytes.logsumexp_bytes > 0)
          logsumexp = at::empty({call.batch, call.heads, bytes.logsumexp_bytes / (call.batch * call.heads * 4)}, stats);
        if (bytes.forward_transient_bytes > 0 && call.dtype != AttentionDtype::kFloat32 && call.value_head_dim > 128)
          at::empty({call.batch, call.query_length, call.heads, call.value_head_dim}, stats);  // output_accum
        break;
      case AttentionKernel::kCudnn:
        if (bytes.logsumexp_bytes > 0) logsumexp = at::empty({call.batch, call.heads, call.query_length, 1}, stats);
        if (dropout > 0) {
          device_rng.push_back(at::empty({}, q.options().dtype(at::kLong)));  // philox seed
          device_rng.push_back(at::empty({}, q.options().dtype(at::kLong)));  // philox offset
        }
        break;
      default:
        break;
    }
    if (compute) {
      KernelScratchScope scratch;
      const at::Tensor values =
          at::scaled_dot_product_attention(q, k, v, optional(mask), dropout, is_causal, scale, enable_gqa);
      out.copy_(values.transpose(1, 2));
    }
    // The caller's mask is not kept (CUDA keeps only the kernel's bias); the
    // CPU's recomputation reads the bias, which masks the same entries.
    // Saving the efficient kernel's bias keeps its padded storage, as CUDA's
    // ScaledDotProductEfficientAttentionBackward0 does.
    ctx->save_for_backward({q, k, v, out, logsumexp, saved_bias, rng_state});
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["scale"] = scale ? c10::IValue(*scale) : c10::IValue();
    ctx->saved_data["enable_gqa"] = enable_gqa;
    ctx->saved_data["kernel"] = kernel_index;
    ctx->saved_data["device_rng"] = c10::List<at::Tensor>(device_rng);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& q = saved[0];
    const at::Tensor& k = saved[1];
    const at::Tensor& v = saved[2];
    const at::Tensor& mask = saved[5];
    const at::Tensor& rng_state = saved[6];
    const double dropout = ctx->saved_data["dropout"].toDouble();
    const bool is_causal = ctx->saved_data["is_causal"].toBool();
    const c10::IValue scale_value = ctx->saved_data["scale"];
    const std::optional<double> scale =
        scale_value.isNone() ? std::nullopt : std::optional<double>(scale_value.toDouble());
    const bool enable_gqa = ctx->saved_data["enable_gqa"].toBool();
    const auto kernel = static_cast<AttentionKernel>(ctx->saved_data["kernel"].toInt());
    const at::Tensor grad_out = grads[0];  // [B, T, H, Ev]

    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    // A mask that requires grad (the efficient kernel's; Note [Mask
    // gradients]): grad_bias [B, H, T, round16(S)], returned as [..., :S].
    const bool mask_gradient = mask.defined() && ctx->needs_input_grad(3);
    at::Tensor dmask;
    if (mask_gradient) {
      std::vector<int64_t> sizes = mask.sizes().vec();
      const int64_t last = sizes.back();
      sizes.back() = (last + kBiasAlignment - 1) / kBiasAlignment * kBiasAlignment;
      dmask = at::empty(sizes, mask.options()).narrow(-1, 0, last);
    }
    std::vector<at::Tensor> transients;
    if (kernel == AttentionKernel::kFlash) {
      // mha_bwd (flash_attn/flash_api.cpp): softmax_d, dq_accum, and the
      // expanded dk, dv of grouped-query attention.
      const int64_t B = q.size(0), H = q.size(1), T = q.size(2), E = q.size(3), S = k.size(2);
      const auto round_up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
      const auto stats = q.options().dtype(at::kFloat);
      transients.push_back(at::empty({B, H, round_up(T, 128)}, stats));
      transients.push_back(at::empty({B, round_up(T, 128), H, round_up(E, E <= 128 ? 32 : 64)}, stats));
      if (k.size(1) != H) {
        transients.push_back(at::empty({B, S, H, E}, q.options()));
        transients.push_back(at::empty({B, S, H, E}, q.options()));
      }
    }
    if (!q.is_meta()) {
      KernelScratchScope scratch;
      // Dropout: the forward's masks again, then the generator as it was
      // (as strategies/recompute_op.cpp does, Note [Recompute RNG]).
      auto generator = at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CPU));
      at::Tensor current_state;
      if (rng_state.defined()) {
        HostMemoryScope host;
        std::lock_guard<std::mutex> lock(generator.mutex());
        current_state = generator.get_state();
        generator.set_state(rng_state);
      }
      at::AutoGradMode enable(true);
      const at::Tensor qd = q.detach().requires_grad_(true);
      const at::Tensor kd = k.detach().requires_grad_(true);
      const at::Tensor vd = v.detach().requires_grad_(true);
      const at::Tensor md = mask_gradient ? mask.detach().requires_grad_(true) : mask;
      const at::Tensor values =
          at::scaled_dot_product_attention(qd, kd, vd, optional(md), dropout, is_causal, scale, enable_gqa);
      variable_list inputs{qd, kd, vd};
      if (mask_gradient) inputs.push_back(md);
      const variable_list g = torch::autograd::grad({values}, inputs, {grad_out.transpose(1, 2)});
      dq.copy_(g[0]);
      dk.copy_(g[1]);
      dv.copy_(g[2]);
      if (mask_gradient) dmask.copy_(g[3]);
      if (current_state.defined()) {
        std::lock_guard<std::mutex> lock(generator.mutex());
        generator.set_state(current_state);
      }
    }
    transients.clear();
    return {dq, dk, dv, dmask, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }

 private:
  static std::optional<at::Tensor> optional(const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  }
};

// CUDA autocast runs SDPA in the lower precision (lower_precision_fp in
// ATen/autocast_mode.cpp): the probe's autocast does the same here (CUDA's
// emulated, session/cuda_autocast.h, or the CPU's), for the CPU and meta.
std::optional<at::ScalarType> autocast_to() {
  if (emulated_cuda_autocast_enabled()) return emulated_cuda_autocast_dtype();
  if (compat::cpu_autocast_enabled()) return compat::cpu_autocast_dtype();
  return std::nullopt;
}

at::Tensor autocast_argument(const at::Tensor& t, std::optional<at::ScalarType> to) {
  if (!to || !t.defined() || !at::isFloatingType(t.scalar_type()) || t.scalar_type() == *to) return t;
  if (!t.is_meta() && !t.is_cpu()) return t;
  return t.to(*to);
}

at::Tensor attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                     const std::optional<at::Tensor>& attn_mask, double dropout, bool is_causal,
                     std::optional<double> scale, bool enable_gqa) {
  const std::optional<at::ScalarType> to = autocast_to();
  const at::Tensor q = autocast_argument(query, to), k = autocast_argument(key, to), v = autocast_argument(value, to);
  at::Tensor mask = attn_mask ? *attn_mask : at::Tensor();
  if (mask.defined() && mask.scalar_type() != at::kBool) mask = autocast_argument(mask, to);
  // Below its autocast wrapper SDPA's own ops are not cast again (ATen's
  // wrappers exclude their key while they redispatch): the math path's
  // softmax stays in the autocast dtype, as on CUDA.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) {
    // The CUDA kernels take [B, H, T, E] only (check_tensor_shapes): math.
    return std::get<0>(
        at::_scaled_dot_product_attention_math(q, k, v, attn_mask ? std::optional<at::Tensor>(mask) : std::nullopt,
                                               dropout, is_causal, std::nullopt, scale, enable_gqa));
  }
  const AttentionCall call = describe(q, k, v, mask, dropout, is_causal);
  const AttentionKernel kernel = select_attention_kernel(call, current_target());
  const AttentionBytes bytes = attention_bytes(call, kernel);
  count_call(call, kernel, bytes, attention_bytes(call, AttentionKernel::kMath));
  if (kernel == AttentionKernel::kMath)
    return std::get<0>(
        at::_scaled_dot_product_attention_math(q, k, v, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt,
                                               dropout, is_causal, std::nullopt, scale, enable_gqa));
  if (kernel == AttentionKernel::kEfficient && mask.defined()) mask = efficient_bias(mask_bias(mask, q), q, k);
  const std::optional<at::Tensor> passed_mask = mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  return FusedAttention::apply(q, k, v, passed_mask, dropout, is_causal, scale, enable_gqa,
                               static_cast<int64_t>(kernel), call.requires_grad)
      .transpose(1, 2);
}

TORCH_LIBRARY_FRAGMENT(oomtune, m) {
  m.def(
      "scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
      "float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor");
  m.impl("scaled_dot_product_attention", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(attention));
}

#endif  // TORCH_VERSION_MAJOR >= 2

}  // namespace

void ensure_attention_op_registered() {}

void set_attention_target(const CudaTarget& target) {
  std::lock_guard<std::mutex> lock(g_record_mutex);
  g_target = target;
}

AttentionRecord take_attention_record() {
  std::lock_guard<std::mutex> lock(g_record_mutex);
  return std::exchange(g_record, AttentionRecord{});
}

}  // namespace oomtune
