// EagerAdamW and EagerSgd (strategies/eager_adamw.h, eager_sgd.h): the
// update of libtorch's torch::optim::AdamW / SGD in each implementation, and
// the bytes of each optimizer step against counts from the parameter sizes
// alone (the tensor operations of torch/optim/adam.py and sgd.py, PyTorch
// 2.11). bench/optimizers/python_reference.py measured the same sizes in
// Python 2.11 eager (profiler memory events on the CPU) and got the same
// bytes: its output is quoted in docs/optimizer_implementations.md.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "common/error.h"
#include "compat/torch_compat.h"
#include "probes/memory_tracker.h"
#include "strategies/eager_adamw.h"
#include "strategies/eager_sgd.h"

namespace oomtune {
namespace {

using Impl = OptimizerImplementation;
constexpr Impl kAll[] = {Impl::kForeach, Impl::kFused, Impl::kSingleTensor};

// Element counts of the fp32 parameters, in order; one 2-D to cover strides
// of a matrix. Bytes: 4000, 1200, 20000, 80, 4800.
const std::vector<std::vector<int64_t>> kShapes = {{1000}, {300}, {5000}, {20}, {40, 30}};
constexpr int64_t kFloatBytes = 4;

std::vector<int64_t> sizes_in_bytes() {
  std::vector<int64_t> bytes;
  for (const auto& shape : kShapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    bytes.push_back(n * kFloatBytes);
  }
  return bytes;
}

int64_t total(const std::vector<int64_t>& bytes) {
  int64_t sum = 0;
  for (int64_t b : bytes) sum += b;
  return sum;
}

std::vector<at::Tensor> make_params(const c10::Device& device = at::kCPU) {
  at::manual_seed(7);
  std::vector<at::Tensor> params;
  for (const auto& shape : kShapes) params.push_back(at::randn(shape).to(device).set_requires_grad(true));
  return params;
}

// The same gradients for every copy of the parameters at step `step`.
void set_gradients(std::vector<at::Tensor>& params, int step) {
  at::manual_seed(100 + step);
  for (at::Tensor& p : params) p.mutable_grad() = at::randn(p.sizes()).to(p.device());
}

using Maker = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

// Parameters after `steps` steps of the optimizer `make` builds.
std::vector<at::Tensor> train(const Maker& make, int steps) {
  std::vector<at::Tensor> params = make_params();
  auto optimizer = make(params);
  for (int step = 0; step < steps; ++step) {
    set_gradients(params, step);
    optimizer->step();
  }
  return params;
}

void expect_close(const std::vector<at::Tensor>& ours, const std::vector<at::Tensor>& theirs, const char* what) {
  ASSERT_EQ(ours.size(), theirs.size());
  for (std::size_t i = 0; i < ours.size(); ++i) {
    // float32: a few roundings per step in a different order (lerp_ against
    // mul_ + add_, one fused expression against separate ops).
    EXPECT_TRUE(at::allclose(ours[i], theirs[i], /*rtol=*/1e-5, /*atol=*/1e-6))
        << what << ": parameter " << i << " differs by " << (ours[i] - theirs[i]).abs().max().item<double>();
  }
}

TEST(EagerAdamW, EachImplementationUpdatesAsLibtorchsAdamW) {
  constexpr int kSteps = 6;
  const auto options = torch::optim::AdamWOptions(1e-2).betas({0.85, 0.99}).eps(1e-7).weight_decay(0.05);
  const auto reference = train(
      [&](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::AdamW>(std::move(p), options); }, kSteps);
  for (Impl impl : kAll) {
    const auto ours = train(
        [&](std::vector<at::Tensor> p) { return std::make_unique<EagerAdamW>(std::move(p), options, impl); }, kSteps);
    expect_close(ours, reference, to_string(impl).c_str());
  }
}

TEST(EagerSgd, EachImplementationUpdatesAsLibtorchsSgd) {
  constexpr int kSteps = 6;
  const torch::optim::SGDOptions variants[] = {
      torch::optim::SGDOptions(1e-2),
      torch::optim::SGDOptions(1e-2).weight_decay(0.05),
      torch::optim::SGDOptions(1e-2).momentum(0.9),
      torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(0.05).dampening(0.1),
      torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(0.05).nesterov(true),
  };
  for (const auto& options : variants) {
    const auto reference = train(
        [&](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(std::move(p), options); }, kSteps);
    for (Impl impl : kAll) {
      const auto ours = train(
          [&](std::vector<at::Tensor> p) { return std::make_unique<EagerSgd>(std::move(p), options, impl); }, kSteps);
      expect_close(ours, reference, to_string(impl).c_str());
    }
  }
}

// libtorch 2.x runs aten::_fused_adamw_'s CPU kernel (the numerics test
// above then checks the kernel); 1.13 has none and meta no kernel, so the
// in-place emulation runs there (Note [Eager AdamW]).
TEST(EagerAdamW, FusedRunsTheKernelWhereTheLibtorchHasOne) {
  EXPECT_EQ(compat::has_fused_adamw_kernel(at::Device(at::kCPU)), compat::kTorchMajor >= 2);
  EXPECT_FALSE(compat::has_fused_adamw_kernel(at::Device(at::kMeta)));
}

// Likewise aten::_fused_sgd_ (Note [Eager SGD]).
TEST(EagerSgd, FusedRunsTheKernelWhereTheLibtorchHasOne) {
  EXPECT_EQ(compat::has_fused_sgd_kernel(at::Device(at::kCPU)), compat::kTorchMajor >= 2);
  EXPECT_FALSE(compat::has_fused_sgd_kernel(at::Device(at::kMeta)));
}

// GradScaler's fused path (strategies/optimizer_step.h AmpScaledStep): the
// gradients arrive 2^16 times too large with the scale beside them. The
// kernel divides by it, exact for a power of two in fp32, so the update is
// the unscaled run's to the bit; a step with found_inf set changes no
// parameter, and AdamW's first step has made its state all the same.
constexpr double kScale = 65536.0;

// Parameters after `steps` steps of `optimizer` on set_gradients' gradients,
// scaled by kScale and handed the scale where `scaled`; `found_inf` (0 or 1)
// for every step.
std::vector<at::Tensor> train_scaled(const Maker& make, int steps, bool scaled, float found_inf = 0) {
  std::vector<at::Tensor> params = make_params();
  auto optimizer = make(params);
  auto* amp = dynamic_cast<AmpScaledStep*>(optimizer.get());
  for (int step = 0; step < steps; ++step) {
    set_gradients(params, step);
    if (scaled) {
      for (at::Tensor& p : params) p.mutable_grad().mul_(kScale);
      amp->set_amp_scaling({at::full({}, kScale, at::kFloat), at::full({}, found_inf, at::kFloat)});
    }
    optimizer->step();
    if (scaled) amp->set_amp_scaling({});
  }
  return params;
}

void expect_equal(const std::vector<at::Tensor>& ours, const std::vector<at::Tensor>& theirs, const char* what) {
  ASSERT_EQ(ours.size(), theirs.size());
  for (std::size_t i = 0; i < ours.size(); ++i)
    EXPECT_TRUE(at::equal(ours[i], theirs[i])) << what << ": parameter " << i;
}

TEST(EagerOptimizers, FusedUnscalesWithGradScalersScaleToTheUnscaledUpdate) {
  constexpr int kSteps = 4;
  const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0.05);
  const Maker make_adamw = [&](std::vector<at::Tensor> p) {
    return std::make_unique<EagerAdamW>(std::move(p), adamw, Impl::kFused);
  };
  expect_equal(train_scaled(make_adamw, kSteps, true), train_scaled(make_adamw, kSteps, false), "AdamW");
  const auto sgd = torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(0.05);
  const Maker make_sgd = [&](std::vector<at::Tensor> p) {
    return std::make_unique<EagerSgd>(std::move(p), sgd, Impl::kFused);
  };
  expect_equal(train_scaled(make_sgd, kSteps, true), train_scaled(make_sgd, kSteps, false), "SGD");
  // Both kernels store the unscaled gradient (AdamW's emulation, where no
  // kernel runs, reuses the gradient's storage: Note [Eager AdamW]).
  std::vector<at::Tensor> params = make_params();
  EagerSgd plain(params, torch::optim::SGDOptions(1e-2), Impl::kFused);
  set_gradients(params, 0);
  const at::Tensor expected = params[2].grad().clone();
  for (at::Tensor& p : params) p.mutable_grad().mul_(kScale);
  plain.set_amp_scaling({at::full({}, kScale, at::kFloat), at::zeros({}, at::kFloat)});
  plain.step();
  EXPECT_TRUE(at::equal(params[2].grad(), expected));
}

TEST(EagerOptimizers, FusedChangesNothingWhereFoundInfIsSetButMakesTheFirstStepsState) {
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.05);
  std::vector<at::Tensor> params = make_params();
  std::vector<at::Tensor> before;
  for (const at::Tensor& p : params) before.push_back(p.detach().clone());
  EagerAdamW adamw(params, options, Impl::kFused);
  set_gradients(params, 0);
  adamw.set_amp_scaling({at::full({}, kScale, at::kFloat), at::ones({}, at::kFloat)});
  adamw.step();
  adamw.set_amp_scaling({});
  expect_equal(params, before, "skipped AdamW step");
  for (const at::Tensor& p : params) {
    const auto& state = static_cast<const EagerAdamWParamState&>(*adamw.state().at(compat::optimizer_state_key(p)));
    EXPECT_EQ(state.step(), 0);
    EXPECT_EQ(state.step_tensor().item<float>(), 0.0f);  // _foreach_sub_ of found_inf
    EXPECT_TRUE(at::equal(state.exp_avg(), at::zeros_like(p)));
    EXPECT_TRUE(at::equal(state.exp_avg_sq(), at::zeros_like(p)));
  }
  // The next good step is a first step: the unscaled run's, to the bit.
  set_gradients(params, 0);
  adamw.step();
  const Maker make = [&](std::vector<at::Tensor> p) {
    return std::make_unique<EagerAdamW>(std::move(p), options, Impl::kFused);
  };
  expect_equal(params, train_scaled(make, 1, false), "AdamW after a skipped step");

