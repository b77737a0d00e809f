#pragma once
// What the benchmark programs share: reading the machine's load, medians,
// and the options and set-up line of the step benchmarks (tracker,
// strategies).

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include "compat/torch_compat.h"
#include "job/job_spec.h"

namespace oomtune::bench {

/// "/proc/loadavg"'s 1, 5 and 15-minute load averages, e.g. "3.54 3.12 2.90".
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

/// The median (mean of the middle two for an even count); 0 when empty.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

/// Options of a benchmark that times training steps of one job.
struct StepBenchOptions {
  std::string job;  // job spec TOML
  int64_t batch;    // COUNT: replaces the job's global batch
  int rounds;       // COUNT: timed steps per variant (>= 3)
  int warmup;       // COUNT: untimed steps first (>= 1)
};

/// Parses --job, --batch, --rounds (raised to 3) and --warmup (raised to 1)
/// over `defaults` with CLI11;
/// --help prints them and exits 0, a bad flag exits 2 with CLI11's message.
inline StepBenchOptions parse_step_bench_options(int argc, char** argv, const std::string& name,
                                                 StepBenchOptions defaults) {
  CLI::App app{name + ": times training steps of one job"};
  app.add_option("--job", defaults.job, "Job spec (TOML)")->capture_default_str();
  app.add_option("--batch", defaults.batch, "Global batch (replaces the job's)")->capture_default_str();
  app.add_option("--rounds", defaults.rounds, "Timed steps per variant (at least 3)")->capture_default_str();
  app.add_option("--warmup", defaults.warmup, "Untimed steps first (at least 1)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  defaults.rounds = std::max(3, defaults.rounds);
  defaults.warmup = std::max(1, defaults.warmup);
  return defaults;
}

/// The job a step benchmark times: the spec at options.job with the global
/// batch options.batch, no budget (measure, do not cap) and graph-executor
/// optimization off (oomtune's default). Throws what load_job_spec throws.
inline JobSpec load_step_bench_job(const StepBenchOptions& options) {
  JobSpec job = load_job_spec(options.job);
  job.global_batch = options.batch;
  job.budget_bytes.reset();
  job.optimizing_executor = false;
  return job;
}

/// What a step benchmark ran on, one line: "job J, global batch B, optimizer
/// O, graph executor optimize off, libtorch V, T intra-op threads, H
/// hardware threads".
inline std::string step_bench_setup(const std::string& job, int64_t global_batch, const std::string& optimizer) {
  return "job " + job + ", global batch " + std::to_string(global_batch) + ", optimizer " + optimizer +
         ", graph executor optimize off, libtorch " + compat::torch_version() + ", " +
         std::to_string(at::get_num_threads()) + " intra-op threads, " +
         std::to_string(std::thread::hardware_concurrency()) + " hardware threads";
}

}  // namespace oomtune::bench
