// Benchmark (issues #3, #8): what the MemoryTracker costs a training step.
//
// One process, one loaded model (examples/gpt.toml at --batch, AdamW, graph
// executor optimization off as oomtune runs models), four variants of the
// same training step, interleaved one step at a time in a rotating order so
// that load on the machine falls on all of them alike:
//   none      no tracker (the phase hook does nothing)
//   none'     no tracker again: an A/A pair that shows the noise floor
//   tracker   MemoryTracker installed, attribute_ops on, record_events off,
//             begin_phase at every phase boundary (as run_trial does)
//   events    the same with record_events on
// The tracker is installed before and removed after each timed step, outside
// the timed region (its tensors are all freed by the end of a step: the
// optimizer state was made by the untracked warm-up steps).
//
// Each step is timed in wall time and in process CPU time; the targets are
// judged on the CPU-time ratio of medians (the tracker's cost is CPU work, and
// on a loaded shared machine wall time mostly measures the scheduler). Also
// reported: wall ratios and the median of per-round paired ratios. Targets:
//   tracker / none   <= 1.03 (issue #3)
//   events / tracker <= 1.05 (issue #8)

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>

#include "bench/common/bench_util.h"
#include "compat/torch_compat.h"
#include "job/job_spec.h"
#include "probes/memory_tracker.h"
#include "session/batch.h"
#include "session/model_session.h"
#include "strategies/training_step.h"

namespace {

using Clock = std::chrono::steady_clock;

oomtune::bench::StepBenchOptions parse(int argc, char** argv) {
  return oomtune::bench::parse_step_bench_options(argc, argv, "bench_tracker",
                                                  {std::string(OOMTUNE_BENCH_EXAMPLES_DIR) + "/gpt.toml", 8, 60, 3});
}

using oomtune::bench::load_average;
using oomtune::bench::step_bench_setup;

double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const double at = q * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(at);
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (at - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

double median(const std::vector<double>& values) { return quantile(values, 0.5); }

enum Variant : int { kNone = 0, kNoneAgain, kTracker, kEvents, kNumVariants };

struct VariantSpec {
  const char* name;
  bool tracker;
  bool events;
};

constexpr VariantSpec kVariants[kNumVariants] = {
    {"no tracker", false, false},
    {"no tracker (A/A)", false, false},
    {"tracker, attribute_ops on, events off", true, false},
    {"tracker, attribute_ops on, events on", true, true},
};

// CPU seconds of this process (all its threads), for timing that a loaded
// machine's scheduler does not stretch: the tracker's cost is CPU work.
double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return 1e3 * static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_nsec);
}

struct Samples {
  std::vector<double> ms;            // wall
  std::vector<double> cpu_ms;        // process CPU time
  int64_t events_per_step = 0;       // COUNT: recorded allocation/free events of one step
  int64_t allocations_per_step = 0;  // COUNT: device allocations of one step
};

}  // namespace