  // SGD: no update, but the first step's momentum buffers exist.
  std::vector<at::Tensor> sgd_params = make_params();
  EagerSgd sgd(sgd_params, torch::optim::SGDOptions(1e-2).momentum(0.9), Impl::kFused);
  set_gradients(sgd_params, 0);
  sgd.set_amp_scaling({at::full({}, kScale, at::kFloat), at::ones({}, at::kFloat)});
  sgd.step();
  expect_equal(sgd_params, before, "skipped SGD step");
  for (const at::Tensor& p : sgd_params)
    EXPECT_TRUE(static_cast<const EagerSgdParamState&>(*sgd.state().at(compat::optimizer_state_key(p)))
                    .momentum_buffer()
                    .defined());
}

// GradScaler unscales for the others (torch.optim's
// _step_supports_amp_scaling is set for fused only).
TEST(EagerOptimizers, OnlyFusedTakesTheScale) {
  for (Impl impl : kAll) {
    EagerAdamW adamw(make_params(), torch::optim::AdamWOptions(1e-3), impl);
    EagerSgd sgd(make_params(), torch::optim::SGDOptions(1e-3), impl);
    EXPECT_EQ(adamw.supports_amp_scaling(), impl == Impl::kFused);
    EXPECT_EQ(sgd.supports_amp_scaling(), impl == Impl::kFused);
    const AmpScaling scaling{at::ones({}, at::kFloat), at::zeros({}, at::kFloat)};
    if (impl == Impl::kFused) continue;
    EXPECT_THROW(adamw.set_amp_scaling(scaling), std::logic_error);
    EXPECT_THROW(sgd.set_amp_scaling(scaling), std::logic_error);
  }
}

