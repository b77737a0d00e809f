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

/// What backward runs from, given the weighted loss: fp16's loss scaling
/// (GradScaler.scale, strategies/mixed_precision.h), or none (empty).
using LossScaling = std::function<at::Tensor(const at::Tensor& loss)>;

/// Runs forward and loss (under autocast to `autocast_dtype` when given) and
/// backward of `scale_loss`(loss * `loss_weight`) (the multiplication only
/// when the weight is not 1, as eager code divides by the accumulation
/// steps), calling `hook` as each phase begins. Gradients accumulate into
/// the parameters' .grad. Returns the loss value before weighting and
/// scaling (NaN on the meta device, which has no values). Throws
/// ModelError for model errors; out-of-memory errors pass through unchanged
/// (the caller records them).
double run_micro_batch(ModelSession& session, const Batch& batch, double loss_weight, const LossScaling& scale_loss,
                       std::optional<at::ScalarType> autocast_dtype, const PhaseHook& hook);

/// Sets every parameter's gradient to undefined (PyTorch 2.x's
/// zero_grad(set_to_none=True) default, so gradients are not alive between
/// steps).
void clear_gradients(ModelSession& session);

}  // namespace oomtune
