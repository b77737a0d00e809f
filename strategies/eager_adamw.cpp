#include "strategies/eager_adamw.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "common/error.h"
#include "compat/torch_compat.h"
#include "strategies/optimizer_step.h"

namespace oomtune {
namespace {

using compat::optimizer_state_key;

const torch::optim::AdamWOptions& adamw_options_of(const torch::optim::OptimizerParamGroup& group) {
  return group_options<torch::optim::AdamWOptions>(group, "EagerAdamW", "AdamWOptions");
}

void validate(const torch::optim::AdamWOptions& options) {
  validate_adam_hyperparameters("EagerAdamW", options.lr(), options.eps(), options.betas(), options.weight_decay());
  if (options.amsgrad()) throw ConfigError("EagerAdamW: amsgrad is not offered");
}

/// The lists one implementation call reads (torch/optim/adam.py, Adam.step:
/// params_with_grad, grads, exp_avgs, exp_avg_sqs, state_steps).
struct AdamLists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  std::vector<EagerAdamWParamState*> states;
};

struct Hyper {
  double lr, beta1, beta2, weight_decay, eps;
};

Hyper hyper_of(const torch::optim::AdamWOptions& options) {
  return {options.lr(), std::get<0>(options.betas()), std::get<1>(options.betas()), options.weight_decay(),
          options.eps()};
}

// torch/optim/adam.py, _multi_tensor_adam (capturable=False), one device
// and dtype group.
void multi_tensor_adamw(AdamLists& g, const Hyper& h) {
  for (EagerAdamWParamState* state : g.states) state->step(state->step() + 1);  // _foreach_add_(steps, 1) on CPU
  if (h.weight_decay != 0) at::_foreach_mul_(g.params, 1 - h.lr * h.weight_decay);
  compat::foreach_lerp_(g.exp_avgs, g.grads, 1 - h.beta1);
  at::_foreach_mul_(g.exp_avg_sqs, h.beta2);
  at::_foreach_addcmul_(g.exp_avg_sqs, g.grads, g.grads, 1 - h.beta2);
  std::vector<c10::Scalar> step_size, bias_correction2_sqrt;
  for (const EagerAdamWParamState* state : g.states) {
    const auto step = static_cast<double>(state->step());
    step_size.emplace_back((h.lr / (1 - std::pow(h.beta1, step))) * -1);
    bias_correction2_sqrt.emplace_back(std::pow(1 - std::pow(h.beta2, step), 0.5));
  }
  // The whole-list temporary: one square root per parameter, all alive.
  std::vector<at::Tensor> exp_avg_sq_sqrt = at::_foreach_sqrt(g.exp_avg_sqs);
  at::_foreach_div_(exp_avg_sq_sqrt, bias_correction2_sqrt);
  at::_foreach_add_(exp_avg_sq_sqrt, h.eps);
  at::_foreach_addcdiv_(g.params, g.exp_avgs, exp_avg_sq_sqrt, step_size);
}

// torch/optim/adam.py, _fused_adam with decoupled weight decay, one device
// and dtype group: aten::_fused_adamw_ where the libtorch has its kernel,
// else the same arithmetic in place (Note [Eager AdamW]). With GradScaler's
// found_inf the step counts go back down after the kernel (_foreach_sub_);
// `skipped` is found_inf's value, read once by the caller.
void fused_adamw(AdamLists& g, const Hyper& h, const AmpScaling& amp, bool skipped) {
  at::_foreach_add_(g.steps, 1);
  if (compat::has_fused_adamw_kernel(g.params.front().device())) {
    compat::fused_adamw_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, g.steps, h.lr, h.beta1, h.beta2, h.weight_decay,
                         h.eps, amp.grad_scale, amp.found_inf);
  } else if (!skipped) {
    for (std::size_t i = 0; i < g.params.size(); ++i) {
      at::Tensor& param = g.params[i];
      at::Tensor& grad = g.grads[i];
      if (amp.grad_scale.defined()) grad.div_(amp.grad_scale);  // the kernel stores the unscaled gradient
      const auto step = static_cast<double>(g.states[i]->step() + 1);
      param.mul_(1 - h.lr * h.weight_decay);
      g.exp_avgs[i].lerp_(grad, 1 - h.beta1);
      g.exp_avg_sqs[i].mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
      // The denominator in the gradient's storage: the kernel holds it in registers.
      at::sqrt_out(grad, g.exp_avg_sqs[i]);
      grad.div_(std::pow(1 - std::pow(h.beta2, step), 0.5)).add_(h.eps);
      param.addcdiv_(g.exp_avgs[i], grad, -(h.lr / (1 - std::pow(h.beta1, step))));
    }
  }
  if (amp.found_inf.defined()) at::_foreach_sub_(g.steps, std::vector<at::Tensor>(g.steps.size(), amp.found_inf));
  if (!skipped)
    for (EagerAdamWParamState* state : g.states) state->step(state->step() + 1);
}

