#pragma once
// What oomtune's own torch::optim optimizers (AdamW8bit, Adafactor,
// EagerAdamW, EagerSgd) share with libtorch's: running the closure before
// the update and reading a group's options as their own type
// (torch/csrc/api/src/optim/adamw.cpp does both inline); the grouping of
// torch.optim's foreach and fused implementations; and the fused
// implementations' contract with GradScaler (AmpScaledStep, ImplementationStep).

#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/optim/optimizer.h>

#include "common/error.h"
#include "job/optimizer_implementation.h"

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

/// GradScaler's scale and found_inf, handed to an optimizer step that
/// unscales inside its kernel (AmpScaledStep). Both [] float32 on the
/// gradients' device; both undefined when the step is not scaled.
struct AmpScaling {
  at::Tensor grad_scale;  ///< the gradients are this many times too large
  at::Tensor found_inf;   ///< nonzero: a gradient held an inf or a NaN, update nothing
};

/// An optimizer whose step can unscale the gradients itself: torch.optim's
/// `_step_supports_amp_scaling`, true for Adam, AdamW and SGD with
/// fused=True (torch/optim/adam.py, sgd.py, PyTorch 2.11). GradScaler.step
/// then skips unscale_ and its found_inf.item() sync: it sets the
/// optimizer's attributes `grad_scale` and `found_inf` for one step() and
/// deletes them after it (torch/amp/grad_scaler.py). The fused kernels
/// divide each gradient by grad_scale, write the unscaled gradient back,
/// and change nothing where found_inf is set, although Adam._init_group has
/// already made a first step's state (aten/src/ATen/native/cuda/
/// fused_adam_utils.cuh, FusedSgdKernel.cu).
class AmpScaledStep {
 public:
  virtual ~AmpScaledStep() = default;
  /// Whether step() honours set_amp_scaling (the fused implementation).
  virtual bool supports_amp_scaling() const = 0;
  /// The scaling the next step() applies: GradScaler's assignment of the
  /// two attributes; an empty AmpScaling is their deletion (it releases the
  /// tensors).
  virtual void set_amp_scaling(AmpScaling scaling) = 0;
};

/// Whether `found_inf` (AmpScaling::found_inf) is defined, has a value and
/// is nonzero. Reads it: a device sync on CUDA, no allocation; false on
/// meta, where no gradient has values.
inline bool amp_step_skipped(const at::Tensor& found_inf) {
  return found_inf.defined() && !found_inf.is_meta() && found_inf.item<float>() != 0.0f;
}

/// What a port of a torch.optim optimizer with foreach, fused and
/// single_tensor implementations (EagerAdamW, EagerSgd) keeps besides its
/// state: the implementation it runs and, fused only, GradScaler's scaling
/// of the next steps (torch.optim's `_step_supports_amp_scaling` is set
/// for fused=True alone; torch/optim/adam.py, sgd.py, PyTorch 2.11).
class ImplementationStep : public AmpScaledStep {
 public:
  /// True for fused.
  bool supports_amp_scaling() const final { return implementation_ == OptimizerImplementation::kFused; }
  /// The scaling of the next steps. Throws std::logic_error "NAME: only
  /// fused takes GradScaler's scale" when another implementation is given a
  /// scale or a found_inf (GradScaler unscales for it instead).
  void set_amp_scaling(AmpScaling scaling) final {
    if (!supports_amp_scaling() && (scaling.grad_scale.defined() || scaling.found_inf.defined()))
      throw std::logic_error(std::string(name_) + ": only fused takes GradScaler's scale");
    amp_scaling_ = std::move(scaling);
  }
  /// The implementation this optimizer runs.
  OptimizerImplementation implementation() const { return implementation_; }

 protected:
  /// `name`, a string literal, is the class's name in set_amp_scaling's error.
  ImplementationStep(const char* name, OptimizerImplementation implementation)
      : name_(name), implementation_(implementation) {}
  /// The scaling set for the next steps; empty when none is.
  const AmpScaling& amp_scaling() const { return amp_scaling_; }

 private:
  const char* name_;
  OptimizerImplementation implementation_;
  AmpScaling amp_scaling_;
};

/// Checks Adam-family hyperparameters as torch/optim/adamw.py's constructor
/// does. Throws ConfigError "NAME: WHAT must be ..., got VALUE" unless lr
/// >= 0, eps >= 0, both betas in [0, 1) and weight_decay >= 0 (NaN fails
/// each).
inline void validate_adam_hyperparameters(const std::string& name, double lr, double eps,
                                          const std::tuple<double, double>& betas, double weight_decay) {
  auto fail = [&](const std::string& what, double value) {
    std::ostringstream out;
    out << name << ": " << what << ", got " << value;
    throw ConfigError(out.str());
  };
  if (!(lr >= 0)) fail("lr must be >= 0", lr);
  if (!(eps >= 0)) fail("eps must be >= 0", eps);
  const double beta1 = std::get<0>(betas);
  const double beta2 = std::get<1>(betas);
  if (!(beta1 >= 0 && beta1 < 1)) fail("betas[0] must be in [0, 1)", beta1);
  if (!(beta2 >= 0 && beta2 < 1)) fail("betas[1] must be in [0, 1)", beta2);
  if (!(weight_decay >= 0)) fail("weight_decay must be >= 0", weight_decay);
}

}  // namespace oomtune