TEST(EagerAdamW, RefusesAmsgrad) {
  EXPECT_THROW(EagerAdamW(make_params(), torch::optim::AdamWOptions(1e-3).amsgrad(true), Impl::kForeach), ConfigError);
}

/// Device bytes of two optimizer steps on the tracker: the peak above the
/// step's start and what the step left alive, for each step.
struct StepBytes {
  int64_t first_peak = 0, first_left = 0, second_peak = 0, second_left = 0;
};

StepBytes measure(const Maker& make, const c10::Device& device = at::kCPU) {
  TrackerOptions tracker_options;
  tracker_options.count_meta = device.is_meta();
  MemoryTracker tracker(tracker_options);
  std::vector<at::Tensor> params = make_params(device);
  auto optimizer = make(params);
  StepBytes bytes;
  for (int step = 0; step < 2; ++step) {
    set_gradients(params, step);
    tracker.reset_statistics();
    tracker.begin_phase(Phase::kOptimizer);
    optimizer->step();
    tracker.end_phase();
    const PhaseMemory phase = tracker.phase(Phase::kOptimizer);
    (step == 0 ? bytes.first_peak : bytes.second_peak) = phase.peak_bytes - phase.start_bytes;
    (step == 0 ? bytes.first_left : bytes.second_left) = phase.end_bytes - phase.start_bytes;
  }
  return bytes;
}

