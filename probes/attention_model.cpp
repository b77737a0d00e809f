#include "probes/attention_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"
#include "common/error.h"

// Note [SDPA kernel choice]
// Rationale: the memory of scaled_dot_product_attention depends on the
// kernel CUDA picks; meta cannot know it (it takes the math path) and the CPU
// picks its own. PyTorch's choice is select_sdp_backend in
// aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: try the backends in
// priority order and take the first whose checks pass.
// Approach: the same order and the checks that can fail for a dense call
// with default settings (read from that file; which checks PyTorch 2.11+cu130
// has was confirmed from the warning strings in its libtorch_cuda.so):
// - Order: at::globalContext().sDPPriorityOrder() defaults to flash,
//   efficient, math, cuDNN (torch._C._get_sdp_priority_order() = [1, 2, 0,
//   3, 4] on 2.11), so cuDNN, after math, is never reached; except that
//   check_prefer_cudnn_attention puts cuDNN first on sm9x and sm10x when the
//   runtime cuDNN is newer than 9.15.0 (a CUDA 13 build; TORCH_CUDNN_SDPA_
//   DEPRIORITIZED=1 turns it off). With 2.11+cu130 (cuDNN 9.19) an H100
//   runs cuDNN attention, an A100 flash.
// - cuDNN (can_use_cudnn_attention): fp16/bf16 on sm80..sm121; dropout not
//   with cuDNN 9.11-9.13; head dims multiples of 8 and at most 128 (256 on
//   sm90/sm10x with cuDNN newer than 9.2.2); key length not 1; with dropout,
//   query length not 1.
// - flash (can_use_flash_attention): no attn_mask; query, key and value head
//   dims equal and at most 256; sm80..sm121; training on sm86/sm89/sm120/
//   sm121 only with head dim <= 192, or > 224 without dropout; is_causal
//   only with query length = key length; fp16/bf16.
// - efficient (can_use_mem_efficient_attention): sm50..sm121; query and key
//   head dims equal, query and value head dims multiples of the GEMM
//   alignment (minimum_gemm_alignment: on sm80+ max(4, 128 / bits), so 8 for
//   fp16/bf16 and 4 for fp32; on sm7x 8 for fp16, whose GEMMs use tensor
//   cores there, and 1 for fp32); fp16, fp32 or bf16 on sm80+, fp16 or fp32
//   below; masks and dropout allowed.
// - math: always (the user has not disabled it).
// Every kernel needs stride 1 in the last dimension (else math).
// Limitations: nested tensors, user-disabled backends, deterministic mode,
// FA3 and fp8 are not modelled; a storage offset that breaks the efficient
// kernel's pointer alignment (sm80+) is assumed not to occur.

// Note [SDPA kernel bytes]
// Rationale: the probe allocates, for each call, what the chosen CUDA kernel
// allocates, so peaks, retained activations and the event stream carry it.
// Approach (B batch, H heads, Hk key/value heads, T query length, S key
// length, E and Ev head dims, e bytes per element):
// - flash: mha_fwd (transformers/cuda/flash_attn/flash_api.cpp): out
//   empty_like(q) in [B, T, H, E] (e), softmax_lse [B, H, T] fp32,
//   rng_state [2] uint64 and _unused [] uint64 on the GPU; all saved
//   (derivatives.yaml: output, logsumexp, rng_state, unused). mha_bwd:
//   dq, dk, dv like q, k, v; softmax_d [B, H, round128(T)] fp32 and
//   dq_accum [B, round128(T), H, round(E, E <= 128 ? 32 : 64)] fp32 for the
//   kernel's run; with Hk < H, dk_expanded and dv_expanded [B, S, H, E].
// - efficient: _efficient_attention_forward (transformers/cuda/attention.cu):
//   res [B, T, H, Ev] (e), logsumexp [B, H, round32(T)] fp32 when it
//   computes it (training); output_accum [B, T, H, Ev] fp32 for fp16/bf16
//   with Ev > 128 (kNeedsOutputAccumulatorBuffer), freed on return; philox
//   seed and offset are CPU scalars. A mask becomes a bias whose last
//   dimension is padded to a multiple of 16 (preprocess_mask / pad_bias,
//   a copy when it is not one), saved for backward.
// - cuDNN: _scaled_dot_product_cudnn_attention_cuda: output [B, H, T, Ev]
//   (e), logsumexp [B, H, T, 1] fp32 when training, philox seed and offset
//   on the GPU with dropout.
// - Every kernel: a boolean mask is first converted to a bias of the query's
//   dtype (convert_boolean_attn_mask in attention.cpp).
// - math: see attention_bytes' contract.
// Limitations: flash's split-KV accumulators (only when B·H·ceil(T/64) is
// below 0.8·2·SMs, so small batches) and the efficient and cuDNN backward
// kernels' own workspaces are not modelled; cuDNN's graph workspaces are
// named in the workspaces line instead. A head dim that is not a multiple of
// 8 makes flash pad q, k and v (copies): not modelled.

