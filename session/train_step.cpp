#include "session/train_step.h"

#include <cmath>

#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include "common/error.h"
#include "compat/torch_compat.h"
#include "session/cuda_autocast.h"
#include "session/loss.h"

namespace oomtune {
namespace {

/// Autocast on for the device of the session while alive (eager PyTorch's
/// `with torch.autocast(device, dtype)`), cache cleared on exit. On the CPU
/// and on meta it is CUDA's, emulated (session/cuda_autocast.h); on a
/// libtorch without CUDA's lists the CPU's own.
class AutocastScope {
 public:
  AutocastScope(at::Device device, std::optional<at::ScalarType> dtype)
      : cuda_(device.is_cuda()), emulated_(!cuda_ && cuda_autocast_available()), active_(dtype.has_value()) {
    if (active_) set(true, *dtype);
  }
  ~AutocastScope() {
    if (!active_) return;
    set(false, at::kBFloat16);
    compat::clear_autocast_cache();
    clear_emulated_cuda_autocast_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  void set(bool enabled, at::ScalarType dtype) const {
    if (cuda_)
      compat::set_cuda_autocast(enabled, enabled ? dtype : at::kHalf);
    else if (emulated_)
      set_emulated_cuda_autocast(enabled, dtype);
    else
      compat::set_cpu_autocast(enabled, dtype);
  }

  bool cuda_, emulated_, active_;
};

}  // namespace

double run_micro_batch(ModelSession& session, const Batch& batch, double loss_scale,
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
    torch::autograd::backward({loss_scale == 1.0 ? loss : loss * loss_scale});
  } catch (const std::exception& e) {
    if (is_out_of_memory(e)) throw;
    const std::string cause = one_line(error_text(e));
    throw ModelError(fmt::format("{}: backward failed: {}{}", job.model_path, cause, frozen_bf16_hint(job, cause)));
  }
  return value;
}

void clear_gradients(ModelSession& session) {
  for (at::Tensor p : session.parameters()) p.mutable_grad() = at::Tensor();
}

}  // namespace oomtune
