#include "strategies/adamw8bit.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include "common/error.h"
#include "compat/torch_compat.h"
#include "strategies/optimizer_step.h"

namespace oomtune {
namespace {

using compat::optimizer_state_key;
using StateKey = compat::OptimizerStateKey;

std::string describe(const at::Tensor& t) {
  std::ostringstream out;
  out << t.scalar_type() << " tensor on " << t.device();
  return out.str();
}

const AdamW8bitOptions& adamw8bit_options_of(const torch::optim::OptimizerParamGroup& group) {
  return group_options<AdamW8bitOptions>(group, "AdamW8bit", "AdamW8bitOptions");
}

// One 8-bit step's float32 constants (step_8bit); update_block takes a copy,
// which float stores through its pointers cannot alias.
struct StepConstants {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float inv_sqrt_bc2;  // 1 / sqrt(bias correction 2)
  float eps;
  float step_size;  // lr / bias correction 1
  float decay;      // 1 - lr * weight_decay; 1 without weight decay (p * 1 is p to the bit)
};

// A block's new absmax of each moment.
struct MomentMaxima {
  float m = 0.0f;
  float v = 0.0f;  // v >= 0: its own magnitude
};

// The AdamW arithmetic of one block, on the decoded moments m and v (updated
// in place), and the largest |m| and |v| it leaves (0 for none; NaNs are
// passed over, as std::max(amax, |x|) passes them). Compiled for the
// machine's widest vectors: GCC clones it for AVX2 and picks at load time
// (target_clones); AVX2 brings no FMA, so each operation rounds as in the
// SSE2 clone and the results are the same to the bit on any x86-64 CPU.
// Eight running maxima of each, not one: the compiler keeps one chain of
// float operations in order (without -ffast-math); eight are a vector.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx2", "default")))
#endif
MomentMaxima
update_moments(StepConstants c, int64_t n, const float* g, float* param, float* m_new, float* v_new) {
  auto update = [&](int64_t j) {
    const float gi = g[j];
    const float m = c.beta1 * m_new[j] + c.one_minus_beta1 * gi;
    const float v = c.beta2 * v_new[j] + c.one_minus_beta2 * gi * gi;
    const float denom = std::sqrt(v) * c.inv_sqrt_bc2 + c.eps;
    param[j] = param[j] * c.decay - c.step_size * (m / denom);
    m_new[j] = m;
    v_new[j] = v;
  };
  constexpr int64_t kLanes = 8;
  float lane_m[kLanes] = {};
  float lane_v[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) {
      update(j + k);
      lane_m[k] = std::max(lane_m[k], std::fabs(m_new[j + k]));
      lane_v[k] = std::max(lane_v[k], std::fabs(v_new[j + k]));
    }
  }
  MomentMaxima most;
  for (; j < n; ++j) {
    update(j);
    most.m = std::max(most.m, std::fabs(m_new[j]));
    most.v = std::max(most.v, std::fabs(v_new[j]));
  }
  for (int64_t k = 0; k < kLanes; ++k) {
    most.m = std::max(most.m, lane_m[k]);
    most.v = std::max(most.v, lane_v[k]);
  }
  return most;
}

// The fused dequantize -> AdamW -> requantize of one block of n <= kBlockSize
// elements: its gradient g, parameters, both moments' codes and absmax. In
// passes: the table lookups of decoding; the arithmetic, free of them, in
// SIMD lanes (sqrt and division dominate it), with the absmax; the
// encoding. The same operations per element, in the same order, as one loop
// over the block, so the results are the same to the bit; that loop took
// 2.2x torch::optim::AdamW's step, these passes 1.3-1.5x (bench/adamw8bit:
// an AVX2 CPU, one thread, libtorch 1.13; bench/README.md); with the
// decoding and encoding by AVX2 gathers, the arithmetic in AVX2 lanes and
// the absmax taken in the arithmetic's pass, 0.82-0.89x (an AVX-512 EPYC;
// 1.21-1.42x against PyTorch 2.11's AdamW, whose own time moves by a fifth).
void update_block(StepConstants c, int64_t n, const float* g, float* param, uint8_t* codes1, uint8_t* codes2,
                  float* absmax1, float* absmax2) {
  const QuantizationMap& map1 = QuantizationMap::dynamic(/*is_signed=*/true);
  const QuantizationMap& map2 = QuantizationMap::dynamic(/*is_signed=*/false);
  float m_new[kBlockSize];
  float v_new[kBlockSize];
  const float scale1 = *absmax1;
  const float scale2 = *absmax2;
  map1.decode_scaled(codes1, scale1, m_new, n);
  map2.decode_scaled(codes2, scale2, v_new, n);
  const MomentMaxima amax = update_moments(c, n, g, param, m_new, v_new);
  *absmax1 = amax.m;
  *absmax2 = amax.v;
  const float inv1 = amax.m > 0.0f ? 1.0f / amax.m : 0.0f;
  const float inv2 = amax.v > 0.0f ? 1.0f / amax.v : 0.0f;
  map1.encode_scaled(m_new, inv1, codes1, n);
  map2.encode_scaled(v_new, inv2, codes2, n);
}

}  // namespace

