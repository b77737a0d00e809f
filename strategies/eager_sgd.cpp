#include "strategies/eager_sgd.h"

#include <sstream>
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

const torch::optim::SGDOptions& sgd_options_of(const torch::optim::OptimizerParamGroup& group) {
  return group_options<torch::optim::SGDOptions>(group, "EagerSgd", "SGDOptions");
}

void validate(const torch::optim::SGDOptions& options) {
  auto fail = [](const std::string& what, double value) {
    std::ostringstream out;
    out << "EagerSgd: " << what << ", got " << value;
    throw ConfigError(out.str());
  };
  if (!(options.lr() >= 0)) fail("lr must be >= 0", options.lr());
  if (!(options.momentum() >= 0)) fail("momentum must be >= 0", options.momentum());
  if (!(options.weight_decay() >= 0)) fail("weight_decay must be >= 0", options.weight_decay());
  if (options.nesterov() && (options.momentum() <= 0 || options.dampening() != 0))
    fail("nesterov needs momentum > 0 and dampening 0; momentum", options.momentum());
}

/// The lists one implementation call reads (torch/optim/sgd.py, SGD.step:
/// params, grads, momentum_buffer_list).
struct SgdLists {
  std::vector<at::Tensor> params, grads;
  std::vector<EagerSgdParamState*> states;  // one per parameter, also without momentum
};

// torch/optim/sgd.py, _multi_tensor_sgd, one device and dtype group.
void multi_tensor_sgd(SgdLists& g, const torch::optim::SGDOptions& o) {
  std::vector<at::Tensor> device_grads = g.grads;
  // The whole-list temporary: every decayed gradient at once.
  if (o.weight_decay() != 0) device_grads = at::_foreach_add(device_grads, g.params, o.weight_decay());
  if (o.momentum() != 0) {
    std::vector<at::Tensor> bufs;
    bool all_states_with_momentum_buffer = true;
    for (const EagerSgdParamState* state : g.states)
      all_states_with_momentum_buffer = all_states_with_momentum_buffer && state->momentum_buffer().defined();
    if (all_states_with_momentum_buffer) {
      for (const EagerSgdParamState* state : g.states) bufs.push_back(state->momentum_buffer());
      at::_foreach_mul_(bufs, o.momentum());
      at::_foreach_add_(bufs, device_grads, 1 - o.dampening());
    } else {
      for (std::size_t i = 0; i < g.states.size(); ++i) {
        EagerSgdParamState& state = *g.states[i];
        if (!state.momentum_buffer().defined())
          state.momentum_buffer(device_grads[i].detach().clone());
        else
          state.momentum_buffer().mul_(o.momentum()).add_(device_grads[i], 1 - o.dampening());
        bufs.push_back(state.momentum_buffer());
      }
    }
    if (o.nesterov())
      at::_foreach_add_(device_grads, bufs, o.momentum());
    else
      device_grads = std::move(bufs);
  }
  at::_foreach_add_(g.params, device_grads, -o.lr());
}

