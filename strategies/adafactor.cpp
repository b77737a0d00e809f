#include "strategies/adafactor.h"

#include <cmath>
#include <sstream>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "common/error.h"
#include "compat/torch_compat.h"
#include "strategies/optimizer_step.h"

namespace oomtune {
namespace {

const AdafactorOptions& adafactor_options_of(const torch::optim::OptimizerParamGroup& group) {
  return group_options<AdafactorOptions>(group, "Adafactor", "AdafactorOptions");
}

// ||x||_2 / sqrt(numel(x)), transformers' Adafactor._rms.
double rms(const at::Tensor& x) { return x.norm().item<double>() / std::sqrt(static_cast<double>(x.numel())); }

// The factored estimate of the squared gradient: the outer product of the
// row means (normalized by their mean) and the column means
// (transformers' Adafactor._approx_sq_grad, returned as its reciprocal
// square root: r_factor * c_factor).
at::Tensor inverse_sqrt_second_moment(const at::Tensor& row, const at::Tensor& col) {
  const at::Tensor r_factor = (row / row.mean(-1, /*keepdim=*/true)).rsqrt_().unsqueeze(-1);
  const at::Tensor c_factor = col.unsqueeze(-2).rsqrt();
  return r_factor * c_factor;
}

bool factored(const at::Tensor& p) { return p.dim() >= 2; }

}  // namespace

AdafactorOptions::AdafactorOptions(double lr) : lr_(lr) {}

void validate(const AdafactorOptions& options) {
  auto fail = [](const std::string& what, double value) {
    std::ostringstream out;
    out << "Adafactor: " << what << ", got " << value;
    throw ConfigError(out.str());
  };
  if (!(options.lr() >= 0)) fail("lr must be >= 0", options.lr());
  if (!(options.eps() >= 0)) fail("eps must be >= 0", options.eps());
  if (!(options.clip_threshold() > 0)) fail("clip_threshold must be > 0", options.clip_threshold());
  if (!(options.decay_rate() < 0)) fail("decay_rate must be < 0", options.decay_rate());
  if (!(options.weight_decay() >= 0)) fail("weight_decay must be >= 0", options.weight_decay());
}

int64_t AdafactorParamState::state_bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor* t : {&exp_avg_sq_row_, &exp_avg_sq_col_, &exp_avg_sq_})
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  return bytes;
}

Adafactor::Adafactor(std::vector<torch::optim::OptimizerParamGroup> param_groups, AdafactorOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<AdafactorOptions>(defaults)) {
  validate(defaults);
  for (const auto& group : param_groups_) validate(adafactor_options_of(group));
}

Adafactor::Adafactor(std::vector<at::Tensor> params, AdafactorOptions defaults)
    : Adafactor({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

// Note [Adafactor update] (adafactor.h).
at::Tensor Adafactor::step(LossClosure closure) {
  at::Tensor loss = run_closure(closure);
  c10::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const AdafactorOptions& options = adafactor_options_of(group);
    validate(options);
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = p.grad();
      if (grad.is_sparse()) throw ConfigError("Adafactor: sparse gradients are not supported");
      if (p.scalar_type() != at::kFloat) {
        std::ostringstream out;
        out << "Adafactor: needs a float32 parameter, got " << p.scalar_type();
        throw ConfigError(out.str());
      }
      const compat::OptimizerStateKey key = compat::optimizer_state_key(p);
      auto found = state_.find(key);
      if (found == state_.end()) {
        auto state = std::make_unique<AdafactorParamState>();
        if (factored(p)) {
          const at::IntArrayRef shape = p.sizes();
          std::vector<int64_t> col_shape(shape.begin(), shape.end() - 2);
          col_shape.push_back(shape.back());
          state->exp_avg_sq_row(at::zeros(shape.slice(0, shape.size() - 1), p.options()));
          state->exp_avg_sq_col(at::zeros(col_shape, p.options()));
        } else {
          state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        }
        found = state_.emplace(key, std::move(state)).first;
      }
      auto& state = static_cast<AdafactorParamState&>(*found->second);
      state.step(state.step() + 1);
      const double beta2t = 1.0 - std::pow(static_cast<double>(state.step()), options.decay_rate());
      at::Tensor update = grad * grad + options.eps();
      if (factored(p)) {
        state.exp_avg_sq_row().mul_(beta2t).add_(update.mean(-1), 1.0 - beta2t);
        state.exp_avg_sq_col().mul_(beta2t).add_(update.mean(-2), 1.0 - beta2t);
        update = inverse_sqrt_second_moment(state.exp_avg_sq_row(), state.exp_avg_sq_col());
        update.mul_(grad);
      } else {
        state.exp_avg_sq().mul_(beta2t).add_(update, 1.0 - beta2t);
        update = state.exp_avg_sq().rsqrt().mul_(grad);
      }
      update.div_(std::max(1.0, rms(update) / options.clip_threshold()));
      update.mul_(options.lr());
      if (options.weight_decay() != 0) p.add_(p, -options.weight_decay() * options.lr());
      p.sub_(update);
    }
  }
  return loss;
}

int64_t Adafactor::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& entry : state_) bytes += static_cast<const AdafactorParamState&>(*entry.second).state_bytes();
  return bytes;
}

int64_t Adafactor::expected_state_bytes(const std::vector<at::Tensor>& params) {
  constexpr auto kFloatBytes = static_cast<int64_t>(sizeof(float));
  int64_t bytes = 0;
  for (const at::Tensor& p : params) {
    const int64_t n = p.numel();
    if (n == 0) continue;  // no state to speak of, and no size to divide by
    bytes += kFloatBytes * (factored(p) ? n / p.size(-1) + n / p.size(-2) : n);
  }
  return bytes;
}

}  // namespace oomtune
