#pragma once
// 8-bit AdamW: AdamW whose two moments are stored blockwise-quantized
// (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", ICLR 2022;
// bitsandbytes' AdamW8bit with optim_bits=8, block_wise=True).
//
// - Saves: optimizer state memory. fp32 AdamW holds 8 bytes per parameter
//   (exp_avg + exp_avg_sq); here a tensor of n >= kMin8bitSize elements holds
//   2 * (n + 4 * ceil(n / kBlockSize)) bytes, about 2.004 bytes per parameter.
// - Costs: quantization error in the moments (the parameter update itself is
//   computed in fp32 from the dequantized moments), and the step does extra
//   work per element (dequantize, two nearest-code searches).
// - Cannot apply: non-float32 parameters of >= kMin8bitSize elements
//   (ConfigError at step()); amsgrad (not offered); sparse gradients
//   (ConfigError).
//   Tensors below kMin8bitSize elements keep fp32 moments and are updated
//   exactly like torch::optim::AdamW.
//
// Note [AdamW8bit update]
// Rationale: the result must be comparable with libtorch's AdamW, which is
//   what an fp32 trial runs.
// Approach: per step and parameter, as torch/csrc/api/src/optim/adamw.cpp
//   (libtorch 1.13): p *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g;
//   v = beta2 v + (1 - beta2) g^2; p -= lr / (1 - beta1^t) * m /
//   (sqrt(v) / sqrt(1 - beta2^t) + eps). For 8-bit states m and v are first
//   dequantized (signed dynamic map for m, unsigned for v), updated in fp32,
//   used for the parameter update, and requantized with a fresh per-block absmax
//   (as bitsandbytes' blockwise 8-bit kernels do).
// Limitations: state save/load is not implemented (the base class's
//   serialization does not know these states).
//
// Note [AdamW8bit on a GPU]
// Rationale: the decision tree's 8-bit node must run where users train; the
//   fused update is a CPU loop, and this project has no CUDA kernels of its
//   own.
// Approach: on a device other than the CPU and meta, the same update with
//   ATen operations, kAdamW8bitChunk elements (whole blocks) at a time:
//   dequantize by index_select into the map, update in float32, absmax per
//   block by amax, requantize by searchsorted over the map's midpoints
//   (right=True: the number of midpoints <= x, as QuantizationMap::encode).
// Limitations: the chunk's float32 and index temporaries, about 40 bytes an
//   element (10 MiB), are live during the update, which bitsandbytes' fused
//   CUDA kernel does not allocate; about 25 kernel launches a chunk.

#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include <torch/optim/optimizer.h>

#include "strategies/blockwise_quantization.h"

namespace oomtune {

/// Elements the update on a GPU works on at once (a multiple of
/// kBlockSize: 128 blocks). See Note [AdamW8bit on a GPU].
constexpr int64_t kAdamW8bitChunk = 128 * 2048;

/// Tensors with fewer elements keep fp32 moments. Source: bitsandbytes
/// Optimizer8bit's min_8bit_size=4096 (bitsandbytes/optim/optimizer.py).
constexpr int64_t kMin8bitSize = 4096;

/// Hyper-parameters of AdamW8bit, named and defaulted as
/// torch::optim::AdamWOptions (libtorch 1.13 torch/optim/adamw.h).
struct AdamW8bitOptions : public torch::optim::OptimizerCloneableOptions<AdamW8bitOptions> {
  /// Learning rate `lr` (>= 0).
  AdamW8bitOptions(double lr = 1e-3);  // NOLINT: implicit, as AdamWOptions
  TORCH_ARG(double, lr) = 1e-3;
  using betas_t = std::tuple<double, double>;
  /// Decay rates of the first and second moments, each in [0, 1).
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the bias-corrected sqrt(v) (>= 0).
  TORCH_ARG(double, eps) = 1e-8;
  /// Decoupled weight decay coefficient (>= 0).
  TORCH_ARG(double, weight_decay) = 1e-2;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

/// Throws ConfigError naming the option and the value received unless
/// lr >= 0, eps >= 0, weight_decay >= 0 and both betas are in [0, 1)
/// (the checks of torch::optim::AdamW's constructor).
void validate(const AdamW8bitOptions& options);

/// Per-parameter state. Either fp32 moments (exp_avg, exp_avg_sq: defined,
/// the parameter's shape) or 8-bit moments (exp_avg_q, exp_avg_sq_q: codes of
/// the parameter's shape and one absmax per kBlockSize elements).
struct AdamW8bitParamState : public torch::optim::OptimizerCloneableParamState<AdamW8bitParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, exp_avg);            ///< fp32 first moment, or undefined
  TORCH_ARG(at::Tensor, exp_avg_sq);         ///< fp32 second moment, or undefined
  TORCH_ARG(QuantizedTensor, exp_avg_q);     ///< 8-bit first moment (signed map)
  TORCH_ARG(QuantizedTensor, exp_avg_sq_q);  ///< 8-bit second moment (unsigned map)

 public:
  /// True when the moments are stored 8-bit.
  bool is_8bit() const { return exp_avg_q_.codes.defined(); }
  /// Bytes held in this state's tensors (codes, absmax or fp32 moments).
  int64_t state_bytes() const;
};

/// AdamW with blockwise 8-bit moments. See Note [AdamW8bit update].
class AdamW8bit : public torch::optim::Optimizer {
 public:
  /// Throws ConfigError if the defaults or any group's options are invalid
  /// (see validate()) or a group's options are not AdamW8bitOptions.
  explicit AdamW8bit(std::vector<torch::optim::OptimizerParamGroup> param_groups, AdamW8bitOptions defaults = {});
  explicit AdamW8bit(std::vector<at::Tensor> params, AdamW8bitOptions defaults = {});

  /// One update of every parameter that has a gradient. Runs `closure` (with
  /// grad enabled) first if given and returns its loss. Throws ConfigError for
  /// invalid options, sparse gradients, or an 8-bit-sized parameter that is not
  /// a contiguous float32 tensor.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// Exact bytes held in state tensors over all parameters seen so far (state
  /// is created at a parameter's first step): per 8-bit parameter of n
  /// elements 2 * (n + 4 * ceil(n / kBlockSize)), per fp32 one 8 * n.
  int64_t state_bytes() const;

  /// State bytes `params` will hold after one step, by the same formula,
  /// without running a step.
  static int64_t expected_state_bytes(const std::vector<at::Tensor>& params);

 private:
  void step_fp32(at::Tensor& p, const at::Tensor& grad, AdamW8bitParamState& state, const AdamW8bitOptions& options);
  void step_8bit(at::Tensor& p, const at::Tensor& grad, AdamW8bitParamState& state, const AdamW8bitOptions& options);
};

/// The 8-bit update of one parameter with ATen operations, as AdamW8bit
/// runs it on a GPU (Note [AdamW8bit on a GPU]); on the CPU it gives what
/// the fused loop gives, to float rounding. `p`: contiguous float32;
/// `grad`: float32 of p's shape; `state`: 8-bit, its step already counted
/// for this update. Throws ConfigError otherwise.
void adamw8bit_update_by_tensor_ops(at::Tensor& p, const at::Tensor& grad, AdamW8bitParamState& state,
                                    const AdamW8bitOptions& options);

}  // namespace oomtune
