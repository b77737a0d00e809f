#pragma once
// Replaces aten::scaled_dot_product_attention in a TorchScript model by the
// attention operator oomtune::scaled_dot_product_attention
// (strategies/attention_op.h), so that a CPU or meta probe allocates what
// the CUDA target's kernel allocates (issue #46).
//
// Rules:
// - Every method graph of the module and of its submodules' classes, nested
//   blocks (if, loop) included; each class's methods once.
// - The call keeps its arguments; a file exported before enable_gqa existed
//   (PyTorch < 2.5: seven arguments) gets enable_gqa = False.
// - Call right after loading, before the module first runs (the graph
//   executor keeps the graph it compiled at the first run), as
//   apply_checkpointing. A model without the operator is left as it is.
// - libtorch 1.13 cannot load a model with the operator: nothing to do
//   there (0 calls).

#include <cstdint>

#include <torch/csrc/jit/api/module.h>

namespace oomtune {

/// Rewrites `module`'s graphs as above; returns the number of call sites
/// replaced (COUNT). Throws nothing of its own.
int64_t replace_attention(torch::jit::Module& module);

}  // namespace oomtune
