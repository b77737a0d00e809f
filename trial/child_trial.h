#pragma once
// Trials in child processes: the parent writes a trial request (job, config,
// options) as JSON, runs `oomtune trial REQUEST RESULT`, and reads the
// child's ProbeReport back. A crash by signal, a timeout or an error is an
// outcome in the report, never the end of the search; each trial starts
// with a fresh allocator, so one trial's cache never distorts the next.
//
// The request and report travel as files in a fresh folder under $TMPDIR
// (/tmp by default; trial/trial_request.h); the child side is
// trial/serve_trial.h. No libtorch on this side.
//
// The child dies with its parent (PR_SET_PDEATHSIG), so no trial outlives an
// oomtune that was killed. SIGINT, SIGTERM or SIGHUP during a trial kill the
// child, remove the trial's folder and end oomtune by that signal.

#include <string>

#include "job/job_spec.h"
#include "probes/probe_report.h"
#include "strategies/training_config.h"
#include "trial/trial_options.h"

namespace oomtune {

/// How the parent runs a child trial.
struct ChildTrialOptions {
  std::string executable;        // the oomtune binary; "" = this process's own (/proc/self/exe)
  double timeout_seconds = 600;  // wall-clock limit; past it the child is killed (SIGKILL)
};

/// Runs one trial in a child process and returns its report. Outcomes:
/// the child's own (ok, out_of_memory, error), kCrashed ("crashed: SIGSEGV
/// during forward"), kTimeout. Throws Error only when no child can be
/// started at all (the trial module beside the executable is missing,
/// fork/exec failure, no temp folder).
ProbeReport run_trial_in_child(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options,
                               const ChildTrialOptions& child);

}  // namespace oomtune