// torch/optim/adam.py, _single_tensor_adam (capturable=False,
// differentiable=False) over one param group. `denom` lives across
// iterations, as the Python name does, until the function returns.
void single_tensor_adamw(AdamLists& g, const Hyper& h) {
  at::Tensor denom;
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor& param = g.params[i];
    const at::Tensor& grad = g.grads[i];
    EagerAdamWParamState& state = *g.states[i];
    state.step(state.step() + 1);
    if (h.weight_decay != 0) param.mul_(1 - h.lr * h.weight_decay);
    g.exp_avgs[i].lerp_(grad, 1 - h.beta1);
    g.exp_avg_sqs[i].mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
    const auto step = static_cast<double>(state.step());
    const double bias_correction1 = 1 - std::pow(h.beta1, step);
    const double bias_correction2 = 1 - std::pow(h.beta2, step);
    const double step_size = h.lr / bias_correction1;
    const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);
    denom = (g.exp_avg_sqs[i].sqrt() / bias_correction2_sqrt).add_(h.eps);
    param.addcdiv_(g.exp_avgs[i], denom, -step_size);
  }
}

}  // namespace

EagerAdamW::EagerAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults,
                       OptimizerImplementation implementation)
    : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                std::make_unique<torch::optim::AdamWOptions>(defaults)),
      ImplementationStep("EagerAdamW", implementation) {
  validate(defaults);
  for (const auto& group : param_groups_) validate(adamw_options_of(group));
}

at::Tensor EagerAdamW::step(LossClosure closure) {
  at::Tensor loss = run_closure(closure);
  c10::NoGradGuard no_grad;
  const bool fused = implementation() == OptimizerImplementation::kFused;
  const bool skipped = fused && amp_step_skipped(amp_scaling().found_inf);
  for (auto& group : param_groups_) {
    const torch::optim::AdamWOptions& options = adamw_options_of(group);
    validate(options);
    // Adam._init_group: every parameter's state before any update.
    AdamLists lists;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) throw ConfigError("EagerAdamW: sparse gradients are not supported");
      const auto key = optimizer_state_key(p);
      auto found = state_.find(key);
      if (found == state_.end()) {
        auto state = std::make_unique<EagerAdamWParamState>();
        if (fused) state->step_tensor(at::zeros({}, p.options().dtype(at::kFloat)));
        state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        found = state_.emplace(key, std::move(state)).first;
      }
      auto* state = static_cast<EagerAdamWParamState*>(found->second.get());
      lists.params.push_back(p);
      lists.grads.push_back(p.grad());
      lists.exp_avgs.push_back(state->exp_avg());
      lists.exp_avg_sqs.push_back(state->exp_avg_sq());
      if (fused) lists.steps.push_back(state->step_tensor());
      lists.states.push_back(state);
    }
    if (lists.params.empty()) continue;
    const Hyper hyper = hyper_of(options);
    if (implementation() == OptimizerImplementation::kSingleTensor) {
      single_tensor_adamw(lists, hyper);
      continue;
    }
    for (const std::vector<std::size_t>& indices : group_by_device_and_dtype(lists.params)) {
      AdamLists part;
      for (std::size_t i : indices) {
        part.params.push_back(lists.params[i]);
        part.grads.push_back(lists.grads[i]);
        part.exp_avgs.push_back(lists.exp_avgs[i]);
        part.exp_avg_sqs.push_back(lists.exp_avg_sqs[i]);
        if (fused) part.steps.push_back(lists.steps[i]);
        part.states.push_back(lists.states[i]);
      }
      if (fused)
        fused_adamw(part, hyper, amp_scaling(), skipped);
      else
        multi_tensor_adamw(part, hyper);
    }
  }
  return loss;
}

}  // namespace oomtune
