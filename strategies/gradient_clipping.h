#pragma once
// Gradient clipping by the global L2 norm, as the user's eager training
// runs it before each optimizer step: torch.nn.utils.clip_grad_norm_(
// model.parameters(), max_norm) in a plain loop, HF Trainer's
// max_grad_norm (through Accelerator.clip_grad_norm_), Lightning's
// gradient_clip_val with gradient_clip_algorithm "norm".
//
// Memory: a few scalars per step and, on CUDA, one temporary the foreach
// norm kernel makes; no temporary of a gradient's size (the scaling is in
// place). Time: two passes over every gradient (the norm, the scaling).
// With fp16, GradScaler.unscale_ runs first (strategies/mixed_precision.h),
// so that max_norm applies to the true gradients.

#include <vector>

#include <ATen/ATen.h>

namespace oomtune {

/// Where clip_grad_norm_ computes: on the training device, whose foreach
/// norm is CUDA's kernel (emulated off CUDA, see clip_grad_norm_), or on
/// the host, over optimizer offload's fp32 master gradients.
enum class ClipPlacement { kDevice, kHost };

/// The bytes of the scratch buffer CUDA's _foreach_norm allocates for one
/// list of `numels` (COUNT, elements of each tensor) in `dtype`: one partial
/// norm per 65536-element chunk (MultiTensorApply.cuh kChunkSize) of the
/// largest tensor, for every tensor, in the opmath type (fp32 for fp16 and
/// bf16; aten/src/ATen/native/cuda/ForeachReduceOp.cu,
/// foreach_tensor_norm_cuda: `at::zeros({ntensors * max_chunks_per_tensor})`).
/// BYTES; 0 for an empty list.
int64_t cuda_foreach_norm_scratch_bytes(const std::vector<int64_t>& numels, at::ScalarType dtype);

/// torch.nn.utils.clip_grad_norm_(params, max_norm) with norm_type 2 and
/// foreach chosen as PyTorch 2.11 chooses it for CUDA and CPU tensors
/// (torch/nn/utils/clip_grad.py, _get_total_norm and _clip_grads_with_norm_):
/// the defined gradients of `params`, grouped by device and dtype, get one
/// _foreach_norm each ([] per gradient, its dtype); the total norm is the
/// vector norm of their stack; every gradient is multiplied in place by
/// min(max_norm / (total + 1e-6), 1) (_foreach_mul_ with a [] tensor).
/// Allocations in order, for N gradients of 4-byte dtype on CUDA: the
/// norm's scratch (cuda_foreach_norm_scratch_bytes, freed inside the call),
/// N norms of 4 B, the stack (4 N B), the total (4 B); the stack and the
/// norms freed; `total + 1e-6`, its reciprocal and that times max_norm (the
/// Python operator `max_norm / t` is `t.reciprocal() * max_norm`,
/// torch/_tensor.py __rdiv__), the clamp: 4 B each.
/// With ClipPlacement::kDevice off CUDA (the CPU probe, meta) the scratch
/// is allocated and freed around the norm as CUDA's kernel does, so the
/// figures are the CUDA run's; with kHost it is not (the CPU kernel has
/// none). Returns the total norm ([] tensor; on meta, without a value), or
/// an undefined tensor when no gradient is defined. `max_norm` >= 0 (0
/// zeroes the gradients, as PyTorch does; callers skip clipping at 0).
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                           ClipPlacement placement = ClipPlacement::kDevice);

}  // namespace oomtune