AdamW8bitOptions::AdamW8bitOptions(double lr) : lr_(lr) {}

void validate(const AdamW8bitOptions& options) {
  validate_adam_hyperparameters("AdamW8bit", options.lr(), options.eps(), options.betas(), options.weight_decay());
}

int64_t AdamW8bitParamState::state_bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor* t :
       {&exp_avg_, &exp_avg_sq_, &exp_avg_q_.codes, &exp_avg_q_.absmax, &exp_avg_sq_q_.codes, &exp_avg_sq_q_.absmax}) {
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  }
  return bytes;
}

AdamW8bit::AdamW8bit(std::vector<torch::optim::OptimizerParamGroup> param_groups, AdamW8bitOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<AdamW8bitOptions>(defaults)) {
  validate(defaults);
  for (const auto& group : param_groups_) validate(adamw8bit_options_of(group));
}

AdamW8bit::AdamW8bit(std::vector<at::Tensor> params, AdamW8bitOptions defaults)
    : AdamW8bit({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

at::Tensor AdamW8bit::step(LossClosure closure) {
  at::Tensor loss = run_closure(closure);
  c10::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const AdamW8bitOptions& options = adamw8bit_options_of(group);
    validate(options);
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = p.grad();
      if (grad.is_sparse()) {
        throw ConfigError("AdamW8bit: sparse gradients are not supported");
      }
      const StateKey key = optimizer_state_key(p);
      auto found = state_.find(key);
      if (found == state_.end()) {
        auto state = std::make_unique<AdamW8bitParamState>();
        if (p.numel() >= kMin8bitSize) {
          if (p.scalar_type() != at::kFloat) {
            throw ConfigError("AdamW8bit: 8-bit states need a float32 parameter, got a " + describe(p));
          }
          const int64_t blocks = num_blocks(p.numel());
          auto init = [&](QuantizedTensor& q, bool is_signed) {
            q.codes =
                at::full(p.sizes(), QuantizationMap::dynamic(is_signed).zero_code(), p.options().dtype(at::kByte));
            q.absmax = at::zeros({blocks}, p.options().dtype(at::kFloat));
          };
          init(state->exp_avg_q(), /*is_signed=*/true);
          init(state->exp_avg_sq_q(), /*is_signed=*/false);
        } else {
          // As libtorch AdamW: zeros_like(p, MemoryFormat::Preserve).
          state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
          state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        }
        found = state_.emplace(key, std::move(state)).first;
      }
      auto& state = static_cast<AdamW8bitParamState&>(*found->second);
      if (state.is_8bit()) {
        step_8bit(p, grad, state, options);
      } else {
        step_fp32(p, grad, state, options);
      }
    }
  }
  return loss;
}

void AdamW8bit::step_fp32(at::Tensor& p, const at::Tensor& grad, AdamW8bitParamState& state,
                          const AdamW8bitOptions& options) {
  // The same tensor operations in the same order as torch::optim::AdamW::step
  // (torch/csrc/api/src/optim/adamw.cpp, libtorch 1.13), so results are
  // bit-equal. See Note [AdamW8bit update].
  if (options.weight_decay() != 0) {
    p.mul_(1 - options.lr() * options.weight_decay());
  }
  state.step(state.step() + 1);
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  const double bias_correction1 = 1 - std::pow(beta1, state.step());
  const double bias_correction2 = 1 - std::pow(beta2, state.step());
  at::Tensor& exp_avg = state.exp_avg();
  at::Tensor& exp_avg_sq = state.exp_avg_sq();
  exp_avg.mul_(beta1).add_(grad, 1 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  const at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options.eps());
  const double step_size = options.lr() / bias_correction1;
  p.addcdiv_(exp_avg, denom, -step_size);
}

