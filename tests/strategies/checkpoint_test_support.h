#pragma once
// What the checkpointing tests share, on the CPU (checkpointing_test.cpp)
// and on a GPU (cuda_checkpointing_test.cpp): the models they load, the
// graph executor's setting, and the training steps whose gradients they
// compare. The reference for every gradient test is an unmodified copy of
// the same model run with the same seed: checkpointing must not change a
// gradient (fp32, dropout on, allclose at rtol = atol = 1e-5).

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>

#include "compat/torch_compat.h"
#include "support/require_file.h"
#include "support/same_gradients.h"

namespace oomtune::testing {

constexpr double kTolerance = 1e-5;  // rtol and atol of the gradient comparison
constexpr int64_t kGptVocab = 1000;  // examples/export_models.py --gpt-vocab
constexpr int64_t kGptSeq = 64;      // examples/export_models.py --gpt-seq
constexpr uint64_t kSeed = 1234;

/// examples/models/NAME, which examples/export_models.py writes (the
/// example_models fixture).
std::string example_model(const std::string& name);

/// The models of make_checkpoint_models.py, written once per test process
/// into a folder removed when the process exits. A failed export fails the
/// test that asked (with the script's output) and returns ""; never skips:
/// the suite needs OOMTUNE_PYTHON (tests/CMakeLists.txt) to have torch.
std::string test_model(const std::string& name);

/// Loads `path` into `var` (a torch::jit::Module) and keeps it as
/// `var##_path`; returns from the test where test_model failed (it recorded
/// why) or the file is missing (OOMTUNE_REQUIRE_FILE says so).
#define LOAD_OR_SKIP(var, path)                                 \
  const std::string var##_path = (path);                        \
  if (var##_path.empty()) return; /* test_model recorded why */ \
  OOMTUNE_REQUIRE_FILE(var##_path);                             \
  torch::jit::Module var = torch::jit::load(var##_path)

/// Sets the graph executor's optimization for the scope.
class OptimizeScope {
 public:
  explicit OptimizeScope(bool on) : previous_(torch::jit::getGraphExecutorOptimize()) {
    torch::jit::setGraphExecutorOptimize(on);
  }
  ~OptimizeScope() { torch::jit::setGraphExecutorOptimize(previous_); }
  OptimizeScope(const OptimizeScope&) = delete;
  OptimizeScope& operator=(const OptimizeScope&) = delete;

 private:
  bool previous_;
};

/// Each parameter's gradient, cloned (undefined where it has none).
Gradients gradients(const torch::jit::Module& module);

/// Drops every parameter's gradient.
void zero_grads(torch::jit::Module& module);

/// [batch, kGptSeq] token ids for the example GPT, from the CPU generator.
std::vector<c10::IValue> gpt_input(int64_t batch);

/// How train_steps runs a step beyond forward and backward.
struct StepOptions {
  // Forward under bf16 autocast on the step's device, as the training step
  // runs precision=bf16: on for forward, then off, its cast cache dropped.
  bool bf16_autocast = false;
  // An SGD update with this learning rate after each step but the last, so
  // a later step runs on new weights; 0: none.
  double sgd_lr = 0.0;
  // Where the module and its inputs go (the inputs are made on the CPU, so
  // both runs of a comparison draw them alike).
  c10::Device device{c10::kCPU};
};

/// `steps` training steps (forward, a fixed random projection of the output
/// as loss, backward) with every generator seeded before each (at::
/// manual_seed seeds the CUDA ones too: dropout on a GPU draws from them);
/// returns the last step's parameter gradients, on options.device. The
/// profiling executor (optimization on) runs its optimized plan from the
/// second step.
template <typename MakeInput>
Gradients train_steps(torch::jit::Module& module, MakeInput make_input, int steps, StepOptions options = {}) {
  module.to(options.device);
  module.train(true);
  const auto autocast = [&options](bool on) {
    options.device.is_cuda() ? compat::set_cuda_autocast(on, at::kBFloat16)
                             : compat::set_cpu_autocast(on, at::kBFloat16);
  };
  for (int step = 0; step < steps; ++step) {
    zero_grads(module);
    at::manual_seed(kSeed + step);
    std::vector<c10::IValue> inputs = make_input();
    for (c10::IValue& input : inputs) {
      if (input.isTensor()) input = input.toTensor().to(options.device);
    }
    if (options.bf16_autocast) autocast(true);
    at::Tensor out = module.forward(inputs).toTensor();
    if (options.bf16_autocast) {
      autocast(false);
      compat::clear_autocast_cache();
    }
    at::Tensor probe = at::randn(out.sizes()).to(options.device);
    (out.to(at::kFloat) * probe).sum().backward();
    if (options.sgd_lr == 0.0 || step + 1 == steps) continue;
    at::NoGradGuard no_grad;
    for (auto parameter : module.parameters(/*recurse=*/true)) {
      if (parameter.grad().defined()) parameter.sub_(parameter.grad() * options.sgd_lr);
    }
  }
  return gradients(module);
}

}  // namespace oomtune::testing
