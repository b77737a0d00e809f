#include "commands.h"

#include <CLI/CLI.hpp>

#include "job/job_spec.h"

#include <string>

namespace oomtune {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
#ifdef OOMTUNE_WITH_TORCH
      {"autotune", "Find the fastest training configuration that fits the memory budget", add_autotune_command},
      {"probe", "Measure a training step's memory per phase for one configuration", add_probe_command},
#endif
      {"diagnose", "Explain an out-of-memory from a PyTorch memory snapshot (.pickle)", add_diagnose_command},
      {"emit", "Write DeepSpeed / HF / Lightning / Accelerate configs for a plan.toml", add_emit_command},
#ifdef OOMTUNE_WITH_TORCH
      {"trial", "(internal) run one trial and write its result as JSON", add_trial_command},
#endif
  };
  return kCommands;
}

}  // namespace oomtune

#ifdef OOMTUNE_WITH_TORCH
#include <fmt/format.h>

#include "common/error.h"
#include "compat/torch_compat.h"
#endif

namespace oomtune {

void add_job_override_flags(CLI::App& cmd, JobOverrides& overrides) {
  cmd.add_option("--budget", overrides.budget, "Memory budget, e.g. 8GiB, 7.5GB (overrides the file)");
  cmd.add_option("--host-budget", overrides.host_budget,
                 "Host memory the training process may hold, e.g. 64GiB: optimizer offload's fp32 masters, gradients "
                 "and state live there (overrides the file's host_budget)");
  cmd.add_option("--device", overrides.device,
                 "cpu; cuda (a CUDA build on a GPU: the caching allocator's own figures, capped at the budget); meta "
                 "(PyTorch 2: bytes without data or compute; autotune then chooses by memory alone and verifies "
                 "nothing) (overrides the file)");
  cmd.add_option("--batch", overrides.global_batch, "Global batch size (overrides the file)");
  cmd.add_option("--seq", overrides.seq_len,
                 "Sequence length of the inputs that name \"seq\", in tokens (overrides the file's seq)");
}

#ifdef OOMTUNE_WITH_TORCH
void require_device_support(const JobSpec& job) {
  if (job.device == Device::kMeta && !compat::kMetaDeviceCounted)
    throw InputError(fmt::format("{}: {}", job.spec_path, compat::meta_device_problem()));
  if (job.device != Device::kCuda || compat::cuda_compiled()) return;
  // Whether a GPU answers is for the trial to ask (require_cuda_trial in
  // trial/trial_runner.cpp): this process does not load libtorch.
  throw InputError(
      fmt::format("{}: device = \"cuda\", but this oomtune is built against libtorch {} without CUDA; build it against "
                  "PyTorch with CUDA (OOMTUNE_TORCH=pypi ./setup.sh, then build-pypi/oomtune), or use device = \"cpu\" "
                  "(--device cpu), where probe also predicts what a CUDA caching allocator would reserve",
                  job.spec_path, compat::torch_version()));
}
#endif

const char* version_string() {
#ifdef OOMTUNE_WITH_TORCH
  static const std::string kVersion = std::string("oomtune 0.1.0 (libtorch ") + compat::torch_version() +
                                      ", CUDA: " + (compat::cuda_compiled() ? "yes" : "no") + ")";
  return kVersion.c_str();
#else
  return "oomtune 0.1.0 (built without libtorch: diagnose only)";
#endif
}

}  // namespace oomtune
