#pragma once
// The CUDA target of a probe, and what scaled_dot_product_attention does
// there: which kernel PyTorch 2.11 picks for a call and what that kernel
// allocates; the library workspaces a CUDA run holds beside the tensors.
// No libtorch: plain records and arithmetic (issue #46).
//
// Rules:
// - oomtune's answers are for eager training on a CUDA GPU, even when the
//   probe runs on the CPU or on meta. The CPU runs SDPA with its own flash
//   kernel (_scaled_dot_product_flash_attention_for_cpu, no dropout) or the
//   math path; meta always takes the math path (_fused_sdp_choice_meta),
//   which materialises B·H·T·S scores. The trial replaces the operator by
//   one that allocates what the CUDA kernel chosen here allocates
//   (strategies/attention_op.h), so both probe devices count the GPU's bytes.
// - Kernel choice: Note [SDPA kernel choice] in attention_model.cpp.
// - Bytes: Note [SDPA kernel bytes] in attention_model.cpp.
// - A mask that requires grad (a learned bias): Note [Mask gradients] in
//   attention_model.cpp.
// - Workspaces (cuBLAS, cuDNN) are reported apart and in no peak:
//   Note [Library workspaces] in attention_model.cpp.

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "probes/memory_records.h"

namespace oomtune {

/// The GPU a probe answers for: its compute capability and the cuDNN the
/// PyTorch build ships. Default: an H100 (sm90) with PyTorch 2.11+cu130's
/// cuDNN 9.19 (the nvidia-cudnn-cu13 9.19.0.56 wheel it depends on).
struct CudaTarget {
  int sm_major = 9;                // compute capability, major
  int sm_minor = 0;                // compute capability, minor
  int64_t cudnn_version = 91900;   // cudnnGetVersion() form: 9.19.0 = 91900
  int multiprocessor_count = 132;  // COUNT: SMs (H100 SXM); informational
};

/// The job spellings of the targets oomtune knows ("sm75" T4, "sm80" A100,
/// "sm86", "sm89", "sm90" H100, "sm100" B200, "sm120"), default "sm90".
constexpr const char* kDefaultCudaTarget = "sm90";
/// The target for a spelling above; nullopt for anything else.
std::optional<CudaTarget> cuda_target_from_name(const std::string& name);
/// "sm90".
std::string cuda_target_name(const CudaTarget& target);

/// The backends of at::SDPBackend (ATen/native/transformers/sdp_utils_cpp.h),
/// in the order of their enum values: math 0, flash 1, efficient 2, cuDNN 3.
enum class AttentionKernel { kMath, kFlash, kEfficient, kCudnn, kNumAttentionKernels };
constexpr std::size_t kNumAttentionKernels = static_cast<std::size_t>(AttentionKernel::kNumAttentionKernels);

/// "math", "flash", "efficient", "cudnn".
std::string attention_kernel_name(AttentionKernel kernel);

/// Element types SDPA sees.
enum class AttentionDtype { kFloat32, kBFloat16, kFloat16, kFloat64 };
/// Bytes of one element.
int64_t element_bytes(AttentionDtype dtype);

/// One dense scaled_dot_product_attention call, as the CUDA kernel would get
/// it: query [batch, heads, query_length, head_dim], key [batch, kv_heads,
/// key_length, head_dim], value [batch, kv_heads, key_length,
/// value_head_dim], all of `dtype` (after autocast).
struct AttentionCall {
  int64_t batch = 1;           // COUNT: B
  int64_t heads = 1;           // COUNT: H
  int64_t kv_heads = 1;        // COUNT: H of key and value (< heads: grouped-query attention)
  int64_t query_length = 1;    // COUNT: T
  int64_t key_length = 1;      // COUNT: S
  int64_t head_dim = 1;        // COUNT: E of query and key
  int64_t value_head_dim = 1;  // COUNT: Ev of value
  AttentionDtype dtype = AttentionDtype::kFloat32;
  bool has_mask = false;            // an attn_mask is passed
  int64_t mask_elements = 0;        // COUNT: elements of the mask as passed (before broadcasting)
  int64_t mask_last_dim = 0;        // COUNT: the mask's last dimension
  bool mask_is_bool = false;        // a boolean mask (converted to a float bias first)
  bool mask_requires_grad = false;  // a float mask that requires grad (a learned bias, as T5's relative positions)
  double dropout = 0.0;             // dropout_p
  bool is_causal = false;           // is_causal
  bool requires_grad = true;        // any of query, key, value requires grad (training)
  bool last_dim_contiguous = true;  // query, key and value have stride 1 in their last dimension
};

/// The kernel PyTorch 2.11's select_sdp_backend
/// (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) picks for `call`
/// on `target`, with every backend enabled and deterministic algorithms off
/// (the defaults), except for a mask that requires grad: see
/// cudnn_passed_over(). Throws nothing.
AttentionKernel select_attention_kernel(const AttentionCall& call, const CudaTarget& target);

/// Whether PyTorch 2.11 would run `call` with the cuDNN kernel, which has no
/// gradient for attn_mask, while the mask requires grad: oomtune then counts
/// the kernel that runs with cuDNN attention disabled (Note [Mask
/// gradients]). Throws nothing.
bool cudnn_passed_over(const AttentionCall& call, const CudaTarget& target);

/// What one call's kernel allocates on the GPU (Note [SDPA kernel bytes]).
struct AttentionBytes {
  int64_t output_bytes = 0;     // SUM: the output [B, T, H, Ev] in the call's dtype
  int64_t logsumexp_bytes = 0;  // SUM: fp32 softmax statistics saved for backward
  int64_t rng_bytes = 0;        // SUM: device RNG state tensors saved for backward
  int64_t mask_bytes = 0;       // SUM: the bias the kernel saves for backward (converted or padded mask), if new
  int64_t forward_transient_bytes = 0;   // SUM: freed before the forward kernel returns
  int64_t backward_transient_bytes = 0;  // SUM: freed before the backward kernel returns (not its gradients)
  // SUM: the efficient kernel's gradient of a mask that requires grad, at
  // the broadcast size [B, H, T, round16(S)] (Note [Mask gradients]).
  int64_t mask_gradient_bytes = 0;
  // SUM: what the kernel makes and autograd keeps for backward (query, key
  // and value are the caller's): for flash, efficient and cuDNN the output,
  // logsumexp, RNG state and a new mask; for math its saved intermediates
  // (the output is not saved there).
  int64_t kept_bytes = 0;
};

/// The bytes of `kernel` for `call`. For kMath: PyTorch 2.11's
/// _scaled_dot_product_attention_math on CUDA (aten/src/ATen/native/
/// transformers/attention.cpp): kept_bytes is what its autograd graph
/// saves (scaled query and key, softmax output, dropout mask and result;
/// fp32 copies for a bf16 or fp16 call, which CUDA upcasts unless
/// allow_fp16_bf16_reduction_math_sdp is set), output_bytes the output.
AttentionBytes attention_bytes(const AttentionCall& call, AttentionKernel kernel);

/// The SDPA calls of one measured step for a CUDA target (one record per
/// trial; strategies/attention_op.h fills it).
struct AttentionRecord {
  std::array<int64_t, kNumAttentionKernels> calls{};  // COUNT: calls per kernel (recomputations included)
  int64_t kept_bytes = 0;                             // SUM: AttentionBytes::kept_bytes of every call
  int64_t math_kept_bytes = 0;                        // SUM: what the math path would have kept instead
  int64_t largest_backward_transient_bytes = 0;       // SUM: the largest one backward call held
  int64_t mask_gradient_calls = 0;                    // COUNT: calls whose mask requires grad (a learned bias)
  int64_t largest_mask_gradient_bytes = 0;            // SUM: the largest AttentionBytes::mask_gradient_bytes of a call
  int64_t cudnn_passed_over_calls = 0;                // COUNT: calls cuDNN would run but for the mask's gradient
  std::string target;                                 // cuda_target_name(), "" when no call ran
  /// Every call, whatever its kernel.
  int64_t total_calls() const;
};

/// The attention line of the probe report: "2 calls, kernel flash for the
/// CUDA target sm90, kept 1.00 MiB (math path would keep 9.00 MiB)", and
/// for masks that require grad how many calls pass one, the largest
/// gradient a call's backward makes of it and whether cuDNN was passed over.
std::string attention_text(const AttentionRecord& record);

/// Library workspaces a CUDA run holds (Note [Library workspaces]).
struct WorkspaceRecord {
  int64_t cublas_bytes = 0;         // SUM: one cuBLAS workspace (getChosenWorkspaceSize)
  int64_t cublas_workspaces = 0;    // COUNT: workspaces of a training step (one per thread that calls cuBLAS, 0-2)
  int64_t cublaslt_bytes = 0;       // SUM: one cuBLASLt workspace (cublaslt_workspace_bytes)
  int64_t cublaslt_workspaces = 0;  // COUNT: one per thread that calls cuBLASLt (addmm with a bias), 0-2
  bool cudnn_attention = false;     // the step ran cuDNN attention (workspace sized at run time)
  bool in_peaks = false;            // the peaks hold them: a CUDA trial, whose allocator made them
  std::string target;               // cuda_target_name()
  /// Every cuBLAS and cuBLASLt workspace: what a CUDA run's allocated bytes carry beside the tensors.
  int64_t total_bytes() const { return cublas_bytes * cublas_workspaces + cublaslt_bytes * cublaslt_workspaces; }
  /// What a CUDA run's allocated bytes add to the peaks this record came
  /// with: total_bytes(), or 0 when the peaks hold them (a CUDA trial).
  int64_t beside_peaks_bytes() const { return in_peaks ? 0 : total_bytes(); }
};

/// The cuBLAS workspace PyTorch 2.11 allocates per (handle, stream) with
/// CUBLAS_WORKSPACE_CONFIG unset (aten/src/ATen/cuda/CublasHandlePool.cpp,
/// parseChosenWorkspaceSize): 32 MiB on sm90 and newer, else
/// ":4096:2:16:8" = 2·4096 KiB + 8·16 KiB = 8,519,680 B.
int64_t cublas_workspace_bytes(const CudaTarget& target);

/// The cuBLASLt workspace PyTorch 2.11 allocates per thread at its first
/// matmul with a bias epilogue: 1 MiB, measured on an H200
/// (scripts/workspace_probe.py; CUBLASLT_WORKSPACE_SIZE's default, 1024
/// KiB, in aten/src/ATen/cuda/CublasHandlePool.cpp), taken for every target.
int64_t cublaslt_workspace_bytes(const CudaTarget& target);

/// The workspace record of a training step for `target`: `calls`' threads
/// that called cuBLAS and cuBLASLt (CublasCalls::handles(), lt_handles(),
/// 0 to 2 each), `cudnn_attention` when a call ran the cuDNN kernel,
/// `in_peaks` on a CUDA trial.
WorkspaceRecord workspaces_for(const CudaTarget& target, const CublasCalls& calls, bool cudnn_attention, bool in_peaks);

/// The workspaces line: "cuBLAS 2 x 32.00 MiB = 64.00 MiB on sm90 (one per
/// handle: forward's thread and autograd's), held by the caching allocator
/// from the first matmul on: not in the peaks above, in the predicted
/// reserved", with "; cuBLASLt 1 x 1.00 MiB (matmuls with a bias)" after
/// the handles when the step ran such a matmul; "cuBLAS none on sm90: no
/// operator of the step calls it".
std::string workspace_text(const WorkspaceRecord& record);

nlohmann::json to_json(const AttentionRecord& record);
AttentionRecord attention_record_from_json(const nlohmann::json& json);
nlohmann::json to_json(const WorkspaceRecord& record);
WorkspaceRecord workspace_record_from_json(const nlohmann::json& json);

}  // namespace oomtune
