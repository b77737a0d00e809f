#pragma once
// What oomtune's own torch::optim optimizers (AdamW8bit, Adafactor) share
// with libtorch's: running the closure before the update and reading a
// group's options as their own type (torch/csrc/api/src/optim/adamw.cpp
// does both inline).

#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/optim/optimizer.h>

#include "common/error.h"

namespace oomtune {

/// Runs `closure` (when given) with grad enabled and returns its loss, an
/// undefined tensor without one: the start of Optimizer::step.
inline at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  c10::AutoGradMode enable_grad(true);
  return closure();
}

/// `group`'s options as `Options`. Throws ConfigError "NAME: a param
/// group's options must be ..." when they are another optimizer's.
template <typename Options>
const Options& group_options(const torch::optim::OptimizerParamGroup& group, const std::string& name,
                             const std::string& options_name) {
  const auto* options = dynamic_cast<const Options*>(&group.options());
  if (options == nullptr) throw ConfigError(name + ": a param group's options must be " + options_name);
  return *options;
}

}  // namespace oomtune
