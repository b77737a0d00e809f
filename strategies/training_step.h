#pragma once
// TrainingStep: a TrainingConfig applied to a ModelSession — one optimizer
// step over a global batch, made of micro-batches, with the chosen
// checkpointing, optimizer, offload and precision.
//
// Rules of micro-batching with gradient accumulation (strategies/accumulation.h
// has the split):
// - The global batch is split along each input's batch dimension into
//   micro-batches; each micro-batch's mean loss is scaled by its share of the
//   global batch (length / global), so the accumulated gradients equal the
//   full batch's for mean-reduced losses.
// - The optimizer steps once per global batch; gradients are then set to
//   undefined (zero_grad(set_to_none=True)).
// - A micro-batch stays on the device until the next one is there, as a
//   training loop's `x = x.to(device)` keeps it: the last one of a step
//   through the optimizer step and until the next step's first copy
//   (Note [The batch in the optimizer step] in training_step.cpp).
// - With offload or bf16_params the optimizer updates fp32 master copies
//   (strategies/master_weights.h): on the host with offload, else on the
//   device. bf16_params casts the model to bf16 when the step is built
//   (strategies/mixed_precision.h).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "session/batch.h"
#include "session/model_session.h"
#include "session/train_step.h"
#include "strategies/activation_checkpointing.h"
#include "strategies/job_config.h"
#include "strategies/kernel_rewrite.h"
#include "strategies/training_config.h"

namespace oomtune {

class MasterWeightOptimizer;
class DynamicLossScaler;
class AmpScaledStep;

/// What one TrainingStep::run did.
struct StepResult {
  double loss = 0;            // mean loss over the global batch (unscaled)
  int64_t micro_batches = 0;  // COUNT
  bool skipped = false;       // fp16: the update was skipped for inf/nan gradients
};

/// A training configuration applied to a loaded model.
class TrainingStep {
 public:
  /// Applies `config` to `session`: replaces scaled_dot_product_attention
  /// and dropout by the CUDA target's kernels (strategies/kernel_rewrite.h,
  /// the job's cuda_target), rewrites the model for checkpointing,
  /// builds the optimizer, and for bf16_params makes the fp32 masters and
  /// then casts the model's floating-point parameters and buffers to bf16
  /// in place (the session's tensors change dtype). `config` is normalized
  /// here (normalize_config).
  /// Throws ConfigError for combinations that cannot run (fp16 off CUDA,
  /// checkpointing without blocks, ...).
  TrainingStep(ModelSession& session, const TrainingConfig& config);
  ~TrainingStep();
  TrainingStep(const TrainingStep&) = delete;
  TrainingStep& operator=(const TrainingStep&) = delete;

  /// One optimizer step over `global_batch` (its size is the job's global
  /// batch). `hook` is called at each phase boundary, including
  /// Phase::kOptimizer. Out-of-memory errors pass through.
  StepResult run(const Batch& global_batch, const PhaseHook& hook);

  /// The configuration this step was built for (micro-batch, accumulation, ...).
  const TrainingConfig& config() const { return config_; }
  /// The checkpointed blocks, forward order (empty without checkpointing).
  const std::vector<CheckpointedBlock>& checkpointed_blocks() const { return checkpointed_; }
  /// The master-weight optimizer (offload or bf16_params), or nullptr when
  /// the optimizer updates the model's parameters directly.
  const MasterWeightOptimizer* master_weights() const { return master_.get(); }
  /// The call sites of operators replaced by the CUDA target's kernels in
  /// the model's graphs (all 0 for a model without them).
  const KernelSites& kernel_sites() const { return kernel_sites_; }

 private:
  ModelSession& session_;
  TrainingConfig config_;
  std::vector<CheckpointedBlock> checkpointed_;
  KernelSites kernel_sites_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<MasterWeightOptimizer> master_;
  std::unique_ptr<DynamicLossScaler> scaler_;
  AmpScaledStep* amp_scaled_ = nullptr;  // optimizer_, which fp16's scaler asks whether it takes the scale
  Batch held_;                           // the last micro-batch on the device, until the next is copied
};

/// The torch.optim implementation a step of `config` runs for the job's
/// optimizer `spec` (make_optimizer): spec.implementation for AdamW and SGD
/// on the device (bf16_params' device masters included); nullopt for 8-bit
/// AdamW, Adafactor and offload's host update, which are not eager torch.optim.
std::optional<OptimizerImplementation> eager_implementation(const TrainingConfig& config, const OptimizerSpec& spec);

/// Makes the optimizer `kind` over `params` with the job's hyper-parameters.
/// AdamW and SGD run the job's torch.optim implementation
/// (spec.implementation: strategies/eager_adamw.h, eager_sgd.h), the
/// temporaries of the user's eager training; with `libtorch_loop`,
/// libtorch's own torch::optim::AdamW / SGD instead, one parameter at a
/// time: the host update of optimizer offload, which no eager torch.optim
/// call runs (DeepSpeed's CPU Adam). 8-bit AdamW and Adafactor are
/// oomtune's own loops either way (not foreach-modelled).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind, const OptimizerSpec& spec,
                                                        std::vector<at::Tensor> params, bool libtorch_loop = false);

}  // namespace oomtune
