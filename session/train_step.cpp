#include "session/train_step.h"

#include <cmath>

#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include "common/error.h"
#include "session/autocast_scope.h"
#include "session/loss.h"

namespace oomtune {

double run_micro_batch(ModelSession& session, const Batch& batch, double loss_weight, const LossScaling& scale_loss,
                       std::optional<at::ScalarType> autocast_dtype, const PhaseHook& hook) {
  const JobSpec& job = session.job();
  at::Tensor loss;
  {
    AutocastScope autocast(session.device(), autocast_dtype);
    hook(Phase::kForward);
    c10::IValue output = session.forward(batch);
    hook(Phase::kLoss);
    const bool want_loss = job.loss.kind == LossSpec::Kind::kModelReturnsLoss;
    at::Tensor selected = select_output(output, job.output, want_loss, job.model_path);
    output = c10::IValue();  // drop the other outputs before backward, as eager code does
    loss = compute_loss(job, selected, batch);
  }
  // A meta loss has no value to read (its kernels compute shapes only).
  const double value = loss.is_meta() ? std::nan("") : loss.item<double>();
  hook(Phase::kBackward);
  try {
    at::Tensor weighted = loss_weight == 1.0 ? loss : loss * loss_weight;
    if (scale_loss) weighted = scale_loss(weighted);
    torch::autograd::backward({weighted});
  } catch (const std::exception& e) {
    if (is_out_of_memory(e)) throw;
    const std::string cause = one_line(error_text(e));
    throw ModelError(fmt::format("{}: backward failed: {}{}", job.model_path, cause, dtype_hints(job, cause)));
  }
  return value;
}

void clear_gradients(ModelSession& session) {
  for (at::Tensor p : session.parameters()) p.mutable_grad() = at::Tensor();
}

}  // namespace oomtune