void AdamW8bit::step_8bit(at::Tensor& p, const at::Tensor& grad, AdamW8bitParamState& state,
                          const AdamW8bitOptions& options) {
  // Fused dequantize -> AdamW -> requantize, one block at a time; the block's
  // new moments are staged in fp32 buffers until its new absmax is known.
  // Arithmetic is float32, as libtorch's CPU kernels do for float32 tensors.
  if (!p.is_contiguous()) {
    throw ConfigError("AdamW8bit: 8-bit states need a contiguous parameter");
  }
  if (grad.scalar_type() != at::kFloat || grad.device() != p.device()) {
    throw ConfigError("AdamW8bit: 8-bit states need a float32 gradient on the parameter's device, got a " +
                      describe(grad));
  }
  state.step(state.step() + 1);
  // On meta, what the update allocates (a contiguous copy of a strided
  // gradient) without the arithmetic, which reads data meta tensors lack.
  if (p.is_meta()) {
    const at::Tensor contiguous = grad.contiguous();
    return;
  }
  if (!p.device().is_cpu()) {
    adamw8bit_update_by_tensor_ops(p, grad, state, options);
    return;
  }
  const double beta1_d = std::get<0>(options.betas());
  const double beta2_d = std::get<1>(options.betas());
  const double bias_correction1 = 1 - std::pow(beta1_d, state.step());
  const double bias_correction2 = 1 - std::pow(beta2_d, state.step());
  // Without weight decay the factor is 1, and p * 1 is p to the bit.
  const float decay =
      options.weight_decay() != 0 ? static_cast<float>(1 - options.lr() * options.weight_decay()) : 1.0f;
  StepConstants c;
  c.beta1 = static_cast<float>(beta1_d);
  c.beta2 = static_cast<float>(beta2_d);
  c.one_minus_beta1 = static_cast<float>(1 - beta1_d);
  c.one_minus_beta2 = static_cast<float>(1 - beta2_d);
  c.inv_sqrt_bc2 = static_cast<float>(1 / std::sqrt(bias_correction2));
  c.eps = static_cast<float>(options.eps());
  c.step_size = static_cast<float>(options.lr() / bias_correction1);
  c.decay = decay;

  const at::Tensor g_c = grad.contiguous();
  const float* g = g_c.data_ptr<float>();
  float* param = p.data_ptr<float>();
  uint8_t* codes1 = state.exp_avg_q().codes.data_ptr<uint8_t>();
  uint8_t* codes2 = state.exp_avg_sq_q().codes.data_ptr<uint8_t>();
  float* absmax1 = state.exp_avg_q().absmax.data_ptr<float>();
  float* absmax2 = state.exp_avg_sq_q().absmax.data_ptr<float>();
  const int64_t numel = p.numel();
  at::parallel_for(0, num_blocks(numel), kBlocksPerTask, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t lo = b * kBlockSize;
      update_block(c, std::min(numel - lo, kBlockSize), g + lo, param + lo, codes1 + lo, codes2 + lo, absmax1 + b,
                   absmax2 + b);
    }
  });
}

