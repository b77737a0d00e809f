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
// - fp16: CUDA, meta, and the CPU with PyTorch 2 (GradScaler's operators
//   have no CPU kernel in libtorch 1.13), autocast to float16 plus dynamic
//   loss scaling as
//   torch.amp.GradScaler does (DynamicLossScaler below: init_scale 2^16,
//   growth_factor 2, backoff_factor 0.5, growth_interval 2000).
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
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/script.h>

#include "probes/probe_report.h"
#include "session/batch.h"
#include "strategies/optimizer_step.h"
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

/// fp16's dynamic loss scale, as torch.amp.GradScaler keeps it in eager
/// PyTorch 2.11 (torch/amp/grad_scaler.py), with its device tensors and
/// operators, so that a trial allocates what GradScaler does and nothing
/// else: the scale ([] fp32) and growth tracker ([] int32), made at the first
/// scale(); per step the scaled loss; in the optimizer phase the inverse
/// scale and found_inf ([] fp32) with a copy of each for the kernel
/// (_MultiDeviceReplicator), found_inf's copy kept until update(). The
/// inverse scale is unscale_'s reciprocal of the scale computed in fp64
/// (8 + 8 + 4 bytes) or, for an optimizer that unscales in its kernel
/// (fused AdamW and SGD: AmpScaledStep), _check_inf_per_device's 1 (4
/// bytes); GradScaler.step hands the latter two more scalars for the
/// duration of its step (4 + 4); after an explicit unscale_ (gradient
/// clipping) the fused optimizer is handed found_inf alone (4). The
/// gradients are unscaled in place
/// (at::_amp_foreach_non_finite_check_and_unscale_ or the fused kernel),
/// with no temporary of a gradient's size. On meta no gradient has values:
/// a meta step is never skipped.
/// Checked against eager PyTorch 2.11's CPU allocations (profiler memory
/// events, bench/optimizers/grad_scaler_reference.py; Python's numbers
/// wrapped as CPU tensors, host memory on a GPU, aside).
class DynamicLossScaler {
 public:
  static constexpr double kInitScale = 65536.0;  // 2^16, GradScaler's init_scale
  static constexpr double kGrowthFactor = 2.0;
  static constexpr double kBackoffFactor = 0.5;
  static constexpr int64_t kGrowthInterval = 2000;  // good steps before the scale grows

  /// GradScaler.scale: `loss` times the scale, a new tensor like `loss`.
  /// The first call makes the scale (kInitScale) and the growth tracker on
  /// `loss`'s device.
  at::Tensor scale(const at::Tensor& loss);

  /// GradScaler.unscale_: divides the defined gradients of `params` by the
  /// scale in place, one call per gradient dtype, and records whether one
  /// held an inf or a NaN; no sync. Call it between the last backward and
  /// step() where the gradients must be read unscaled (gradient clipping,
  /// strategies/gradient_clipping.h); step() then neither unscales nor
  /// checks again. Throws std::logic_error before scale() or when called
  /// twice before update().
  void unscale_(const std::vector<at::Tensor>& params);

  /// GradScaler.step: unscale_() unless it was called, then
  /// `optimizer_step` unless a gradient held an inf or a NaN (the skip
  /// reads found_inf: a sync, as GradScaler's found_inf.item()); or, where
  /// `fused` (the optimizer `optimizer_step` steps) supports amp scaling,
  /// the non-finite check alone unless unscale_() ran, then `optimizer_step`
  /// always, with found_inf and, unless unscale_() ran, the scale set on
  /// `fused` for its duration (_step_supports_amp_scaling: no
  /// found_inf.item() before the step). Returns whether the step was skipped
  /// (the fused branch reads found_inf after the step). Throws
  /// std::logic_error before scale().
  bool step(const std::vector<at::Tensor>& params, AmpScaledStep* fused, const std::function<void()>& optimizer_step);

  /// GradScaler.update: halves the scale after a skipped step, doubles it
  /// after kGrowthInterval good ones in a row (at::_amp_update_scale_, in
  /// place), and frees found_inf. Throws std::logic_error before step().
  void update();

  /// The current scale (reads the device tensor); kInitScale before the
  /// first scale(), NaN on meta.
  double scale_value() const;

 private:
  /// _unscale_grads_: multiplies the defined gradients of `params` by
  /// `inv_scale`, one call per gradient dtype, and keeps in found_inf_ a
  /// copy of `found_inf`, set where a gradient is not finite. GradScaler's
  /// _MultiDeviceReplicator serves the kernel copies of both scalars (4 + 4
  /// bytes), and the copy of found_inf is the one it keeps until update();
  /// `found_inf` and `inv_scale` go with the caller.
  void unscale_grads(const std::vector<at::Tensor>& params, const at::Tensor& inv_scale, const at::Tensor& found_inf);

  at::Tensor scale_;           // [] fp32
  at::Tensor growth_tracker_;  // [] int32: good steps since the last change
  at::Tensor found_inf_;       // [] fp32, from the check (unscale_ or step) to update()
  bool unscaled_ = false;      // unscale_() ran since the last update(): GradScaler's OptState.UNSCALED
};

}  // namespace oomtune