// Note [Mask gradients]
// Rationale: a float attn_mask that requires grad is a learned bias, as
// T5's relative position bias, which transformers passes to SDPA since
// huggingface/transformers#47014 (2026-07). Its parameters train only if the
// kernel gives the mask a gradient, and on CUDA that gradient is made at the
// mask's broadcast size.
// Approach (PyTorch 2.11):
// - efficient: scaled_dot_product_attention (transformers/attention.cpp,
//   preprocess_mask) pads an unaligned mask's last dimension to a multiple
//   of 16 and expands it to [B, H, T, S], under autograd. The backward
//   allocates grad_bias [B, H, T, round16(S)] in the mask's dtype and returns
//   its [..., :S] slice (_efficient_attention_backward in
//   transformers/cuda/attention_backward.cu; the same in 2.11's meta
//   registration of _scaled_dot_product_efficient_attention_backward,
//   torch/_meta_registrations.py). Autograd then sums it to the mask's shape
//   (expand's backward) and undoes the padding (slice_backward,
//   constant_pad_nd_backward).
// - math: ATen's autograd gives the mask the scores' gradient, as on CUDA.
// - flash takes no mask. cuDNN has no gradient for it: its autograd formula
//   names query, key and value only, and _scaled_dot_product_cudnn_attention
//   given an attn_bias that requires grad raises "is not differentiable with
//   respect to argument 'attn_bias'" (tried with PyTorch 2.11 on the meta
//   device: the check is autograd's, the same code on every device), while
//   can_use_cudnn_attention does not look at the mask's requires_grad. Where
//   PyTorch prefers cuDNN (prefer_cudnn), a training run would stop there;
//   oomtune counts the kernel that runs once cuDNN attention is disabled
//   (torch.backends.cuda.enable_cudnn_sdp(False)) and the report says so.
// Limitations: not yet run on a GPU; whether 2.11 on sm90 stops as read is
// scripts/device_check.sh's to show.

// Note [Library workspaces]
// Rationale: a CUDA run holds bytes no tensor owns: each cuBLAS handle's
// workspace, which PyTorch 2.x allocates through the caching allocator
// (CublasHandlePool.cpp, getNewWorkspace: CUDACachingAllocator::get()->
// allocate(getChosenWorkspaceSize())) and keeps per (handle, stream) for
// the life of the process, so it is part of allocated bytes from the first
// matmul on.
// Approach: one workspace of cublas_workspace_bytes() per thread that runs
// matmuls: the training thread (forward) and autograd's device thread
// (backward; handles are per thread, DeviceThreadHandlePool), so two per
// step when both multiply matrices; the tracker finds which did
// (probes/memory_tracker.cpp, Note [cuBLAS calls]). The CPU and meta
// probes run no cuBLAS, so their peaks count tensors only and state the
// workspaces beside them; the reserved prediction allocates each at its
// thread's first cuBLAS operator (trial/trial_runner.cpp,
// predict_reserved), where a CUDA run asks the caching allocator for it.
// A CUDA trial's allocator holds them in its own figures. cuDNN attention's graph
// workspace is sized by cudnn-frontend at run time: named, not counted.
// Convolutions' cuDNN workspaces are transient (freed after the call) and
// bounded by what the caching allocator can still give (Conv_v7.cpp tries
// algorithms whose workspace it can allocate): not modelled.
// cuBLASLt (addmm with a bias) takes a workspace of its own, 1 MiB, at its
// thread's first such matmul: measured on an H200 with PyTorch 2.11
// (scripts/workspace_probe.py, 2026-11-29), where the source read as if
// TORCH_CUBLASLT_UNIFIED_WORKSPACE shared the cuBLAS one.
// Limitations: CUBLAS_WORKSPACE_CONFIG, CUBLASLT_WORKSPACE_SIZE and
// TORCH_CUBLASLT_UNIFIED_WORKSPACE set by the user are not read.