void adamw8bit_update_by_tensor_ops(at::Tensor& p, const at::Tensor& grad, AdamW8bitParamState& state,
                                    const AdamW8bitOptions& options) {
  if (!state.is_8bit() || p.scalar_type() != at::kFloat || !p.is_contiguous() || grad.scalar_type() != at::kFloat ||
      grad.numel() != p.numel()) {
    throw ConfigError(
        "AdamW8bit: the update by tensor operations needs 8-bit state, a contiguous float32 "
        "parameter and its float32 gradient, got a " +
        describe(p));
  }
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(state.step()));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(state.step()));
  const double step_size = options.lr() / bias_correction1;
  const double inv_sqrt_bc2 = 1 / std::sqrt(bias_correction2);
  // The maps and their midpoints on p's device, once per call (512 floats each).
  auto on_device = [&](const std::array<float, kMapSize>& values, int64_t count) {
    return at::from_blob(const_cast<float*>(values.data()), {count}, at::kFloat).to(p.device());
  };
  const QuantizationMap& map1 = QuantizationMap::dynamic(/*is_signed=*/true);
  const QuantizationMap& map2 = QuantizationMap::dynamic(/*is_signed=*/false);
  const at::Tensor values1 = on_device(map1.values(), kMapSize), values2 = on_device(map2.values(), kMapSize);
  const at::Tensor mid1 = on_device(map1.midpoints(), kMapSize - 1), mid2 = on_device(map2.midpoints(), kMapSize - 1);

  const at::Tensor param = p.view({-1});
  const at::Tensor g_all = grad.contiguous().view({-1});
  const at::Tensor codes1 = state.exp_avg_q().codes.view({-1}), codes2 = state.exp_avg_sq_q().codes.view({-1});
  const at::Tensor& absmax1 = state.exp_avg_q().absmax;
  const at::Tensor& absmax2 = state.exp_avg_sq_q().absmax;
  const int64_t numel = p.numel();
  for (int64_t lo = 0; lo < numel; lo += kAdamW8bitChunk) {
    const int64_t n = std::min(kAdamW8bitChunk, numel - lo);
    const int64_t first_block = lo / kBlockSize, blocks = num_blocks(n);
    const int64_t padded = blocks * kBlockSize;
    // Per element: its block's scale (the last block may be short).
    auto per_element = [&](const at::Tensor& per_block) {
      return per_block.repeat_interleave(kBlockSize).narrow(0, 0, n);
    };
    auto by_block = [&](const at::Tensor& x) {
      return (n == padded ? x : at::constant_pad_nd(x, {0, padded - n}, 0)).view({blocks, kBlockSize});
    };
    const at::Tensor g = g_all.narrow(0, lo, n);
    at::Tensor c1 = codes1.narrow(0, lo, n), c2 = codes2.narrow(0, lo, n);
    at::Tensor a1 = absmax1.narrow(0, first_block, blocks), a2 = absmax2.narrow(0, first_block, blocks);
    at::Tensor m = values1.index_select(0, c1.to(at::kLong)).mul_(per_element(a1));
    m.mul_(beta1).add_(g, 1 - beta1);
    at::Tensor v = values2.index_select(0, c2.to(at::kLong)).mul_(per_element(a2));
    v.mul_(beta2).addcmul_(g, g, 1 - beta2);
    at::Tensor w = param.narrow(0, lo, n);
    if (options.weight_decay() != 0) w.mul_(1 - options.lr() * options.weight_decay());
    w.addcdiv_(m, v.sqrt().mul_(inv_sqrt_bc2).add_(options.eps()), -step_size);
    a1.copy_(std::get<0>(by_block(m).abs().max(1)));
    a2.copy_(std::get<0>(by_block(v).max(1)));
    // x / absmax as the loop does: times the reciprocal, 0 for a zero block.
    auto inverse = [](const at::Tensor& amax) { return at::where(amax > 0, amax.reciprocal(), at::zeros_like(amax)); };
    c1.copy_(at::searchsorted(mid1, m.mul_(per_element(inverse(a1))), /*out_int32=*/false, /*right=*/true));
    c2.copy_(at::searchsorted(mid2, v.mul_(per_element(inverse(a2))), /*out_int32=*/false, /*right=*/true));
  }
}

int64_t AdamW8bit::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& entry : state_) {
    bytes += static_cast<const AdamW8bitParamState&>(*entry.second).state_bytes();
  }
  return bytes;
}

int64_t AdamW8bit::expected_state_bytes(const std::vector<at::Tensor>& params) {
  int64_t bytes = 0;
  for (const at::Tensor& p : params) {
    const int64_t n = p.numel();
    if (n >= kMin8bitSize) {
      bytes += 2 * (n + static_cast<int64_t>(sizeof(float)) * num_blocks(n));
    } else {
      bytes += 2 * n * static_cast<int64_t>(p.element_size());
    }
  }
  return bytes;
}

}  // namespace oomtune
