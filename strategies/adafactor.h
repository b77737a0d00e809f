#pragma once
// Adafactor: adaptive learning rates with a factored second moment and no
// first moment (Shazeer & Stern, "Adafactor: Adaptive Learning Rates with
// Sublinear Memory Cost", ICML 2018), as Hugging Face transformers'
// `Adafactor` runs it for `TrainingArguments(optim="adafactor")`:
// scale_parameter=False, relative_step=False, warmup_init=False, beta1=None
// (transformers/trainer.py, OptimizerNames.ADAFACTOR; the update in
// transformers/optimization.py, Adafactor.step).
//
// - Saves: optimizer state memory. AdamW holds 8 bytes per parameter; here a
//   parameter of shape [..., r, c] holds 4 * (prod(...) * r + prod(...) * c)
//   bytes (a running mean of the squared gradient per row and per column),
//   and a vector of n elements 4 * n. A 4096 x 4096 matrix: 32 KiB instead of
//   128 MiB.
// - Costs: the numerics change more than with 8-bit AdamW (no momentum, a
//   rank-1 estimate of the second moment, update clipping), so the search
//   tries it only when the job allows it (allow_adafactor).
// - Cannot apply: non-float32 parameters (ConfigError at step(); bf16
//   parameters train through fp32 master weights, strategies/master_weights.h);
//   sparse gradients (ConfigError).
//
// Note [Adafactor update]
// Per step t (from 1) and parameter p with gradient g, as transformers'
// Adafactor.step with the options above:
//   beta2_t = 1 - t^decay_rate;  u = g^2 + eps1
//   factored (p.dim() >= 2): R = beta2_t R + (1 - beta2_t) mean(u, -1);
//     C = beta2_t C + (1 - beta2_t) mean(u, -2);
//     v_hat = (R / mean(R, -1))[..., :, None] * C[..., None, :]
//   else: V = beta2_t V + (1 - beta2_t) u;  v_hat = V
//   update = g / sqrt(v_hat);  update /= max(1, rms(update) / clip_threshold)
//   p -= lr * weight_decay * p;  p -= lr * update
// where rms(x) = ||x||_2 / sqrt(numel(x)).

#include <cstdint>
#include <vector>

#include <torch/optim/optimizer.h>

namespace oomtune {

/// Hyper-parameters of Adafactor, named and defaulted as transformers'
/// Adafactor (optimization.py) with a fixed learning rate.
struct AdafactorOptions : public torch::optim::OptimizerCloneableOptions<AdafactorOptions> {
  /// Learning rate `lr` (>= 0), used as given (relative_step=False).
  AdafactorOptions(double lr = 1e-3);  // NOLINT: implicit, as AdamWOptions
  TORCH_ARG(double, lr) = 1e-3;
  /// eps[0] of transformers: added to the squared gradient (>= 0).
  TORCH_ARG(double, eps) = 1e-30;
  /// Threshold of the update's root mean square (> 0).
  TORCH_ARG(double, clip_threshold) = 1.0;
  /// The exponent of the second moment's decay, beta2_t = 1 - t^decay_rate (< 0).
  TORCH_ARG(double, decay_rate) = -0.8;
  /// Decoupled weight decay coefficient (>= 0), scaled by lr.
  TORCH_ARG(double, weight_decay) = 0.0;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

/// Throws ConfigError naming the option and the value unless lr >= 0,
/// eps >= 0, clip_threshold > 0, decay_rate < 0 and weight_decay >= 0.
void validate(const AdafactorOptions& options);

/// Per-parameter state: the factored second moment (exp_avg_sq_row of
/// shape p.shape[:-1], exp_avg_sq_col of shape p.shape[:-2] + p.shape[-1:])
/// of a parameter with two or more dimensions, else exp_avg_sq of its shape.
struct AdafactorParamState : public torch::optim::OptimizerCloneableParamState<AdafactorParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, exp_avg_sq_row);  ///< fp32 mean of u over the last dim, or undefined
  TORCH_ARG(at::Tensor, exp_avg_sq_col);  ///< fp32 mean of u over the second-last dim, or undefined
  TORCH_ARG(at::Tensor, exp_avg_sq);      ///< fp32 second moment of a vector, or undefined

 public:
  /// Bytes held in this state's tensors.
  int64_t state_bytes() const;
};

/// Adafactor. See Note [Adafactor update].
class Adafactor : public torch::optim::Optimizer {
 public:
  /// Throws ConfigError if the defaults or any group's options are invalid
  /// (see validate()) or a group's options are not AdafactorOptions.
  explicit Adafactor(std::vector<torch::optim::OptimizerParamGroup> param_groups, AdafactorOptions defaults = {});
  explicit Adafactor(std::vector<at::Tensor> params, AdafactorOptions defaults = {});

  /// One update of every parameter that has a gradient. Runs `closure` (with
  /// grad enabled) first if given and returns its loss. Throws ConfigError for
  /// invalid options, sparse gradients or a parameter that is not float32.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// Exact bytes held in state tensors over all parameters seen so far
  /// (state is created at a parameter's first step).
  int64_t state_bytes() const;

  /// State bytes `params` will hold after one step: 4 * (rows + columns) per
  /// parameter of two or more dimensions (rows = numel / size(-1), columns =
  /// numel / size(-2)), 4 * numel per other parameter.
  static int64_t expected_state_bytes(const std::vector<at::Tensor>& params);
};

}  // namespace oomtune
