#pragma once
// How one trial runs (trial/trial_runner.h runs it). A plain record: the
// parent of a child trial sends it as JSON (trial/trial_request.h).

#include <cstdint>
#include <functional>
#include <string>

#include "common/phase.h"

namespace oomtune {

/// How a trial runs.
struct TrialOptions {
  int64_t min_timed_steps = 2;   // COUNT: timed steps after the measured step's warm-up
  int64_t max_timed_steps = 8;   // COUNT: upper bound while waiting for steady timing
  int64_t total_steps = 0;       // COUNT: when > 0, run exactly this many steps (verification runs)
  bool enforce_budget = true;    // the job's usable budget caps live device bytes
  bool record_events = false;    // keep the allocation stream and predict reserved bytes
  std::string step_events_path;  // with record_events: write the measured step's device events here
                                 // (allocsim/step_events_json.h); "" writes none
  // On a GPU: record the caching allocator's history with oomtune's phase
  // marks, and if the trial runs out of memory write its snapshot (the
  // pickle torch.cuda.memory._dump_snapshot writes) here; "" records none.
  std::string snapshot_path;
  // Return after the device checks (require_cuda_trial, require_meta_trial)
  // with nothing measured: the parent asks whether the job's device can run
  // before it spends trials elsewhere (autotune's meta runs come first).
  bool device_check_only = false;
  double timing_tolerance = 0.15;       // relative agreement of consecutive timed steps
  std::function<void(Phase)> on_phase;  // told as each phase begins (crash reports, fault tests); not sent to a child
};

}  // namespace oomtune