namespace oomtune {
namespace {

struct TargetName {
  const char* name;
  CudaTarget target;
};

// Multiprocessor counts: T4 40 (sm75), A100 SXM 108, A10 72 (sm86), L4 58
// (sm89), H100 SXM 132, B200 148, RTX PRO 6000 188 (sm120). sm75 is the
// oldest architecture PyTorch 2.11+cu130 ships kernels for (CUDA 13 dropped
// Volta): its libtorch_cuda.so names sm_75 beside sm_80 to sm_120.
const TargetName kTargets[] = {
    {"sm75", {7, 5, 91900, 40}},    {"sm80", {8, 0, 91900, 108}}, {"sm86", {8, 6, 91900, 72}},
    {"sm89", {8, 9, 91900, 58}},    {"sm90", {9, 0, 91900, 132}}, {"sm100", {10, 0, 91900, 148}},
    {"sm120", {12, 0, 91900, 188}},
};

int sm(const CudaTarget& t) { return t.sm_major * 10 + t.sm_minor; }
bool sm_in(const CudaTarget& t, int low, int high) { return sm(t) >= low && sm(t) <= high; }
bool half(AttentionDtype d) { return d == AttentionDtype::kBFloat16 || d == AttentionDtype::kFloat16; }
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

bool prefer_cudnn(const CudaTarget& t) { return (t.sm_major == 9 || t.sm_major == 10) && t.cudnn_version > 91500; }

bool can_use_cudnn(const AttentionCall& c, const CudaTarget& t) {
  if (c.dropout > 0 && t.cudnn_version > 91100 && t.cudnn_version < 91400) return false;
  if (!half(c.dtype) || !sm_in(t, 80, 121)) return false;
  const bool sm90_or_10x = (t.sm_major == 9 && t.sm_minor == 0) || t.sm_major == 10;
  const int64_t limit = sm90_or_10x && t.cudnn_version > 92200 ? 256 : 128;
  if (c.head_dim > limit || c.value_head_dim > limit) return false;
  if (c.head_dim % 8 != 0 || c.value_head_dim % 8 != 0) return false;
  if (c.key_length == 1) return false;
  if (c.dropout > 0 && c.query_length == 1) return false;
  return true;
}

bool can_use_flash(const AttentionCall& c, const CudaTarget& t) {
  if (c.has_mask) return false;
  if (c.head_dim != c.value_head_dim || c.head_dim > 256) return false;
  if (!sm_in(t, 80, 121)) return false;
  if (c.requires_grad && (sm_in(t, 86, 89) || sm_in(t, 120, 121))) {
    const bool supported = c.head_dim <= 192 || (c.dropout <= 0 && c.head_dim > 224);
    if (!supported) return false;
  }
  if (c.is_causal && c.query_length != c.key_length) return false;
  return half(c.dtype);
}

// minimum_gemm_alignment: 4 on sm80+, else 1; with tensor cores (sm80+,
// or sm7x for fp16/bf16) at least 128 bits' worth of elements.
int64_t gemm_alignment(const AttentionCall& c, const CudaTarget& t) {
  const bool tensor_cores = t.sm_major >= 8 || (t.sm_major == 7 && half(c.dtype));
  const int64_t alignment = t.sm_major >= 8 ? 4 : 1;
  return tensor_cores ? std::max<int64_t>(alignment, 128 / (8 * element_bytes(c.dtype))) : alignment;
}

bool can_use_efficient(const AttentionCall& c, const CudaTarget& t) {
  if (!sm_in(t, 50, 121)) return false;
  const int64_t alignment = gemm_alignment(c, t);
  if (c.head_dim % alignment != 0 || c.value_head_dim % alignment != 0) return false;
  if (c.dtype == AttentionDtype::kFloat64) return false;
  if (c.dtype == AttentionDtype::kBFloat16 && t.sm_major < 8) return false;
  return true;
}

}  // namespace

std::optional<CudaTarget> cuda_target_from_name(const std::string& name) {
  for (const TargetName& t : kTargets)
    if (name == t.name) return t.target;
  return std::nullopt;
}

std::string cuda_target_name(const CudaTarget& target) { return fmt::format("sm{}", sm(target)); }

std::string attention_kernel_name(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::kMath:
      return "math";
    case AttentionKernel::kFlash:
      return "flash";
    case AttentionKernel::kEfficient:
      return "efficient";
    case AttentionKernel::kCudnn:
      return "cudnn";
    case AttentionKernel::kNumAttentionKernels:
      break;
  }
  return "?";
}

