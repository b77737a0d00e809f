// Benchmark (issue #10): what running trials costs.
//
// (a) A child process per trial: run_trial_in_child (the `oomtune trial`
//     executable given by --oomtune) against run_trial in this process, same
//     job (examples/gpt.toml at --trial-batch), same config and TrialOptions
//     (a fixed number of steps, so both do the same work). The in-process
//     side runs one discarded trial first (libtorch's one-time start-up);
//     then the two alternate, --rounds each. The overhead (child - in-process
//     wall time) is given in seconds and in training steps of the same job.
//     For scale, also the time to exec `oomtune --version` (dynamic loading
//     of libtorch and static initialization, no trial).
// (b) Graph-executor optimization off vs on (JobSpec.optimizing_executor)
//     for the example GPT and ResNet-50, each trial in its own child process
//     so one mode's compiled graphs never serve the other; modes alternate
//     over --exec-rounds. Peak = the trial's device peak over every step after
//     the warm-up; steady step = median of steps 4..N (steps 2-3 are where
//     the profiling executor compiles, reported on their own).

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/bench_util.h"
#include "compat/torch_compat.h"
#include "job/job_spec.h"
#include "probes/probe_report.h"
#include "strategies/training_step.h"
#include "trial/child_trial.h"
#include "trial/trial_runner.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string oomtune;  // required
  std::string gpt_job = std::string(OOMTUNE_BENCH_EXAMPLES_DIR) + "/gpt.toml";
  std::string resnet_job = std::string(OOMTUNE_BENCH_EXAMPLES_DIR) + "/resnet50.toml";
  int64_t trial_batch = 8;     // (a) GPT batch
  int64_t trial_steps = 4;     // (a) total steps per trial
  int rounds = 5;              // (a) trials per mode
  int64_t gpt_batch = 8;       // (b)
  int64_t gpt_steps = 10;      // (b) total steps per GPT trial
  int64_t resnet_batch = 2;    // (b)
  int64_t resnet_image = 112;  // (b) image side, pixels
  int64_t resnet_steps = 6;    // (b) total steps per ResNet-50 trial
  int exec_rounds = 2;         // (b) trials per mode and model
};

void usage() {
  std::puts(
      "bench_trials --oomtune PATH [--gpt-job TOML] [--resnet-job TOML] [--rounds N] [--trial-batch N]\n"
      "             [--trial-steps N] [--gpt-batch N] [--gpt-steps N] [--resnet-batch N] [--resnet-image PX]\n"
      "             [--resnet-steps N] [--exec-rounds N] [--skip-resnet]\n"
      "  PATH: the built oomtune executable (the child runs `PATH trial REQUEST RESULT`)");
}

bool g_skip_resnet = false;

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_trials: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--oomtune")
      o.oomtune = value();
    else if (arg == "--gpt-job")
      o.gpt_job = value();
    else if (arg == "--resnet-job")
      o.resnet_job = value();
    else if (arg == "--rounds")
      o.rounds = std::max(1, std::stoi(value()));
    else if (arg == "--trial-batch")
      o.trial_batch = std::stoll(value());
    else if (arg == "--trial-steps")
      o.trial_steps = std::max<int64_t>(2, std::stoll(value()));
    else if (arg == "--gpt-batch")
      o.gpt_batch = std::stoll(value());
    else if (arg == "--gpt-steps")
      o.gpt_steps = std::max<int64_t>(5, std::stoll(value()));
    else if (arg == "--resnet-batch")
      o.resnet_batch = std::stoll(value());
    else if (arg == "--resnet-image")
      o.resnet_image = std::stoll(value());
    else if (arg == "--resnet-steps")
      o.resnet_steps = std::max<int64_t>(5, std::stoll(value()));
    else if (arg == "--exec-rounds")
      o.exec_rounds = std::max(1, std::stoi(value()));
    else if (arg == "--skip-resnet")
      g_skip_resnet = true;
    else {
      usage();
      std::exit(arg == "--help" ? 0 : 2);
    }
  }
  if (o.oomtune.empty() || !std::filesystem::exists(o.oomtune)) {
    std::fprintf(stderr, "bench_trials: --oomtune must name the built oomtune executable (got '%s')\n",
                 o.oomtune.c_str());
    std::exit(2);
  }
  return o;
}

