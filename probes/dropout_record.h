#pragma once
// What dropout keeps for backward on a CUDA target, against what the probe
// device's own dropout would keep. No libtorch: a plain record (issue #46
// item 6).
//
// Rules:
// - aten::dropout is composite: on CUDA (input.is_cuda(), 0 < p < 1, a
//   non-empty input) it runs the fused at::native_dropout, which allocates a
//   1-byte bool mask, then the output, and autograd keeps the mask
//   (aten/src/ATen/native/Dropout.cpp, is_fused_kernel_acceptable;
//   native/cuda/Dropout.cu, dropout_cuda; derivatives.yaml, native_dropout:
//   result1). On the CPU and on meta it runs `input * noise`, where noise is
//   a tensor of the input's dtype (4 bytes an element in fp32) that autograd
//   keeps for mul's backward (_dropout_impl). Backward allocates the input's
//   gradient on either.
// - The trial puts oomtune::dropout in aten::dropout's place
//   (strategies/dropout_op.h), which allocates CUDA's mask and output on
//   every probe device; this record counts its calls.
// - In-place dropout_, feature (Dropout2d) and alpha dropout take the
//   composite path on CUDA too: not replaced, not counted.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace oomtune {

/// The training-mode dropout calls of one measured step (recomputations
/// included), as a CUDA run makes them.
struct DropoutRecord {
  int64_t calls = 0;                 // COUNT: calls that ran CUDA's fused kernel (train, 0 < p < 1)
  int64_t kept_bytes = 0;            // SUM: bool masks kept for backward (1 byte an element)
  int64_t composite_kept_bytes = 0;  // SUM: the noise the CPU's and meta's composite dropout would keep instead
};

/// The dropout line of the probe report: "9 calls, CUDA's fused kernel
/// keeps 1-byte masks: 3.25 MiB of them in the step, summed over its
/// micro-batches and recomputations (the composite dropout of the CPU and
/// meta would keep 13.00 MiB of noise)": a sum, not what is held at once
/// (a step of 4 micro-batches makes 4 micro-batches' masks, one at a time).
std::string dropout_text(const DropoutRecord& record);

nlohmann::json to_json(const DropoutRecord& record);
/// Throws InputError naming the missing or mistyped key.
DropoutRecord dropout_record_from_json(const nlohmann::json& json);

}  // namespace oomtune
