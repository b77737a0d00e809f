#pragma once
// CUDA's autocast op lists for a CPU trial's autocast (issue #46 item 6).
//
// Rules:
// - oomtune answers for eager CUDA training. Under `torch.autocast("cuda")`
//   softmax, log_softmax, layer_norm, group_norm, exp, pow, sum, cumsum,
//   rsqrt and the other ops of AT_FORALL_FP32 and
//   AT_FORALL_FP32_SET_OPT_DTYPE run in fp32, and addmv, mv, einsum, the
//   RNN cells and the others of AT_FORALL_LOWER_PRECISION_FP in the
//   autocast dtype (PyTorch 2.11, aten/src/ATen/autocast_mode.h and .cpp,
//   the AutocastCUDA registrations). CPU autocast's lists lack them, so a
//   CPU trial's attention softmax stayed in bf16 where CUDA's is fp32 (and
//   the matmul after it then keeps a bf16 copy): the CPU kept fewer bytes
//   than the GPU it answers for.
// - install_cuda_autocast_policy registers, for DispatchKey::AutocastCPU,
//   CUDA's policy for every op of those lists (and AT_FORALL_PROMOTE's)
//   that CPU autocast has no policy for, through ATen's own wrappers
//   (at::autocast::WrapFunction with DeviceType::CPU: the cast dtype is
//   CPU autocast's, bf16). Ops both lists name keep the CPU's policy, the
//   same cast but for prod (CPU: fp32 copy; CUDA: fp32 dtype argument) and
//   grid_sampler (CPU: fp32; CUDA: promote); ops only the CPU lists name
//   (cross_entropy_loss, the linear algebra, fft, stack and cat) keep it
//   too: oomtune's own loss casts the logits to fp32 before
//   cross_entropy_loss (session/loss.h), so its policy casts nothing.
// - libtorch 1.13's header has no such lists: nothing is registered there
//   and the CPU's lists stay (cuda_autocast_policy_installed() is false).

namespace oomtune {

/// Registers the policy above, once per process; later calls do nothing.
/// Call before a CPU trial runs under autocast. Throws nothing of its own.
void install_cuda_autocast_policy();

/// Whether this build registers CUDA's lists (libtorch 2 with them in
/// ATen/autocast_mode.h).
bool cuda_autocast_policy_available();

}  // namespace oomtune
