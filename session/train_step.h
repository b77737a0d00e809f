#pragma once
// One micro-batch of a training step, in phases: forward, loss, backward.
// The optimizer step and how micro-batches add up to a global batch are the
// strategies' business (strategies/training_step.h).

#include <functional>
#include <optional>

#include <ATen/ATen.h>

#include "common/phase.h"
#include "session/batch.h"
#include "session/model_session.h"

namespace oomtune {

/// Called at each phase boundary with the phase that begins.
using PhaseHook = std::function<void(Phase)>;

/// Runs forward and loss (under autocast to `autocast_dtype` when given) and
/// backward of loss * `loss_scale`, calling `hook` as each phase begins.
/// Gradients accumulate into the parameters' .grad. Returns the unscaled
/// loss value (NaN on the meta device, which has no values). Throws
/// ModelError for model errors; out-of-memory errors pass
/// through unchanged (the caller records them).
double run_micro_batch(ModelSession& session, const Batch& batch, double loss_scale,
                       std::optional<at::ScalarType> autocast_dtype, const PhaseHook& hook);

/// Sets every parameter's gradient to undefined (PyTorch 2.x's
/// zero_grad(set_to_none=True) default, so gradients are not alive between
/// steps).
void clear_gradients(ModelSession& session);

}  // namespace oomtune
