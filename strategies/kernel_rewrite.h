#pragma once
// Replaces the operators whose memory depends on the device's kernel in a
// TorchScript model by oomtune's, so that a CPU or meta probe allocates
// what the CUDA target's kernels allocate (issue #46):
// - aten::scaled_dot_product_attention by
//   oomtune::scaled_dot_product_attention (strategies/attention_op.h);
// - aten::dropout by oomtune::dropout (strategies/dropout_op.h).
//
// Rules:
// - Every method graph of the module and of its submodules' classes, nested
//   blocks (if, loop) included; each class's methods once.
// - A call keeps its arguments; an attention call of a file exported before
//   enable_gqa existed (PyTorch < 2.5: seven arguments) gets
//   enable_gqa = False.
// - Call right after loading, before the module first runs (the graph
//   executor keeps the graph it compiled at the first run), as
//   apply_checkpointing. A model without the operators is left as it is.
// - libtorch 1.13 cannot load a model with scaled_dot_product_attention,
//   and has no oomtune::scaled_dot_product_attention: dropout only there.

#include <cstdint>

#include <torch/csrc/jit/api/module.h>

namespace oomtune {

/// The call sites replace_device_kernels replaced (COUNT each).
struct KernelSites {
  int64_t attention = 0;  // aten::scaled_dot_product_attention
  int64_t dropout = 0;    // aten::dropout
};

/// Rewrites `module`'s graphs as above. Throws nothing of its own.
KernelSites replace_device_kernels(torch::jit::Module& module);

}  // namespace oomtune
