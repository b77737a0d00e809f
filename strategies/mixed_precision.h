#pragma once
// Mixed precision: the forms a training step's numbers can take. The
// optimizer always updates fp32 weights; the forms differ in what the model
// holds and computes in.
//
// Rules:
// - fp32: everything fp32 (4 bytes/parameter for weights and gradients).
// - bf16: autocast to bfloat16 (CPU, meta and CUDA; on the CPU and meta
//   CUDA's autocast, emulated: session/cuda_autocast.h); no loss scaling (bf16 has
//   fp32's exponent range). Saves: activations saved in bf16 (about half).
//   Parameters, gradients and optimizer state stay fp32, as with
//   torch.autocast in eager PyTorch.
// - fp16: CUDA only, autocast to float16 plus dynamic loss scaling as
//   torch.cuda.amp.GradScaler does (torch/amp/grad_scaler.py: init_scale
//   2^16, growth_factor 2, backoff_factor 0.5, growth_interval 2000).
//   Parameters, gradients and optimizer state stay fp32.
// - bf16_params: no autocast; the model's parameters and floating-point
//   buffers are cast to bfloat16 once, floating-point inputs are cast before
//   forward, so forward, backward and the gradients are bf16; the loss is
//   computed in fp32 from the upcast output (session/loss.h), as Hugging
//   Face models upcast their logits. The optimizer keeps fp32 master weights
//   (strategies/master_weights.h), as DeepSpeed's bf16 mode does. Saves:
//   weights and gradients take 2 + 2 bytes/parameter instead of 4 + 4, and
//   the activations are bf16. Costs: 4 bytes/parameter of masters in the
//   optimizer state, so with AdamW the static total stays 16 bytes/parameter
//   (2 + 2 + 12) unless the optimizer is offloaded, and an fp32 copy of the
//   gradients during the optimizer step. Updates accumulate in the fp32
//   masters, but forward and backward see bf16-rounded weights.
//   It is oomtune's fallback when TorchScript's autocast fails for a model.
//   Limitation: tensor constants inside the TorchScript graph keep their
//   dtype.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/script.h>

#include "probes/probe_report.h"
#include "session/batch.h"
#include "strategies/training_config.h"

namespace oomtune {

/// The autocast dtype for a precision: nullopt for fp32 and bf16_params.
std::optional<at::ScalarType> autocast_dtype(Precision precision);

/// The dtype the model's parameters are cast to: bfloat16 for bf16_params,
/// nullopt for the others (parameters stay fp32).
std::optional<at::ScalarType> parameter_dtype(Precision precision);

/// The form a trial of `precision` holds its numbers in
/// (ProbeReport::precision_form): fp32, autocast (bf16, fp16) or half
/// parameters with fp32 masters (bf16_params).
PrecisionForm precision_form(Precision precision);

/// Casts every floating-point parameter and buffer of `module` and its
/// submodules to `dtype` in place (tensor.set_data, so the TorchScript
/// graph reads the new data and autograd sees the new dtype), as
/// nn.Module.to(dtype) does. Integer and bool buffers are left as they are.
/// Tied tensors are cast once.
void cast_floating_point(torch::jit::Module& module, at::ScalarType dtype);

/// `batch` with every floating-point tensor except the loss target `target`
/// (the name of JobSpec::loss.target; empty for none) converted to `dtype`:
/// what the model reads is in the model's precision, the target keeps its
/// own for the fp32 loss. Integer tensors (token ids, labels) are shared.
Batch cast_model_inputs(const Batch& batch, const std::string& target, at::ScalarType dtype);

/// GradScaler's dynamic loss scale for fp16.
class DynamicLossScaler {
 public:
  static constexpr double kInitScale = 65536.0;  // 2^16, GradScaler's init_scale
  static constexpr double kGrowthFactor = 2.0;
  static constexpr double kBackoffFactor = 0.5;
  static constexpr int64_t kGrowthInterval = 2000;  // good steps before the scale grows

  /// The current loss scale (a power of two, starting at kInitScale).
  double scale() const { return scale_; }
  /// Divides the gradients of `params` by the scale; returns false if any is
  /// inf or nan (then the step must be skipped).
  bool unscale(const std::vector<at::Tensor>& params) const;
  /// Updates the scale after a step that was (not) skipped.
  void update(bool found_inf);

 private:
  double scale_ = kInitScale;
  int64_t good_steps_ = 0;
};

}  // namespace oomtune