// _single_tensor_adam: parameter i's sqrt and quotient (2 s_i) while the
// previous parameter's denominator (s_{i-1}) is still bound to `denom`.
int64_t single_tensor_adam_temporaries(const std::vector<int64_t>& s) {
  int64_t peak = 2 * s[0];
  for (std::size_t i = 1; i < s.size(); ++i) peak = std::max(peak, s[i - 1] + 2 * s[i]);
  return peak;
}

TEST(EagerAdamW, StepBytesAreStatesPlusEachImplementationsTemporaries) {
  const std::vector<int64_t> s = sizes_in_bytes();
  const int64_t P = total(s);                                       // bytes of the fp32 parameters (4 per element)
  const int64_t states = 2 * P;                                     // exp_avg + exp_avg_sq: 8 bytes per element
  const auto steps = static_cast<int64_t>(s.size()) * kFloatBytes;  // fused: one float32 step count each
  const auto options = torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
  auto make = [&](Impl impl) -> Maker {
    return [=](std::vector<at::Tensor> p) { return std::make_unique<EagerAdamW>(std::move(p), options, impl); };
  };

  // foreach: every state first (_init_group), then _foreach_sqrt's list.
  const StepBytes foreach = measure(make(Impl::kForeach));
  EXPECT_EQ(foreach.first_peak, states + P);
  EXPECT_EQ(foreach.first_left, states);
  EXPECT_EQ(foreach.second_peak, P);
  EXPECT_EQ(foreach.second_left, 0);

  // fused: the states and step counts, nothing else.
  const StepBytes fused = measure(make(Impl::kFused));
  EXPECT_EQ(fused.first_peak, states + steps);
  EXPECT_EQ(fused.first_left, states + steps);
  EXPECT_EQ(fused.second_peak, 0);
  EXPECT_EQ(fused.second_left, 0);

  // single_tensor: one parameter's temporaries at a time.
  const StepBytes single = measure(make(Impl::kSingleTensor));
  EXPECT_EQ(single.first_peak, states + single_tensor_adam_temporaries(s));
  EXPECT_EQ(single.first_left, states);
  EXPECT_EQ(single.second_peak, single_tensor_adam_temporaries(s));
  EXPECT_EQ(single.second_left, 0);

  // libtorch's own AdamW, for the record: a parameter's state is made when
  // the loop reaches it and its sqrt and quotient (2 s_i) are freed at once.
  const StepBytes libtorch =
      measure([&](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::AdamW>(std::move(p), options); });
  const int64_t largest = *std::max_element(s.begin(), s.end());
  EXPECT_EQ(libtorch.second_peak, 2 * largest);
  int64_t libtorch_first = 0, made = 0;
  for (int64_t b : s) {
    made += 2 * b;  // this parameter's exp_avg and exp_avg_sq
    libtorch_first = std::max(libtorch_first, made + 2 * b);
  }
  EXPECT_EQ(libtorch.first_peak, libtorch_first);
  // Which is higher depends on the shapes: foreach's P against libtorch's
  // 2 x largest (here 30080 B < 40000 B; a model of many similar layers has
  // P far above it, as the example GPT in bench/optimizers shows).
}

