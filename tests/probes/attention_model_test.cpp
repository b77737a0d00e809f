// The CUDA target's SDPA kernel choice and bytes (probes/attention_model.h),
// against PyTorch 2.11's select_sdp_backend (cuda/sdp_utils.cpp) and the
// kernels' allocations written out from B, H, T, E here.

#include <gtest/gtest.h>

#include "probes/attention_model.h"

namespace oomtune {
namespace {

CudaTarget target(const char* name) { return cuda_target_from_name(name).value(); }

AttentionCall call(AttentionDtype dtype, int64_t head_dim = 64) {
  AttentionCall c;
  c.batch = 4;
  c.heads = 8;
  c.kv_heads = 8;
  c.query_length = 1024;
  c.key_length = 1024;
  c.head_dim = head_dim;
  c.value_head_dim = head_dim;
  c.dtype = dtype;
  c.is_causal = true;
  return c;
}

TEST(AttentionModel, DefaultTargetIsAnH100WithTheCu130CuDnn) {
  const CudaTarget t;
  EXPECT_EQ(cuda_target_name(t), "sm90");
  EXPECT_EQ(t.cudnn_version, 91900);
  EXPECT_EQ(cuda_target_name(target(kDefaultCudaTarget)), "sm90");
  EXPECT_FALSE(cuda_target_from_name("sm70"));
}

// One row per case: what PyTorch 2.11 + cuDNN 9.19 picks.
TEST(AttentionModel, KernelChoiceTable) {
  const AttentionDtype bf16 = AttentionDtype::kBFloat16, fp32 = AttentionDtype::kFloat32;
  // sm80: flash for bf16, efficient for fp32 (flash takes fp16/bf16 only).
  EXPECT_EQ(select_attention_kernel(call(bf16), target("sm80")), AttentionKernel::kFlash);
  EXPECT_EQ(select_attention_kernel(call(fp32), target("sm80")), AttentionKernel::kEfficient);
  // sm90 with cuDNN > 9.15: cuDNN first (check_prefer_cudnn_attention).
  EXPECT_EQ(select_attention_kernel(call(bf16), target("sm90")), AttentionKernel::kCudnn);
  EXPECT_EQ(select_attention_kernel(call(fp32), target("sm90")), AttentionKernel::kEfficient);
  CudaTarget old_cudnn = target("sm90");
  old_cudnn.cudnn_version = 91002;
  EXPECT_EQ(select_attention_kernel(call(bf16), old_cudnn), AttentionKernel::kFlash);
  // A mask rules out flash: efficient on sm80.
  AttentionCall masked = call(bf16);
  masked.has_mask = true;
  EXPECT_EQ(select_attention_kernel(masked, target("sm80")), AttentionKernel::kEfficient);
  // Head dim 160 on sm80: flash takes up to 256.
  EXPECT_EQ(select_attention_kernel(call(bf16, 160), target("sm80")), AttentionKernel::kFlash);
  // Head dim 200 training on sm86: flash refuses (192, 224]; efficient.
  EXPECT_EQ(select_attention_kernel(call(bf16, 200), target("sm86")), AttentionKernel::kEfficient);
  // Head dim 300 in bf16: over flash's 256, not a multiple of efficient's 8: math.
  EXPECT_EQ(select_attention_kernel(call(bf16, 300), target("sm80")), AttentionKernel::kMath);
  // fp32 with head dim 6: efficient needs a multiple of 4: math.
  EXPECT_EQ(select_attention_kernel(call(fp32, 6), target("sm80")), AttentionKernel::kMath);
  // float64: math.
  EXPECT_EQ(select_attention_kernel(call(AttentionDtype::kFloat64), target("sm80")), AttentionKernel::kMath);
  // Causal with T != S: not flash.
  AttentionCall cross = call(bf16);
  cross.key_length = 512;
  EXPECT_EQ(select_attention_kernel(cross, target("sm80")), AttentionKernel::kEfficient);
  // A non-unit last stride: math.
  AttentionCall strided = call(bf16);
  strided.last_dim_contiguous = false;
  EXPECT_EQ(select_attention_kernel(strided, target("sm80")), AttentionKernel::kMath);
}

// A T4 (sm75): no flash and no cuDNN attention below sm80, and the
// efficient kernel takes fp16 and fp32 only there, with a GEMM alignment of
// 8 for fp16 (tensor cores) and 1 for fp32 (none: minimum_gemm_alignment).
TEST(AttentionModel, OnATuringGpuTheEfficientKernelOrMath) {
  const AttentionDtype fp16 = AttentionDtype::kFloat16, bf16 = AttentionDtype::kBFloat16;
  const AttentionDtype fp32 = AttentionDtype::kFloat32;
  const CudaTarget t4 = target("sm75");
  EXPECT_EQ(cuda_target_name(t4), "sm75");
  EXPECT_EQ(select_attention_kernel(call(fp16), t4), AttentionKernel::kEfficient);
  EXPECT_EQ(select_attention_kernel(call(fp32), t4), AttentionKernel::kEfficient);
  EXPECT_EQ(select_attention_kernel(call(bf16), t4), AttentionKernel::kMath);
  EXPECT_EQ(select_attention_kernel(call(fp16, 36), t4), AttentionKernel::kMath);
  EXPECT_EQ(select_attention_kernel(call(fp32, 36), t4), AttentionKernel::kEfficient);
  EXPECT_EQ(select_attention_kernel(call(fp32, 6), t4), AttentionKernel::kEfficient);
  // A learned mask: efficient gives it its gradient on a T4, where cuDNN,
  // which would refuse it on an H100, is never in the running.
  AttentionCall learned = call(fp16);
  learned.has_mask = true;
  learned.mask_requires_grad = true;
  EXPECT_EQ(select_attention_kernel(learned, t4), AttentionKernel::kEfficient);
  EXPECT_FALSE(cudnn_passed_over(learned, t4));
  EXPECT_TRUE(cudnn_passed_over(learned, target("sm90")));
  // cuBLAS's default workspace below Hopper: ":4096:2:16:8".
  EXPECT_EQ(cublas_workspace_bytes(t4), 2 * 4096 * 1024 + 8 * 16 * 1024);
}

TEST(AttentionModel, FlashKeepsOutputAndLogsumexpNotScores) {
  const AttentionCall c = call(AttentionDtype::kBFloat16);
  const int64_t B = 4, H = 8, T = 1024, E = 64;
  const AttentionBytes flash = attention_bytes(c, AttentionKernel::kFlash);
  EXPECT_EQ(flash.output_bytes, B * T * H * E * 2);
  EXPECT_EQ(flash.logsumexp_bytes, B * H * T * 4);
  EXPECT_EQ(flash.rng_bytes, 24);
  EXPECT_EQ(flash.kept_bytes, B * T * H * E * 2 + B * H * T * 4 + 24);
  EXPECT_EQ(flash.backward_transient_bytes, B * H * T * 4 + B * T * H * E * 4);  // softmax_d, dq_accum
  // Math on CUDA upcasts bf16: scaled q, k, softmax scores and v in fp32.
  const AttentionBytes math = attention_bytes(c, AttentionKernel::kMath);
  EXPECT_EQ(math.kept_bytes, B * H * T * E * 4 * 2 + B * H * T * T * 4 + B * H * T * E * 4);
  const AttentionBytes efficient = attention_bytes(call(AttentionDtype::kFloat32), AttentionKernel::kEfficient);
  EXPECT_EQ(efficient.kept_bytes, B * T * H * E * 4 + B * H * T * 4);  // T = 1024 is a multiple of 32
}

TEST(AttentionModel, AttentionLineNamesKernelTargetAndBothFigures) {
  AttentionRecord r;
  r.calls[static_cast<std::size_t>(AttentionKernel::kFlash)] = 2;
  r.kept_bytes = 2 << 20;
  r.math_kept_bytes = 18 << 20;
  r.target = "sm80";
  EXPECT_EQ(attention_text(r),
            "2 calls, kernel flash for the CUDA target sm80, kept 2.00 MiB (math path would keep 18.00 MiB)");
  EXPECT_EQ(attention_record_from_json(to_json(r)).math_kept_bytes, r.math_kept_bytes);
}

// A learned bias (a float mask that requires grad; Note [Mask gradients]):
// cuDNN, which has no gradient for it, is passed over where PyTorch would
// prefer it; the efficient kernel's backward makes the gradient at the
// broadcast size with the last dimension rounded up to 16.
TEST(AttentionModel, AMaskThatRequiresGradPassesOverCudnnAndGetsABroadcastGradient) {
  AttentionCall c = call(AttentionDtype::kBFloat16);
  c.is_causal = false;
  c.key_length = 1000;  // not a multiple of 16
  c.has_mask = true;
  c.mask_elements = 8 * 1024 * 1000;  // [1, H, T, S]
  c.mask_last_dim = 1000;
  EXPECT_EQ(select_attention_kernel(c, target("sm90")), AttentionKernel::kCudnn);
  EXPECT_FALSE(cudnn_passed_over(c, target("sm90")));
  EXPECT_EQ(attention_bytes(c, AttentionKernel::kEfficient).mask_gradient_bytes, 0);
  c.mask_requires_grad = true;
  EXPECT_EQ(select_attention_kernel(c, target("sm90")), AttentionKernel::kEfficient);
  EXPECT_TRUE(cudnn_passed_over(c, target("sm90")));
  // On sm80 PyTorch takes the efficient kernel anyway (flash takes no mask).
  EXPECT_EQ(select_attention_kernel(c, target("sm80")), AttentionKernel::kEfficient);
  EXPECT_FALSE(cudnn_passed_over(c, target("sm80")));
  const AttentionBytes b = attention_bytes(c, AttentionKernel::kEfficient);
  EXPECT_EQ(b.mask_gradient_bytes, int64_t{4} * 8 * 1024 * 1008 * 2);  // B, H, T, round16(S), bf16
  // The padded copy of the mask [1, H, T, 1008] is kept for backward, as before.
  EXPECT_EQ(b.mask_bytes, int64_t{8} * 1024 * 1008 * 2);
  // Without training there is no gradient.
  c.requires_grad = false;
  EXPECT_EQ(attention_bytes(c, AttentionKernel::kEfficient).mask_gradient_bytes, 0);
}

TEST(AttentionModel, AttentionLineSaysWhichCallsTrainAMaskAndThatCudnnWasPassedOver) {
  AttentionRecord r;
  r.calls[static_cast<std::size_t>(AttentionKernel::kEfficient)] = 4;
  r.calls[static_cast<std::size_t>(AttentionKernel::kCudnn)] = 2;
  r.kept_bytes = 1 << 20;
  r.math_kept_bytes = 8 << 20;
  r.mask_gradient_calls = 4;
  r.largest_mask_gradient_bytes = 128 << 10;
  r.cudnn_passed_over_calls = 4;
  r.target = "sm90";
  EXPECT_EQ(attention_text(r),
            "6 calls, kernels efficient x4, cudnn x2 for the CUDA target sm90, kept 1.00 MiB (math path would keep "
            "8.00 MiB); 4 of them with a mask that requires grad (a learned bias), whose gradient backward makes at "
            "[B, H, T, S]: 128.00 KiB at most; cuDNN attention, which PyTorch 2.11 prefers on sm90, has no gradient "
            "for a mask (torch raises \"not differentiable with respect to argument 'attn_bias'\"), so 4 calls are "
            "counted as PyTorch runs them with torch.backends.cuda.enable_cudnn_sdp(False)");
  const AttentionRecord back = attention_record_from_json(to_json(r));
  EXPECT_EQ(back.mask_gradient_calls, 4);
  EXPECT_EQ(back.largest_mask_gradient_bytes, 128 << 10);
  EXPECT_EQ(back.cudnn_passed_over_calls, 4);
  // A report written before these fields reads as none.
  nlohmann::json old = to_json(r);
  old.erase("mask_gradient_calls");
  old.erase("largest_mask_gradient_bytes");
  old.erase("cudnn_passed_over_calls");
  EXPECT_EQ(attention_record_from_json(old).mask_gradient_calls, 0);
  EXPECT_EQ(attention_record_from_json(old).cudnn_passed_over_calls, 0);
}

// The threads that called cuBLAS: `handles` of them (training, then
// autograd's); `lt` of them (the same order) through cuBLASLt.
CublasCalls calls_on(int handles, int lt = 0) {
  CublasCalls c;
  if (handles > 0) c.training_thread = CublasCall{0, Phase::kForward};
  if (handles > 1) c.autograd_thread = CublasCall{1, Phase::kBackward};
  if (lt > 0) c.lt_training_thread = CublasCall{0, Phase::kForward};
  if (lt > 1) c.lt_autograd_thread = CublasCall{1, Phase::kBackward};
  return c;
}

// CublasHandlePool.cpp, parseChosenWorkspaceSize with CUBLAS_WORKSPACE_CONFIG
// unset; cuBLASLt's 1 MiB as measured on an H200 (scripts/workspace_probe.py).
TEST(AttentionModel, CublasWorkspaceDefaults) {
  EXPECT_EQ(cublaslt_workspace_bytes(target("sm90")), 1024 * 1024);
  EXPECT_EQ(cublas_workspace_bytes(target("sm90")), 32 * 1024 * 1024);
  EXPECT_EQ(cublas_workspace_bytes(target("sm80")), 2 * 4096 * 1024 + 8 * 16 * 1024);
  const WorkspaceRecord w = workspaces_for(target("sm80"), calls_on(2), false, false);
  EXPECT_EQ(w.total_bytes(), 2 * 8519680);
  EXPECT_EQ(workspace_text(w),
            "cuBLAS 2 x 8.12 MiB = 16.25 MiB on sm80 (one per handle: forward's thread and autograd's), held by the "
            "caching allocator from the first matmul on: not in the peaks above, in the predicted reserved");
  const WorkspaceRecord back = workspace_record_from_json(to_json(w));
  EXPECT_EQ(back.cublas_bytes, w.cublas_bytes);
  EXPECT_EQ(back.cublas_workspaces, 2);
  EXPECT_FALSE(back.in_peaks);
  // A forward with a bias matmul (training thread) and a checkpointed
  // recomputation of one (autograd's): two cuBLASLt workspaces more.
  const WorkspaceRecord lt = workspaces_for(target("sm90"), calls_on(2, 2), false, false);
  EXPECT_EQ(lt.total_bytes(), 2 * 32 * 1024 * 1024 + 2 * 1024 * 1024);
  EXPECT_EQ(workspace_text(lt),
            "cuBLAS 2 x 32.00 MiB = 64.00 MiB on sm90 (one per handle: forward's thread and autograd's); cuBLASLt 2 x "
            "1.00 MiB (matmuls with a bias), held by the caching allocator from the first matmul on: not in the peaks "
            "above, in the predicted reserved");
  EXPECT_EQ(workspace_record_from_json(to_json(lt)).total_bytes(), lt.total_bytes());
}

// One thread called cuBLAS, or none; on a GPU the allocator's figures hold
// them.
TEST(AttentionModel, WorkspaceLineSaysHowManyHandlesAndWhereTheyAreCounted) {
  const WorkspaceRecord one = workspaces_for(target("sm90"), calls_on(1), false, true);
  EXPECT_EQ(one.total_bytes(), 32 * 1024 * 1024);
  EXPECT_EQ(workspace_text(one),
            "cuBLAS 1 x 32.00 MiB = 32.00 MiB on sm90 (one handle), held by the caching allocator from the first "
            "matmul on: in the peaks above");
  EXPECT_TRUE(workspace_record_from_json(to_json(one)).in_peaks);
  const WorkspaceRecord none = workspaces_for(target("sm90"), calls_on(0), true, false);
  EXPECT_EQ(none.total_bytes(), 0);
  EXPECT_EQ(workspace_text(none),
            "cuBLAS none on sm90: no operator of the step calls it; cuDNN attention's graph workspace: sized by "
            "cuDNN at run time, not counted");
}

}  // namespace
}  // namespace oomtune