// torch/optim/sgd.py, _fused_sgd over one param group: the first step makes
// every momentum buffer with empty_like before the update, then one
// aten::_fused_sgd_ per device and dtype where the libtorch has its kernel,
// else the kernel's arithmetic in place (Note [Eager SGD]). With
// GradScaler's scale the kernel unscales each gradient and stores it back,
// and found_inf set updates nothing (the emulation reads it: a sync).
void fused_sgd(SgdLists& g, const torch::optim::SGDOptions& o, const AmpScaling& amp) {
  const double lr = o.lr(), wd = o.weight_decay(), momentum = o.momentum(), dampening = o.dampening();
  bool is_first_step = momentum != 0;
  for (const EagerSgdParamState* state : g.states) is_first_step = is_first_step && !state->momentum_buffer().defined();
  if (is_first_step)
    for (std::size_t i = 0; i < g.states.size(); ++i) g.states[i]->momentum_buffer(at::empty_like(g.grads[i]));
  if (compat::has_fused_sgd_kernel(g.params.front().device())) {
    for (const std::vector<std::size_t>& indices : group_by_device_and_dtype(g.params)) {
      std::vector<at::Tensor> params, grads, buffers;
      for (std::size_t i : indices) {
        params.push_back(g.params[i]);
        grads.push_back(g.grads[i]);
        if (momentum != 0) buffers.push_back(g.states[i]->momentum_buffer());
      }
      compat::fused_sgd_(params, grads, buffers, wd, momentum, lr, dampening, o.nesterov(), is_first_step,
                         amp.grad_scale, amp.found_inf);
    }
    return;
  }
  if (amp_step_skipped(amp.found_inf)) return;
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor& param = g.params[i];
    at::Tensor& grad = g.grads[i];
    if (amp.grad_scale.defined()) grad.div_(amp.grad_scale);
    if (momentum == 0) {
      if (wd != 0) param.mul_(1 - lr * wd);
      param.add_(grad, -lr);
      continue;
    }
    at::Tensor& buf = g.states[i]->momentum_buffer();
    if (is_first_step) {
      buf.copy_(grad);
      if (wd != 0) buf.add_(param, wd);
    } else {
      buf.mul_(momentum).add_(grad, 1 - dampening);
      if (wd != 0) buf.add_(param, wd * (1 - dampening));
    }
    if (o.nesterov()) {
      if (wd != 0) param.mul_(1 - lr * wd);
      param.add_(grad, -lr).add_(buf, -lr * momentum);
    } else {
      param.add_(buf, -lr);
    }
  }
}

// torch/optim/sgd.py, _single_tensor_sgd over one param group. `grad`
// lives across iterations, as the Python name does.
void single_tensor_sgd(SgdLists& g, const torch::optim::SGDOptions& o) {
  at::Tensor grad;
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    at::Tensor& param = g.params[i];
    grad = g.grads[i];
    if (o.weight_decay() != 0) grad = grad.add(param, o.weight_decay());
    if (o.momentum() != 0) {
      EagerSgdParamState& state = *g.states[i];
      if (!state.momentum_buffer().defined())
        state.momentum_buffer(grad.detach().clone());
      else
        state.momentum_buffer().mul_(o.momentum()).add_(grad, 1 - o.dampening());
      if (o.nesterov())
        grad = grad.add(state.momentum_buffer(), o.momentum());
      else
        grad = state.momentum_buffer();
    }
    param.add_(grad, -o.lr());
  }
}

}  // namespace

EagerSgd::EagerSgd(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults,
                   OptimizerImplementation implementation)
    : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                std::make_unique<torch::optim::SGDOptions>(defaults)),
      ImplementationStep("EagerSgd", implementation) {
  validate(defaults);
  for (const auto& group : param_groups_) validate(sgd_options_of(group));
}

at::Tensor EagerSgd::step(LossClosure closure) {
  at::Tensor loss = run_closure(closure);
  c10::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const torch::optim::SGDOptions& options = sgd_options_of(group);
    validate(options);
    SgdLists lists;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) throw ConfigError("EagerSgd: sparse gradients are not supported");
      const auto key = optimizer_state_key(p);
      auto found = state_.find(key);
      if (found == state_.end()) found = state_.emplace(key, std::make_unique<EagerSgdParamState>()).first;
      lists.params.push_back(p);
      lists.grads.push_back(p.grad());
      lists.states.push_back(static_cast<EagerSgdParamState*>(found->second.get()));
    }
    if (lists.params.empty()) continue;
    if (implementation() == OptimizerImplementation::kSingleTensor) {
      single_tensor_sgd(lists, options);
    } else if (implementation() == OptimizerImplementation::kFused) {
      fused_sgd(lists, options, amp_scaling());
    } else {
      for (const std::vector<std::size_t>& indices : group_by_device_and_dtype(lists.params)) {
        SgdLists part;
        for (std::size_t i : indices) {
          part.params.push_back(lists.params[i]);
          part.grads.push_back(lists.grads[i]);
          part.states.push_back(lists.states[i]);
        }
        multi_tensor_sgd(part, options);
      }
    }
  }
  return loss;
}

}  // namespace oomtune