int64_t element_bytes(AttentionDtype dtype) {
  switch (dtype) {
    case AttentionDtype::kFloat32:
      return 4;
    case AttentionDtype::kBFloat16:
    case AttentionDtype::kFloat16:
      return 2;
    case AttentionDtype::kFloat64:
      return 8;
  }
  return 4;
}

AttentionKernel select_attention_kernel(const AttentionCall& call, const CudaTarget& target) {
  if (!call.last_dim_contiguous) return AttentionKernel::kMath;
  if (call.query_length == 0 || call.key_length == 0) return AttentionKernel::kMath;
  // cuDNN has no gradient for a mask (Note [Mask gradients]).
  if (prefer_cudnn(target) && can_use_cudnn(call, target) && !call.mask_requires_grad) return AttentionKernel::kCudnn;
  if (can_use_flash(call, target)) return AttentionKernel::kFlash;
  if (can_use_efficient(call, target)) return AttentionKernel::kEfficient;
  return AttentionKernel::kMath;
}

bool cudnn_passed_over(const AttentionCall& call, const CudaTarget& target) {
  if (!call.mask_requires_grad) return false;
  AttentionCall without_gradient = call;
  without_gradient.mask_requires_grad = false;
  return select_attention_kernel(without_gradient, target) == AttentionKernel::kCudnn;
}

AttentionBytes attention_bytes(const AttentionCall& c, AttentionKernel kernel) {
  constexpr int64_t kFloat = 4;  // fp32 statistics
  const int64_t e = element_bytes(c.dtype);
  const int64_t B = c.batch, H = c.heads, Hk = c.kv_heads, T = c.query_length, S = c.key_length;
  const int64_t E = c.head_dim, Ev = c.value_head_dim;
  AttentionBytes b;
  b.output_bytes = B * T * H * Ev * e;
  // convert_boolean_attn_mask: a bias of the query's dtype, for every kernel.
  const int64_t converted_mask = c.has_mask && c.mask_is_bool ? c.mask_elements * e : 0;
  switch (kernel) {
    case AttentionKernel::kFlash: {
      b.logsumexp_bytes = B * H * T * kFloat;
      b.rng_bytes = 2 * 8 + 8;  // rng_state [2] and _unused [] of uint64
      const int64_t rounded_dim = round_up(E, E <= 128 ? 32 : 64);
      b.backward_transient_bytes = B * H * round_up(T, 128) * kFloat + B * round_up(T, 128) * H * rounded_dim * kFloat;
      if (Hk != H) b.backward_transient_bytes += 2 * B * S * H * E * e;
      break;
    }
    case AttentionKernel::kEfficient: {
      b.logsumexp_bytes = c.requires_grad ? B * H * round_up(T, 32) * kFloat : 0;
      if (c.has_mask) {
        const int64_t rows = c.mask_last_dim > 0 ? c.mask_elements / c.mask_last_dim : 0;
        if (c.mask_last_dim % 16 != 0) {
          b.mask_bytes = rows * round_up(c.mask_last_dim, 16) * e;
          b.forward_transient_bytes += converted_mask;
        } else {
          b.mask_bytes = converted_mask;
        }
      }
      if (half(c.dtype) && Ev > 128) b.forward_transient_bytes += B * T * H * Ev * kFloat;
      // The mask is a bias of the query's dtype by then (a float mask of
      // another dtype is refused by the kernel).
      if (c.mask_requires_grad && c.requires_grad) b.mask_gradient_bytes = B * H * T * round_up(S, 16) * e;
      break;
    }
    case AttentionKernel::kCudnn:
      b.logsumexp_bytes = c.requires_grad ? B * H * T * kFloat : 0;
      b.rng_bytes = c.dropout > 0 ? 2 * 8 : 0;
      b.mask_bytes = converted_mask;
      break;
    case AttentionKernel::kMath: {
      // Upcast on CUDA for fp16/bf16 (allowFP16BF16ReductionMathSDP off).
      const int64_t compute = half(c.dtype) ? kFloat : e;
      int64_t saved = B * H * T * E * compute + B * Hk * S * E * compute + B * H * T * S * compute;
      if (c.dropout > 0) saved += B * H * T * S * 1 + B * H * T * S * compute;
      if (half(c.dtype)) saved += B * Hk * S * Ev * kFloat;  // value's fp32 copy, saved by the last matmul
      b.forward_transient_bytes = converted_mask;
      b.kept_bytes = saved;
      return b;
    }
    case AttentionKernel::kNumAttentionKernels:
      break;
  }
  b.kept_bytes = b.output_bytes + b.logsumexp_bytes + b.rng_bytes + b.mask_bytes;
  return b;
}

