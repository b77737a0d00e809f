#pragma once
// The loss of a training step, computed from the model's output.

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include "job/job_spec.h"
#include "session/batch.h"

namespace oomtune {

/// Picks the tensor the loss reads from a model output, per `selector`:
/// a lone tensor needs no selector; a dict needs a key, a tuple/list an
/// index. `want_loss` (model_returns_loss) also accepts a dict's "loss".
/// Throws ModelError naming `model_path` and listing the dict's keys or the
/// tuple's arity when the selector does not fit the output.
at::Tensor select_output(const c10::IValue& output, const OutputSelector& selector, bool want_loss,
                         const std::string& model_path);

/// The scalar loss, mean-reduced, computed in fp32:
/// - cross_entropy: output [..., C] logits vs integer target [...];
/// - mse: output vs target of the same shape;
/// - mean: output.mean();
/// - model_returns_loss: the selected output itself (must be a scalar).
/// Throws ModelError when shapes or dtypes do not fit, naming the tensors.
at::Tensor compute_loss(const JobSpec& job, const at::Tensor& output, const Batch& batch);

}  // namespace oomtune
