#pragma once
// What oomtune's own torch::optim optimizers (AdamW8bit, Adafactor,
// EagerAdamW, EagerSgd) share with libtorch's: running the closure before
// the update and reading a group's options as their own type
// (torch/csrc/api/src/optim/adamw.cpp does both inline); and the grouping of
// torch.optim's foreach and fused implementations.

#include <string>
#include <utility>
#include <vector>

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

/// Indices into `tensors` grouped by (device, dtype), groups in the order
/// their first tensor appears and indices ascending within each: what
/// torch.optim's foreach and fused implementations run one call each over
/// (torch/optim/optimizer.py, Optimizer._group_tensors_by_device_and_dtype).
inline std::vector<std::vector<std::size_t>> group_by_device_and_dtype(const std::vector<at::Tensor>& tensors) {
  std::vector<std::pair<std::pair<c10::Device, at::ScalarType>, std::vector<std::size_t>>> groups;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::pair<c10::Device, at::ScalarType> key{tensors[i].device(), tensors[i].scalar_type()};
    auto found = groups.begin();
    while (found != groups.end() && found->first != key) ++found;
    if (found == groups.end()) found = groups.insert(groups.end(), {key, {}});
    found->second.push_back(i);
  }
  std::vector<std::vector<std::size_t>> indices;
  for (auto& group : groups) indices.push_back(std::move(group.second));
  return indices;
}

}  // namespace oomtune