int main(int argc, char** argv) {
  using namespace oomtune;
  const auto options = parse(argc, argv);
  const JobSpec job = bench::load_step_bench_job(options);
  set_optimizing_executor(false);

  ModelSession session(job);
  TrainingStep step(session, baseline_config(job));
  const Batch batch = make_batch(job, job.global_batch, job.seed);
  const PhaseHook no_hook = [](Phase) {};
  for (int i = 0; i < options.warmup; ++i) step.run(batch, no_hook);

  const std::string load_before = load_average();
  std::vector<Samples> samples(kNumVariants);
  for (int round = 0; round < options.rounds; ++round) {
    for (int k = 0; k < kNumVariants; ++k) {
      const int v = (round + k) % kNumVariants;
      const VariantSpec& spec = kVariants[v];
      std::optional<MemoryTracker> tracker;
      if (spec.tracker) {
        TrackerOptions tracker_options;
        tracker_options.attribute_ops = true;
        tracker_options.record_events = spec.events;
        tracker.emplace(tracker_options);
      }
      const PhaseHook hook = tracker ? PhaseHook([&](Phase phase) { tracker->begin_phase(phase); }) : no_hook;
      const double cpu_start = process_cpu_ms();
      const auto start = Clock::now();
      step.run(batch, hook);
      if (tracker) tracker->end_phase();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      samples[v].cpu_ms.push_back(process_cpu_ms() - cpu_start);
      samples[v].ms.push_back(ms);
      if (tracker) {
        samples[v].events_per_step = static_cast<int64_t>(tracker->events().size());
        int64_t allocations = 0;
        for (std::size_t p = 0; p < kNumPhases; ++p) allocations += tracker->phase(static_cast<Phase>(p)).allocations;
        samples[v].allocations_per_step = allocations;
      }
    }
  }
  const std::string load_after = load_average();

  // Paired ratios: per round, variant time / its baseline's time in the same round.
  const auto paired = [&](const std::vector<double>& variant, const std::vector<double>& baseline) {
    std::vector<double> ratios;
    for (std::size_t r = 0; r < variant.size(); ++r) ratios.push_back(variant[r] / baseline[r]);
    return median(ratios);
  };
  struct Row {
    int variant;
    int baseline;
    double target;  // <= 0: no target
  };
  const Row rows[] = {{kNone, -1, 0}, {kNoneAgain, kNone, 0}, {kTracker, kNone, 1.03}, {kEvents, kTracker, 1.05}};

  std::printf("## bench/tracker: MemoryTracker cost per training step\n\n");
  std::printf("%s\n", step_bench_setup(options.job, job.global_batch, job.optimizer.kind).c_str());
  std::printf(
      "%d rounds x %d variants, one step each, order rotated per round; load average before %s, after "
      "%s.\nShared, loaded machine: wall time mostly measures the scheduler, so the targets are judged "
      "on process CPU time (the tracker's cost is CPU work); the A/A row is the noise floor.\n\n",
      options.rounds, static_cast<int>(kNumVariants), load_before.c_str(), load_after.c_str());
  std::printf(
      "| variant | vs | wall median ms (p25-p75) | wall ratio | CPU median ms (p25-p75) | CPU ratio of "
      "medians | CPU median paired ratio | target | result |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  bool all_met = true;
  for (const Row& row : rows) {
    const Samples& s = samples[row.variant];
    std::printf("| %s | %s | %.1f (%.1f-%.1f) | ", kVariants[row.variant].name,
                row.baseline < 0 ? "-" : kVariants[row.baseline].name, median(s.ms), quantile(s.ms, 0.25),
                quantile(s.ms, 0.75));
    if (row.baseline < 0) {
      std::printf("- | %.1f (%.1f-%.1f) | - | - | - | baseline |\n", median(s.cpu_ms), quantile(s.cpu_ms, 0.25),
                  quantile(s.cpu_ms, 0.75));
      continue;
    }
    const Samples& b = samples[row.baseline];
    const double ratio = median(s.cpu_ms) / median(b.cpu_ms);
    std::printf("%.3f | %.1f (%.1f-%.1f) | %.3f | %.3f |", median(s.ms) / median(b.ms), median(s.cpu_ms),
                quantile(s.cpu_ms, 0.25), quantile(s.cpu_ms, 0.75), ratio, paired(s.cpu_ms, b.cpu_ms));
    if (row.target > 0) {
      const bool met = ratio <= row.target;
      all_met = all_met && met;
      std::printf(" <= %.2f | %s |\n", row.target, met ? "pass" : "FAIL");
    } else {
      std::printf(" noise floor | - |\n");
    }
  }
  std::printf("\nper step: %lld device allocations, %lld recorded events (events on)\n",
              static_cast<long long>(samples[kTracker].allocations_per_step),
              static_cast<long long>(samples[kEvents].events_per_step));
  std::printf("targets (tracker/none <= 1.03, events on/off <= 1.05, CPU-time ratio of medians): %s\n",
              all_met ? "met" : "NOT met");
  return 0;
}
