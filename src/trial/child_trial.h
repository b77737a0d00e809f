#pragma once
// Trials in child processes: the parent writes a trial request (job, config,
// options) as JSON, runs `oomtune trial REQUEST RESULT`, and reads the
// child's ProbeReport back. A crash by signal, a timeout or an error is an
// outcome in the report, never the end of the search; each trial starts
// with a fresh allocator, so one trial's cache never distorts the next.
//
// Test hook: the environment variable OOMTUNE_TEST_FAULT = "KIND:PHASE[:TEXT]"
// (KIND abort, segv or hang; PHASE forward, loss, backward or optimizer)
// makes a child whose config string followed by ',' contains TEXT (any
// child when TEXT is absent; "precision=bf16," names bf16 autocast only)
// fail that way when the phase begins.

#include <string>

#include "job/job_spec.h"
#include "probes/probe_report.h"
#include "strategies/training_config.h"
#include "trial/trial_runner.h"

namespace oomtune {

/// How the parent runs a child trial.
struct ChildTrialOptions {
  std::string executable;       // the oomtune binary; "" = this process's own (/proc/self/exe)
  double timeout_seconds = 600; // wall-clock limit; past it the child is killed (SIGKILL)
};

/// Runs one trial in a child process and returns its report. Outcomes:
/// the child's own (ok, out_of_memory, error), kCrashed ("crashed: SIGSEGV
/// during forward"), kTimeout. Throws Error only when no child can be
/// started at all (fork/exec failure, no temp folder).
ProbeReport run_trial_in_child(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options,
                               const ChildTrialOptions& child);

/// The child side (the hidden `trial` subcommand): reads the request,
/// runs the trial, writes the report atomically to `result_path`. Model and
/// config errors become outcome kError. Returns the process exit code.
int serve_trial(const std::string& request_path, const std::string& result_path);

}  // namespace oomtune
