#pragma once
// The dropout operator `oomtune::dropout`: what the trial runs in place of
// aten::dropout (strategies/kernel_rewrite.h) so that a CPU or meta probe
// allocates and keeps what a CUDA run's dropout does (issue #46 item 6).
//
// Rules:
// - Schema: aten::dropout's (input, p, train) -> Tensor.
// - In training with 0 < p < 1 on a non-empty, non-nested input it runs
//   at::native_dropout on every device, as aten::dropout does on CUDA
//   (Dropout.cpp, is_fused_kernel_acceptable): a bool mask and the output,
//   the mask kept for backward (probes/dropout_record.h). On the CPU that is
//   native_dropout_cpu, whose temporaries are kernel scratch
//   (probes/memory_tracker.h); on meta the kernel probes/meta_kernels.h adds.
//   The masks come from the device's default generator, so checkpointing's
//   recomputation draws them again (strategies/recompute_op.h).
// - Otherwise (evaluation, p = 0 or 1, an empty input) it is aten::dropout,
//   which does the same on every device.
// - Every call of the first kind is counted in the dropout record, read
//   with take_dropout_record.

#include "probes/dropout_record.h"

namespace oomtune {

/// Qualified name of the dropout operator.
constexpr const char* kDropoutOpName = "oomtune::dropout";

/// Registers the operator with the dispatcher if it is not yet (a static
/// initializer in dropout_op.cpp; calling this keeps the linker from
/// dropping it). Idempotent.
void ensure_dropout_op_registered();

/// The calls counted since the last take (or process start), and forgets
/// them. Thread-safe; throws nothing.
DropoutRecord take_dropout_record();

}  // namespace oomtune
