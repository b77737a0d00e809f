// Step time and state bytes of oomtune::AdamW8bit against torch::optim::AdamW
// on the parameters of a small GPT (4 layers, width 384, vocabulary 8192:
// ~10.3M parameters, 2-D matrices plus 1-D biases and LayerNorm weights that
// stay below kMin8bitSize and keep fp32 states).
//
// Both optimizers run in this process on identical parameters and gradients,
// stepping alternately; the median step time of each is reported.
// Targets (issue #4): state bytes <= 27 % of AdamW's, step time <= 1.5x.
//
// Usage: bench_adamw8bit [--steps N] [--threads N]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>
#include <torch/version.h>

#include "strategies/adamw8bit.h"

namespace {

constexpr int64_t kWidth = 384;   // model width (d_model)
constexpr int64_t kVocab = 8192;  // token embedding rows
constexpr int kLayers = 4;        // transformer blocks
constexpr int kWarmupSteps = 3;   // first steps allocate states: not timed

// Shapes of a GPT's parameters: embedding, then per block LayerNorm (w, b),
// attention qkv (w, b) and output projection (w, b), LayerNorm, MLP fc1 and
// fc2 (w, b), then a final LayerNorm. The head is tied to the embedding.
std::vector<std::vector<int64_t>> gpt_shapes() {
  std::vector<std::vector<int64_t>> shapes{{kVocab, kWidth}};
  for (int l = 0; l < kLayers; ++l) {
    // One layer's (weight, bias) per line.
    // clang-format off
    const std::vector<std::vector<int64_t>> block{
        {kWidth}, {kWidth},                      // ln1
        {3 * kWidth, kWidth}, {3 * kWidth},      // qkv
        {kWidth, kWidth}, {kWidth},              // proj
        {kWidth}, {kWidth},                      // ln2
        {4 * kWidth, kWidth}, {4 * kWidth},      // fc1
        {kWidth, 4 * kWidth}, {kWidth},          // fc2
    };
    // clang-format on
    shapes.insert(shapes.end(), block.begin(), block.end());
  }
  shapes.push_back({kWidth});
  shapes.push_back({kWidth});
  return shapes;
}

std::vector<at::Tensor> make_params(const std::vector<at::Tensor>& init, const std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < init.size(); ++i) {
    params.push_back(init[i].clone().set_requires_grad(true));
    params.back().mutable_grad() = grads[i].clone();
  }
  return params;
}

// Wall time of one step, in milliseconds.
template <typename Opt>
double step_ms(Opt& opt) {
  const auto start = std::chrono::steady_clock::now();
  opt.step();
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(stop - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int64_t adamw_state_bytes(const torch::optim::AdamW& opt) {
  int64_t bytes = 0;
  for (const auto& entry : opt.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
    for (const at::Tensor* t : {&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()}) {
      if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
    }
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) {
      steps = std::max(1, std::atoi(argv[i + 1]));
    } else if (std::strcmp(argv[i], "--threads") == 0) {
      at::set_num_threads(std::max(1, std::atoi(argv[i + 1])));
    } else {
      std::fprintf(stderr, "bench_adamw8bit: unknown option %s (expected --steps N or --threads N)\n", argv[i]);
      return 2;
    }
  }
  at::manual_seed(0);
  std::vector<at::Tensor> init;
  std::vector<at::Tensor> grads;
  int64_t numel = 0;
  int64_t numel_8bit = 0;
  for (const auto& shape : gpt_shapes()) {
    init.push_back(at::randn(shape) * 0.02);
    grads.push_back(at::randn(shape) * 1e-3);
    numel += init.back().numel();
    if (init.back().numel() >= oomtune::kMin8bitSize) numel_8bit += init.back().numel();
  }
  const std::vector<at::Tensor> p32 = make_params(init, grads);
  const std::vector<at::Tensor> p8 = make_params(init, grads);
  torch::optim::AdamW adamw(p32, torch::optim::AdamWOptions(1e-4));
  oomtune::AdamW8bit adamw8(p8, oomtune::AdamW8bitOptions(1e-4));

  // Steps alternate between the two optimizers so that both see the same
  // machine load; the first kWarmupSteps of each allocate states and are not timed.
  for (int s = 0; s < kWarmupSteps; ++s) {
    adamw.step();
    adamw8.step();
  }
  std::vector<double> times32;
  std::vector<double> times8;
  for (int s = 0; s < steps; ++s) {
    times32.push_back(step_ms(adamw));
    times8.push_back(step_ms(adamw8));
  }
  const double ms32 = median(times32);
  const double ms8 = median(times8);
  const int64_t bytes32 = adamw_state_bytes(adamw);
  const int64_t bytes8 = adamw8.state_bytes();

  std::printf("libtorch %s, %d intra-op threads, %d timed steps (median), %d warm-up\n", TORCH_VERSION,
              at::get_num_threads(), steps, kWarmupSteps);
  std::printf("parameters: %lld in %zu tensors (%lld in tensors with 8-bit states)\n", static_cast<long long>(numel),
              init.size(), static_cast<long long>(numel_8bit));
  std::printf("%-22s %14s %12s\n", "optimizer", "state bytes", "step ms");
  std::printf("%-22s %14lld %12.2f\n", "torch::optim::AdamW", static_cast<long long>(bytes32), ms32);
  std::printf("%-22s %14lld %12.2f\n", "oomtune::AdamW8bit", static_cast<long long>(bytes8), ms8);
  const double bytes_ratio = static_cast<double>(bytes8) / static_cast<double>(bytes32);
  const double time_ratio = ms8 / ms32;
  std::printf("state bytes ratio: %.4f (target <= 0.27) %s\n", bytes_ratio, bytes_ratio <= 0.27 ? "ok" : "MISSED");
  std::printf("step time ratio:   %.3f (target <= 1.5) %s\n", time_ratio, time_ratio <= 1.5 ? "ok" : "MISSED");
  return 0;
}