int64_t AttentionRecord::total_calls() const {
  int64_t total = 0;
  for (int64_t n : calls) total += n;
  return total;
}

std::string attention_text(const AttentionRecord& r) {
  std::vector<std::string> kernels;
  for (std::size_t k = 0; k < kNumAttentionKernels; ++k)
    if (r.calls[k] > 0) kernels.push_back(attention_kernel_name(static_cast<AttentionKernel>(k)));
  std::string kernel_text;
  if (kernels.size() == 1) {
    kernel_text = "kernel " + kernels[0];
  } else {
    std::vector<std::string> parts;
    for (std::size_t k = 0; k < kNumAttentionKernels; ++k)
      if (r.calls[k] > 0)
        parts.push_back(fmt::format("{} x{}", attention_kernel_name(static_cast<AttentionKernel>(k)), r.calls[k]));
    kernel_text = fmt::format("kernels {}", fmt::join(parts, ", "));
  }
  const int64_t calls = r.total_calls();
  std::string text = fmt::format("{} call{}, {} for the CUDA target {}, kept {} (math path would keep {})", calls,
                                 calls == 1 ? "" : "s", kernel_text, r.target, format_bytes(r.kept_bytes),
                                 format_bytes(r.math_kept_bytes));
  if (r.mask_gradient_calls > 0) {
    text += fmt::format("; {} of them with a mask that requires grad (a learned bias)", r.mask_gradient_calls);
    if (r.largest_mask_gradient_bytes > 0)
      text += fmt::format(", whose gradient backward makes at [B, H, T, S]: {} at most",
                          format_bytes(r.largest_mask_gradient_bytes));
  }
  if (r.cudnn_passed_over_calls > 0)
    text += fmt::format(
        "; cuDNN attention, which PyTorch 2.11 prefers on {}, has no gradient for a mask (torch raises \"not "
        "differentiable with respect to argument 'attn_bias'\"), so {} call{} {} counted as PyTorch runs {} "
        "with torch.backends.cuda.enable_cudnn_sdp(False)",
        r.target, r.cudnn_passed_over_calls, r.cudnn_passed_over_calls == 1 ? "" : "s",
        r.cudnn_passed_over_calls == 1 ? "is" : "are", r.cudnn_passed_over_calls == 1 ? "it" : "them");
  return text;
}

int64_t cublas_workspace_bytes(const CudaTarget& target) {
  constexpr int64_t kKiB = 1024;
  constexpr int64_t kHopper = 4096 * 8 * kKiB;                   // 32 MiB ("32MiB for Hopper")
  constexpr int64_t kDefault = 4096 * kKiB * 2 + 16 * kKiB * 8;  // ":4096:2:16:8"
  return target.sm_major >= 9 ? kHopper : kDefault;
}

int64_t cublaslt_workspace_bytes(const CudaTarget&) { return int64_t{1} << 20; }

WorkspaceRecord workspaces_for(const CudaTarget& target, const CublasCalls& calls, bool cudnn_attention,
                               bool in_peaks) {
  WorkspaceRecord r;
  r.cublas_bytes = cublas_workspace_bytes(target);
  r.cublas_workspaces = calls.handles();  // Note [Library workspaces]
  r.cublaslt_bytes = cublaslt_workspace_bytes(target);
  r.cublaslt_workspaces = calls.lt_handles();
  r.cudnn_attention = cudnn_attention;
  r.in_peaks = in_peaks;
  r.target = cuda_target_name(target);
  return r;
}

