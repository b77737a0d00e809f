#pragma once
// The attention operator `oomtune::scaled_dot_product_attention`: what the
// trial runs in place of aten::scaled_dot_product_attention
// (strategies/attention_rewrite.h) so that a CPU or meta probe allocates
// what the CUDA target's kernel allocates (issue #46).
//
// Rules:
// - Schema: aten::scaled_dot_product_attention's (query, key, value,
//   attn_mask, dropout_p, is_causal, scale, enable_gqa) -> Tensor.
// - Kernel: select_attention_kernel (probes/attention_model.h) for the
//   target set with set_attention_target, on the call's shapes and dtype;
//   under CPU autocast query, key and value are first cast to the autocast
//   dtype, as CUDA autocast casts SDPA's arguments (lower_precision_fp,
//   ATen/autocast_mode.cpp).
// - flash, efficient, cuDNN: a torch::autograd::Function whose forward
//   allocates the kernel's output ([B, T, H, Ev], returned transposed to
//   [B, H, T, Ev]), logsumexp, RNG state and mask bias (Note [SDPA kernel
//   bytes] in probes/attention_model.cpp) and saves them with query, key and
//   value; its backward allocates the gradients and, for the kernel's run,
//   its fp32 accumulators. On the CPU the values come from ATen's own SDPA
//   run inside a KernelScratchScope (probes/memory_tracker.h), so its
//   temporaries are kernel scratch and only the CUDA kernel's bytes count;
//   dropout masks repeat in backward (the CPU generator's state is saved,
//   as host memory). On meta nothing is computed.
// - math: at::_scaled_dot_product_attention_math with ATen's autograd, on
//   either device (the CPU's and meta's math is CUDA's without its fp32
//   upcast of fp16/bf16; the record's figures are CUDA's).
// - A mask that requires grad (a learned bias) gets its gradient: the
//   efficient kernel's backward allocates it at [B, H, T, round16(S)] and
//   autograd sums it to the mask's shape; on the math path ATen's autograd
//   computes it; cuDNN, which has none, is not chosen for such a call (Note
//   [Mask gradients] in probes/attention_model.cpp).
// - Every call is counted in the attention record (calls per kernel, kept
//   bytes, what math would keep), read with take_attention_record.

#include <optional>

#include "probes/attention_model.h"

namespace oomtune {

/// Qualified name of the attention operator.
constexpr const char* kAttentionOpName = "oomtune::scaled_dot_product_attention";

/// Registers the operator with the dispatcher if it is not yet (a static
/// initializer in attention_op.cpp; calling this keeps the linker from
/// dropping it). Idempotent.
void ensure_attention_op_registered();

/// The GPU the operator's calls answer for, for this process (default
/// CudaTarget{}). Thread-safe.
void set_attention_target(const CudaTarget& target);

/// The calls counted since the last take (or process start), and forgets
/// them. Thread-safe; throws nothing.
AttentionRecord take_attention_record();

}  // namespace oomtune
