#pragma once
// CUDA's autocast, run on CPU and meta tensors (issue #46 items 1 and 6).
//
// Rules:
// - oomtune answers for eager CUDA training, so a bf16 trial on the CPU or
//   on the meta device casts as `torch.autocast("cuda", dtype)` does: the
//   ops of AT_FORALL_LOWER_PRECISION_FP (linear, matmul, conv, bmm, SDPA,
//   ...) in the autocast dtype; those of AT_FORALL_FP32 (exp, pow,
//   layer_norm, group_norm, the losses, ...) and AT_FORALL_FP32_SET_OPT_DTYPE
//   (softmax, log_softmax, sum, cumsum, prod, ...) in fp32; norm through
//   its dtype overload (AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE); those of
//   AT_FORALL_PROMOTE in their widest input dtype; every other op in its
//   inputs' dtype (PyTorch 2.11, aten/src/ATen/autocast_mode.h, and
//   autocast_mode.cpp, whose `TORCH_LIBRARY_IMPL(aten, Autocast, m)` is
//   CUDA's). CPU autocast's own lists lack softmax, layer_norm, sum and
//   the rest (its attention softmax stayed bf16 where CUDA's is fp32), and
//   libtorch has no autocast for meta tensors at all: their dispatch keys
//   carry no Autocast key (c10/core/DispatchKeySet.h,
//   getAutocastRelatedKeySetFromBackend), so a meta run kept fp32
//   activations.
// - How: the policies are registered for DispatchKey::AutocastPrivateUse1,
//   which libtorch registers nothing for (no kernels, no fallback) and no
//   oomtune device uses. Turning this autocast on puts that key into the
//   thread's included dispatch keys, so every op reaches it whatever its
//   tensors' device; an op without a policy falls through. The wrappers
//   are ATen's (WrapFunction_ in autocast_mode.h) with one difference: a
//   tensor is eligible on the CPU or on meta, where CUDA's is eligible on
//   CUDA. The cast cache is ATen's too: the autocast-dtype copy of an fp32
//   leaf that requires grad (a weight) is made once and reused until the
//   cache is cleared (clear_emulated_cuda_autocast_cache, at the end of the
//   autocast region, as torch.autocast's __exit__ does).
// - Not emulated: binary_cross_entropy, which CUDA autocast refuses (its
//   ban), and cudnn_convolution(_transpose), which CPU and meta never call
//   (conv2d and the others are cast before).
// - libtorch 1.13's header has no such lists: cuda_autocast_available() is
//   false there and CPU trials keep the CPU's autocast (and meta, which 1.13
//   cannot run anyway, none).

#include <c10/core/ScalarType.h>

namespace oomtune {

/// Whether this build has CUDA's lists to emulate (libtorch 2: true).
bool cuda_autocast_available();

/// Turns the emulation on, casting to `dtype` (bf16 or fp16), or off, in
/// this thread; the kernels are registered on the first call. Throws
/// std::logic_error when !cuda_autocast_available().
void set_emulated_cuda_autocast(bool enabled, at::ScalarType dtype);

/// Whether the emulation is on in this thread (off inside its own kernels,
/// which exclude it as ATen's exclude theirs).
bool emulated_cuda_autocast_enabled();

/// The dtype the emulation casts to in this thread (bf16 unless set).
at::ScalarType emulated_cuda_autocast_dtype();

/// Drops this thread's cached weight casts (at::autocast::clear_cache's
/// counterpart), the first made first: an order of their own, since
/// ATen's, its hash map's, follows the weights' addresses.
void clear_emulated_cuda_autocast_cache();

}  // namespace oomtune