std::string workspace_text(const WorkspaceRecord& r) {
  std::string text =
      r.cublas_workspaces == 0
          ? fmt::format("cuBLAS none on {}: no operator of the step calls it", r.target)
          : fmt::format("cuBLAS {} x {} = {} on {} ({}){}, held by the caching allocator from the first matmul on: {}",
                        r.cublas_workspaces, format_bytes(r.cublas_bytes),
                        format_bytes(r.cublas_bytes * r.cublas_workspaces), r.target,
                        r.cublas_workspaces == 2 ? "one per handle: forward's thread and autograd's" : "one handle",
                        r.cublaslt_workspaces == 0 ? std::string()
                                                   : fmt::format("; cuBLASLt {} x {} (matmuls with a bias)",
                                                                 r.cublaslt_workspaces, format_bytes(r.cublaslt_bytes)),
                        r.in_peaks ? "in the peaks above" : "not in the peaks above, in the predicted reserved");
  if (r.cudnn_attention) text += "; cuDNN attention's graph workspace: sized by cuDNN at run time, not counted";
  return text;
}

nlohmann::json to_json(const AttentionRecord& r) {
  nlohmann::json calls = nlohmann::json::object();
  for (std::size_t k = 0; k < kNumAttentionKernels; ++k)
    calls[attention_kernel_name(static_cast<AttentionKernel>(k))] = r.calls[k];
  return {{"calls", calls},
          {"kept_bytes", r.kept_bytes},
          {"math_kept_bytes", r.math_kept_bytes},
          {"largest_backward_transient_bytes", r.largest_backward_transient_bytes},
          {"mask_gradient_calls", r.mask_gradient_calls},
          {"largest_mask_gradient_bytes", r.largest_mask_gradient_bytes},
          {"cudnn_passed_over_calls", r.cudnn_passed_over_calls},
          {"target", r.target}};
}

AttentionRecord attention_record_from_json(const nlohmann::json& j) {
  try {
    AttentionRecord r;
    for (std::size_t k = 0; k < kNumAttentionKernels; ++k)
      r.calls[k] = j.at("calls").at(attention_kernel_name(static_cast<AttentionKernel>(k))).get<int64_t>();
    r.kept_bytes = j.at("kept_bytes").get<int64_t>();
    r.math_kept_bytes = j.at("math_kept_bytes").get<int64_t>();
    r.largest_backward_transient_bytes = j.at("largest_backward_transient_bytes").get<int64_t>();
    // Absent before 2026-12-05.
    r.mask_gradient_calls = j.value("mask_gradient_calls", int64_t{0});
    r.largest_mask_gradient_bytes = j.value("largest_mask_gradient_bytes", int64_t{0});
    r.cudnn_passed_over_calls = j.value("cudnn_passed_over_calls", int64_t{0});
    r.target = j.at("target").get<std::string>();
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("probe report: attention: {}", e.what()));
  }
}

nlohmann::json to_json(const WorkspaceRecord& r) {
  return {{"cublas_bytes", r.cublas_bytes},
          {"cublas_workspaces", r.cublas_workspaces},
          {"cublaslt_bytes", r.cublaslt_bytes},
          {"cublaslt_workspaces", r.cublaslt_workspaces},
          {"total_bytes", r.total_bytes()},
          {"cudnn_attention", r.cudnn_attention},
          {"in_peaks", r.in_peaks},
          {"target", r.target}};
}

WorkspaceRecord workspace_record_from_json(const nlohmann::json& j) {
  try {
    WorkspaceRecord r;
    r.cublas_bytes = j.at("cublas_bytes").get<int64_t>();
    r.cublas_workspaces = j.at("cublas_workspaces").get<int64_t>();
    r.cublaslt_bytes = j.value("cublaslt_bytes", int64_t{0});  // absent before 2026-11-29
    r.cublaslt_workspaces = j.value("cublaslt_workspaces", int64_t{0});
    r.cudnn_attention = j.at("cudnn_attention").get<bool>();
    r.in_peaks = j.at("in_peaks").get<bool>();
    r.target = j.at("target").get<std::string>();
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("probe report: workspaces: {}", e.what()));
  }
}

}  // namespace oomtune
