#include "strategies/training_step.h"

#include <functional>

#include <fmt/format.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "common/error.h"
#include "compat/torch_compat.h"
#include "probes/memory_tracker.h"
#include "strategies/accumulation.h"
#include "strategies/activation_checkpointing.h"
#include "strategies/adafactor.h"
#include "strategies/adamw8bit.h"
#include "strategies/attention_op.h"
#include "strategies/eager_adamw.h"
#include "strategies/eager_sgd.h"
#include "strategies/gradient_clipping.h"
#include "strategies/kernel_rewrite.h"
#include "strategies/master_weights.h"
#include "strategies/mixed_precision.h"

namespace oomtune {
namespace {

/// bf16_params: the batch's floating-point model inputs cast to `dtype` on
/// the host, so the device receives only the bf16 copy, as
/// `x.to(device, dtype)` does in eager code. Without a dtype, `host` as it is.
Batch in_model_precision(Batch host, const JobSpec& job, std::optional<at::ScalarType> dtype) {
  if (!dtype) return host;
  HostMemoryScope in_host;
  return cast_model_inputs(host, job.loss.target, *dtype);
}

}  // namespace

std::optional<OptimizerImplementation> eager_implementation(const TrainingConfig& config, const OptimizerSpec& spec) {
  const bool torch_optim = config.optimizer == OptimizerKind::kAdamW || config.optimizer == OptimizerKind::kSgd;
  if (!torch_optim || config.offload_optimizer) return std::nullopt;
  return spec.implementation;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind, const OptimizerSpec& spec,
                                                        std::vector<at::Tensor> params, bool libtorch_loop) {
  switch (kind) {
    case OptimizerKind::kAdamW: {
      torch::optim::AdamWOptions options(spec.lr);
      options.betas({spec.beta1, spec.beta2}).eps(spec.eps).weight_decay(spec.weight_decay);
      if (libtorch_loop) return std::make_unique<torch::optim::AdamW>(std::move(params), options);
      return std::make_unique<EagerAdamW>(std::move(params), options, spec.implementation);
    }
    case OptimizerKind::kAdamW8bit: {
      AdamW8bitOptions options(spec.lr);
      options.betas({spec.beta1, spec.beta2}).eps(spec.eps).weight_decay(spec.weight_decay);
      return std::make_unique<AdamW8bit>(std::move(params), options);
    }
    case OptimizerKind::kAdafactor: {
      // The job's learning rate and weight decay; the rest as transformers'
      // Adafactor for TrainingArguments(optim="adafactor") (adafactor.h).
      AdafactorOptions options(spec.lr);
      options.weight_decay(spec.weight_decay);
      return std::make_unique<Adafactor>(std::move(params), options);
    }
    case OptimizerKind::kSgd: {
      torch::optim::SGDOptions options(spec.lr);
      options.momentum(spec.momentum).weight_decay(spec.weight_decay);
      if (libtorch_loop) return std::make_unique<torch::optim::SGD>(std::move(params), options);
      return std::make_unique<EagerSgd>(std::move(params), options, spec.implementation);
    }
  }
  throw ConfigError("unknown optimizer");
}

TrainingStep::TrainingStep(ModelSession& session, const TrainingConfig& config)
    : session_(session), config_(normalize_config(config, session.job())) {
  const JobSpec& job = session_.job();
  if (config_.precision == Precision::kFp16 && job.device == Device::kCpu && !compat::has_cpu_grad_scaler_kernels())
    throw ConfigError(fmt::format(
        "{}precision fp16 on the CPU needs GradScaler's CPU kernels (dynamic loss scaling), which libtorch {} lacks "
        "(PyTorch 2 has them): use the PyPI build, device = \"cuda\" or \"meta\", or bf16",
        job.spec_path.empty() ? job.model_path + ": " : job.spec_path + ": ", compat::torch_version()));
  // The target is one of the job's validated names (job/job_spec.h).
  set_attention_target(cuda_target_from_name(session_.job().cuda_target).value_or(CudaTarget{}));
  kernel_sites_ = replace_device_kernels(session_.module());
  if (config_.checkpoint.enabled()) {
    checkpointed_ = apply_checkpointing(session_.module(), config_.checkpoint, session_.job().model_path).checkpointed;
  }
  const OptimizerSpec& spec = session_.job().optimizer;
  const OptimizerKind kind = config_.optimizer;
  const auto low_precision = parameter_dtype(config_.precision);
  if (config_.offload_optimizer || low_precision) {
    // Masters first, from the fp32 parameters, so they start exact.
    const MasterPlacement where = config_.offload_optimizer ? MasterPlacement::kHost : MasterPlacement::kDevice;
    master_ =
        std::make_unique<MasterWeightOptimizer>(session_.parameters(), where, [&](std::vector<at::Tensor> masters) {
          return make_optimizer(kind, spec, std::move(masters), where == MasterPlacement::kHost);
        });
  } else {
    optimizer_ = make_optimizer(kind, spec, session_.parameters());
  }
  if (low_precision) cast_floating_point(session_.module(), *low_precision);
  if (config_.precision == Precision::kFp16) {
    scaler_ = std::make_unique<DynamicLossScaler>();
    amp_scaled_ = dynamic_cast<AmpScaledStep*>(optimizer_.get());  // null with master weights
  }
}

TrainingStep::~TrainingStep() = default;

// Note [The batch in the optimizer step]
// Rationale: eager training keeps the micro-batch it trained on until the
// loop rebinds its variable: `for x, y in loader: x, y = x.to(dev),
// y.to(dev); ...; optimizer.step()` holds the last x and y through the
// optimizer step (so do HF Trainer's `inputs` and Lightning's `batch`),
// and frees them once the next copy is made. torch.cuda's phase peaks, the
// eager figures oomtune answers for (scripts/eager_peaks.py), count them.
// A step that freed each micro-batch after its backward left 4.59 MiB of
// images out of the optimizer phase of a 5.3 M-parameter CNN at batch 8,
// 2.7 % of the 171.0 MiB eager CUDA measured there (issue #46 item 6).
// Approach: held_ keeps the micro-batch on the device from its copy until
// the next one's copy has been made, across the end of a step.

StepResult TrainingStep::run(const Batch& global_batch, const PhaseHook& hook) {
  const JobSpec& job = session_.job();
  const auto slices = split_global_batch(global_batch.size, config_.micro_batch, job.allow_remainder);
  const auto dtype = autocast_dtype(config_.precision);
  const auto input_dtype = parameter_dtype(config_.precision);
  LossScaling scale_loss;
  if (scaler_) scale_loss = [this](const at::Tensor& loss) { return scaler_->scale(loss); };
  StepResult result;
  for (const MicroBatchSlice& slice : slices) {
    held_ = session_.to_device(in_model_precision(global_batch.slice(slice.start, slice.length), job, input_dtype));
    result.loss += slice.loss_weight * run_micro_batch(session_, held_, slice.loss_weight, scale_loss, dtype, hook);
    ++result.micro_batches;
  }
  hook(Phase::kOptimizer);
  // Note [Gradient clipping in the step]
  // The user's loop clips after the last micro-batch's backward and before
  // the update: `scaler.unscale_(opt)` first with fp16, so that max_norm
  // meets the true gradients, then clip_grad_norm_(model.parameters()),
  // then `scaler.step(opt)` (torch.amp's "Working with unscaled gradients";
  // HF Trainer and Lightning do the same). Master-weight optimizers clip
  // their fp32 gradients, as DeepSpeed does (on the host with offload).
  // The total norm is dropped at once, as a loop that does not log it.
  const double max_norm = job.optimizer.max_grad_norm;
  const std::vector<at::Tensor> params = session_.parameters();  // one module walk for the step
  if (max_norm > 0 && scaler_) scaler_->unscale_(params);
  if (max_norm > 0 && !master_) clip_grad_norm_(params, max_norm);
  std::function<void(const std::vector<at::Tensor>&)> clip_masters;
  if (max_norm > 0 && master_) {
    const ClipPlacement where =
        master_->placement() == MasterPlacement::kHost ? ClipPlacement::kHost : ClipPlacement::kDevice;
    clip_masters = [max_norm, where](const std::vector<at::Tensor>& masters) {
      clip_grad_norm_(masters, max_norm, where);
    };
  }
  const auto step_optimizer = [this, &clip_masters] {
    if (master_)
      master_->step(clip_masters);
    else
      optimizer_->step();
  };
  if (scaler_) {
    result.skipped = scaler_->step(params, amp_scaled_, step_optimizer);
    scaler_->update();
  } else {
    step_optimizer();
  }
  clear_gradients(session_);
  return result;
}

}  // namespace oomtune