TEST(EagerSgd, StepBytesAreMomentumBuffersPlusEachImplementationsTemporaries) {
  const std::vector<int64_t> s = sizes_in_bytes();
  const int64_t P = total(s);
  const int64_t largest = *std::max_element(s.begin(), s.end());
  auto make = [](Impl impl, double weight_decay) -> Maker {
    const auto options = torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(weight_decay);
    return [=](std::vector<at::Tensor> p) { return std::make_unique<EagerSgd>(std::move(p), options, impl); };
  };
  // Without weight decay: the momentum buffers (4 bytes per element), made
  // on the first step, and no temporary in any implementation.
  for (Impl impl : kAll) {
    const StepBytes bytes = measure(make(impl, 0));
    EXPECT_EQ(bytes.first_peak, P) << to_string(impl);
    EXPECT_EQ(bytes.first_left, P) << to_string(impl);
    EXPECT_EQ(bytes.second_peak, 0) << to_string(impl);
  }
  // With weight decay: foreach's _foreach_add list of decayed gradients
  // (P), which the first step clones into the buffers (P more).
  const StepBytes foreach = measure(make(Impl::kForeach, 0.01));
  EXPECT_EQ(foreach.first_peak, 2 * P);
  EXPECT_EQ(foreach.second_peak, P);
  // single_tensor: one decayed gradient at a time; on the first step the
  // buffers made so far, parameter i's decayed gradient and its clone.
  const StepBytes single = measure(make(Impl::kSingleTensor, 0.01));
  int64_t first = 0, made = 0;
  for (int64_t b : s) {
    first = std::max(first, made + 2 * b);
    made += b;
  }
  EXPECT_EQ(single.first_peak, first);
  EXPECT_EQ(single.second_peak, largest);
  // fused: the buffers only.
  const StepBytes fused = measure(make(Impl::kFused, 0.01));
  EXPECT_EQ(fused.first_peak, P);
  EXPECT_EQ(fused.second_peak, 0);
}

TEST(EagerAdamW, MetaTensorsAllocateWhatCpuTensorsDo) {
  if (!compat::kMetaDeviceCounted) GTEST_SKIP() << compat::meta_device_problem();
  const auto options = torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
  for (Impl impl : kAll) {
    const Maker make = [&](std::vector<at::Tensor> p) {
      return std::make_unique<EagerAdamW>(std::move(p), options, impl);
    };
    const StepBytes cpu = measure(make);
    const StepBytes meta = measure(make, at::Device(at::kMeta));
    EXPECT_EQ(meta.first_peak, cpu.first_peak) << to_string(impl);
    EXPECT_EQ(meta.second_peak, cpu.second_peak) << to_string(impl);
    EXPECT_EQ(meta.first_left, cpu.first_left) << to_string(impl);
  }
}

}  // namespace
}  // namespace oomtune