using oomtune::bench::load_average;
using oomtune::bench::median;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double mb(int64_t bytes) { return static_cast<double>(bytes) / 1e6; }

/// Wall seconds of `oomtune --version` (exec, dynamic loading, static init).
double exec_seconds(const std::string& oomtune) {
  std::vector<char*> argv = {const_cast<char*>(oomtune.c_str()), const_cast<char*>("--version"), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  const auto start = Clock::now();
  pid_t pid = 0;
  if (posix_spawn(&pid, oomtune.c_str(), &actions, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  posix_spawn_file_actions_destroy(&actions);
  return seconds_since(start);
}

void require_ok(const oomtune::ProbeReport& report, const std::string& what) {
  if (report.outcome == oomtune::TrialOutcome::kOk) return;
  std::fprintf(stderr, "bench_trials: %s: trial %s: %s\n", what.c_str(), oomtune::to_string(report.outcome).c_str(),
               report.message.c_str());
  std::exit(1);
}

// ---- (a) child process vs in-process --------------------------------------

void child_cost(const Options& o) {
  using namespace oomtune;
  JobSpec job = load_job_spec(o.gpt_job);
  job.global_batch = o.trial_batch;
  job.budget_bytes.reset();
  const TrainingConfig config = baseline_config(job);
  TrialOptions trial;
  trial.total_steps = o.trial_steps;
  trial.enforce_budget = false;
  ChildTrialOptions child;
  child.executable = o.oomtune;
  child.timeout_seconds = 300;

  require_ok(run_trial(job, config, trial), "in-process warm-up");
  std::vector<double> in_wall, child_wall, in_step, child_step, exec_wall;
  for (int r = 0; r < o.rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const bool in_process = (r + k) % 2 == 0;
      const auto start = Clock::now();
      const ProbeReport report =
          in_process ? run_trial(job, config, trial) : run_trial_in_child(job, config, trial, child);
      const double wall = seconds_since(start);
      require_ok(report, in_process ? "in-process trial" : "child trial");
      (in_process ? in_wall : child_wall).push_back(wall);
      (in_process ? in_step : child_step).push_back(report.timing.steady_step_seconds);
    }
    exec_wall.push_back(exec_seconds(o.oomtune));
  }
  const double step = median(in_step);
  const double overhead = median(child_wall) - median(in_wall);
  std::printf("### (a) child process per trial vs in-process trial\n\n");
  std::printf(
      "job %s at global batch %lld, config %s, %lld steps per trial (1 warm-up), %d trials per mode, "
      "alternating; oomtune %s\n\n",
      o.gpt_job.c_str(), static_cast<long long>(o.trial_batch), to_string(config).c_str(),
      static_cast<long long>(o.trial_steps), o.rounds, o.oomtune.c_str());
  std::printf("| trial | median wall s | min-max s | steady step ms (its report) |\n|---|---|---|---|\n");
  std::printf("| in-process run_trial | %.3f | %.3f-%.3f | %.1f |\n", median(in_wall),
              *std::min_element(in_wall.begin(), in_wall.end()), *std::max_element(in_wall.begin(), in_wall.end()),
              1e3 * step);
  std::printf("| child run_trial_in_child | %.3f | %.3f-%.3f | %.1f |\n", median(child_wall),
              *std::min_element(child_wall.begin(), child_wall.end()),
              *std::max_element(child_wall.begin(), child_wall.end()), 1e3 * median(child_step));
  std::printf("| exec `oomtune --version` only | %.3f | %.3f-%.3f | - |\n\n", median(exec_wall),
              *std::min_element(exec_wall.begin(), exec_wall.end()),
              *std::max_element(exec_wall.begin(), exec_wall.end()));
  std::printf(
      "child overhead per trial: %.3f s = %.1f training steps of %.1f ms (GPT, batch %lld); child / "
      "in-process wall: %.2fx\n\n",
      overhead, step > 0 ? overhead / step : 0.0, 1e3 * step, static_cast<long long>(o.trial_batch),
      median(child_wall) / median(in_wall));
}

// ---- (b) graph executor optimization off vs on ----------------------------

struct ModeResult {
  std::vector<double> peak_mb, warmup_s, compile_ms, steady_ms;
};

void executor_modes(const Options& o, const std::string& label, oomtune::JobSpec job, int64_t steps) {
  using namespace oomtune;
  job.budget_bytes.reset();
  TrialOptions trial;
  trial.total_steps = steps;
  trial.enforce_budget = false;
  ChildTrialOptions child;
  child.executable = o.oomtune;
  child.timeout_seconds = 600;
  const TrainingConfig config = baseline_config(job);
  ModeResult results[2];  // [0] off, [1] on
  for (int r = 0; r < o.exec_rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int mode = (r + k) % 2;
      job.optimizing_executor = mode == 1;
      const ProbeReport report = run_trial_in_child(job, config, trial, child);
      require_ok(report, label + (mode ? " executor on" : " executor off"));
      const std::vector<double>& t = report.timing.step_seconds;  // steps 2..N
      ModeResult& m = results[mode];
      m.peak_mb.push_back(mb(report.peak_bytes));
      m.warmup_s.push_back(report.timing.warmup_seconds);
      m.compile_ms.push_back(1e3 * std::max(t.at(0), t.at(1)));
      m.steady_ms.push_back(1e3 * median(std::vector<double>(t.begin() + 2, t.end())));
    }
  }
  for (int mode = 0; mode < 2; ++mode) {
    const ModeResult& m = results[mode];
    std::printf("| %s | %s | %.2f | %.2f | %.1f | %.1f |", label.c_str(), mode ? "on" : "off", median(m.peak_mb),
                median(m.warmup_s), median(m.compile_ms), median(m.steady_ms));
    if (mode == 1)
      std::printf(" %.3f | %.2fx |\n", median(results[1].peak_mb) / median(results[0].peak_mb),
                  median(results[1].steady_ms) / median(results[0].steady_ms));
    else
      std::printf(" - | - |\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace oomtune;
  const Options o = parse(argc, argv);
  const std::string load_before = load_average();
  std::printf("## bench/trials: trial isolation and graph-executor optimization\n\n");
  std::printf(
      "libtorch %s, %u hardware threads, load average at start %s (shared machine: compare within a "
      "table, not across runs)\n\n",
      compat::torch_version(), std::thread::hardware_concurrency(), load_before.c_str());
  child_cost(o);

  std::printf("### (b) graph-executor optimization off vs on (each trial in its own child process)\n\n");
  JobSpec gpt = load_job_spec(o.gpt_job);
  gpt.global_batch = o.gpt_batch;
  std::printf("GPT: %s at global batch %lld, %lld steps per trial; ", o.gpt_job.c_str(),
              static_cast<long long>(o.gpt_batch), static_cast<long long>(o.gpt_steps));
  JobSpec resnet;
  if (!g_skip_resnet) {
    resnet = load_job_spec(o.resnet_job);
    resnet.global_batch = o.resnet_batch;
    for (InputSpec& input : resnet.inputs)
      if (input.shape.size() == 4) input.shape = {kBatchDim, 3, o.resnet_image, o.resnet_image};
    std::printf("ResNet-50: %s at global batch %lld, %lldx%lld images (CPU time), %s, %lld steps per trial; ",
                o.resnet_job.c_str(), static_cast<long long>(o.resnet_batch), static_cast<long long>(o.resnet_image),
                static_cast<long long>(o.resnet_image), resnet.optimizer.kind.c_str(),
                static_cast<long long>(o.resnet_steps));
  }
  std::printf("%d trials per mode and model, modes alternating; medians\n\n", o.exec_rounds);
  std::printf(
      "| model | executor optimize | peak MB | step 1 (warm-up) s | steps 2-3 max ms | steady step ms "
      "(steps 4..N) | peak on/off | steady on/off |\n|---|---|---|---|---|---|---|---|\n");
  executor_modes(o, "GPT b" + std::to_string(o.gpt_batch), gpt, o.gpt_steps);
  if (!g_skip_resnet)
    executor_modes(o, "ResNet-50 b" + std::to_string(o.resnet_batch) + " " + std::to_string(o.resnet_image) + "px",
                   resnet, o.resnet_steps);
  std::printf("\nload average at end %s\n", load_average().c_str());
  return 0;
}
