// Benchmark: activation checkpointing on a TorchScript model, plain vs every
// detected block checkpointed (strategies/activation_checkpointing.h).
//
// For each batch size it loads the model twice (plain, ckpt=all), runs one
// warm-up step each, measures on one step with MemoryTracker (the CPU counting
// allocator oomtune's probes use):
//   retained = live bytes after forward + loss - live bytes before forward
//              (retained activations: alive between forward and backward)
//   peak     = highest live bytes during the step - live bytes before it
// and then times `--steps` training steps (forward + cross-entropy loss +
// backward, gradients set to none before each), plain and checkpointed
// interleaved so that load on the machine affects both alike; reports the
// median. Targets (issue #4): retained <= 30 % of plain, time <= 1.4x.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>

#include "compat/torch_compat.h"
#include "probes/memory_tracker.h"
#include "strategies/activation_checkpointing.h"
#include "strategies/training_config.h"

namespace {

constexpr int64_t kVocab = 1000;  // examples/export_models.py --gpt-vocab
constexpr int64_t kSeq = 64;      // examples/export_models.py --gpt-seq
constexpr uint64_t kSeed = 0;

struct Options {
  std::string model = "examples/models/gpt.pt";
  std::vector<int64_t> batches = {8, 16};
  int steps = 10;
  bool optimize = false;
  std::string plan = "all";
};

void usage() {
  std::puts(
      "bench_checkpointing [--model PATH] [--batches 8,16] [--steps N] [--optimize on|off] [--plan all]\n"
      "  PATH: a scripted GPT-like model taking input_ids int64 [B, 64] in [0, 1000)");
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_checkpointing: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--model") {
      options.model = value();
    } else if (arg == "--batches") {
      options.batches.clear();
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');) options.batches.push_back(std::stoll(item));
    } else if (arg == "--steps") {
      options.steps = std::max(1, std::stoi(value()));
    } else if (arg == "--optimize") {
      options.optimize = value() == "on";
    } else if (arg == "--plan") {
      options.plan = value();
    } else {
      usage();
      std::exit(arg == "--help" ? 0 : 2);
    }
  }
  return options;
}

struct Variant {
  std::string name;
  torch::jit::Module module;
  int64_t retained_bytes = 0;  // SUM: live bytes after forward + loss, above the step's start
  int64_t peak_bytes = 0;      // SUM: step peak above the step's start
  std::vector<double> step_ms;
};

/// One training step; returns its wall time in milliseconds.
double step(torch::jit::Module& module, const at::Tensor& ids, const at::Tensor& targets,
            oomtune::MemoryTracker* tracker, Variant* measured) {
  for (const auto& parameter : module.parameters(/*recurse=*/true)) parameter.mutable_grad() = at::Tensor();
  at::manual_seed(kSeed);
  const int64_t start = tracker ? tracker->live_bytes() : 0;
  if (tracker) tracker->reset_statistics();
  const auto begin = std::chrono::steady_clock::now();
  at::Tensor logits = module.forward({ids}).toTensor();
  at::Tensor loss = at::cross_entropy_loss(logits.view({-1, kVocab}), targets.view({-1}));
  logits = at::Tensor();  // as run_micro_batch does: backward keeps what it needs
  if (tracker) measured->retained_bytes = tracker->live_bytes() - start;
  loss.backward();
  const auto end = std::chrono::steady_clock::now();
  if (tracker) measured->peak_bytes = tracker->peak_bytes() - start;
  return std::chrono::duration<double, std::milli>(end - begin).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double mb(int64_t bytes) { return static_cast<double>(bytes) / 1e6; }

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  torch::jit::setGraphExecutorOptimize(options.optimize);
  std::printf(
      "model %s, libtorch %s, graph executor optimize %s, plan ckpt=%s, %d intra-op threads, "
      "median of %d steps\n",
      options.model.c_str(), oomtune::compat::torch_version(), options.optimize ? "on" : "off", options.plan.c_str(),
      at::get_num_threads(), options.steps);
  std::printf("%6s  %-10s %14s %14s %10s\n", "batch", "variant", "retained MB", "step peak MB", "step ms");

  bool targets_met = true;
  for (const int64_t batch : options.batches) {
    std::vector<Variant> variants(2);
    variants[0].name = "plain";
    variants[0].module = torch::jit::load(options.model);
    variants[1].name = "ckpt";
    variants[1].module = torch::jit::load(options.model);
    oomtune::apply_checkpointing(variants[1].module, oomtune::parse_checkpoint_plan(options.plan), options.model);

    at::manual_seed(kSeed);
    const at::Tensor ids = at::randint(0, kVocab, {batch, kSeq});
    const at::Tensor targets = at::randint(0, kVocab, {batch, kSeq});
    for (auto& variant : variants) {
      variant.module.train(true);
      step(variant.module, ids, targets, nullptr, nullptr);  // warm-up (the executor compiles)
      oomtune::TrackerOptions tracker_options;
      tracker_options.attribute_ops = false;
      oomtune::MemoryTracker tracker(tracker_options);
      step(variant.module, ids, targets, &tracker, &variant);
    }
    for (int i = 0; i < options.steps; ++i) {
      for (auto& variant : variants) variant.step_ms.push_back(step(variant.module, ids, targets, nullptr, nullptr));
    }
    for (const auto& variant : variants) {
      std::printf("%6lld  %-10s %14.2f %14.2f %10.1f\n", static_cast<long long>(batch), variant.name.c_str(),
                  mb(variant.retained_bytes), mb(variant.peak_bytes), median(variant.step_ms));
    }
    const double retained_ratio =
        static_cast<double>(variants[1].retained_bytes) / static_cast<double>(variants[0].retained_bytes);
    const double peak_ratio = static_cast<double>(variants[1].peak_bytes) / static_cast<double>(variants[0].peak_bytes);
    const double time_ratio = median(variants[1].step_ms) / median(variants[0].step_ms);
    std::printf("%6lld  %-10s %13.1f%% %13.1f%% %9.2fx\n", static_cast<long long>(batch), "ckpt/plain",
                100.0 * retained_ratio, 100.0 * peak_ratio, time_ratio);
    targets_met = targets_met && retained_ratio <= 0.30 && time_ratio <= 1.4;
  }
  std::printf("targets (retained <= 30 %% of plain, step time <= 1.4x): %s\n", targets_met ? "met" : "NOT met");
  return 0;
}
