#pragma once
// Trials in child processes: the parent writes a trial request (job, config,
// options) as JSON, runs `oomtune trial REQUEST RESULT`, and reads the
// child's ProbeReport back. A crash by signal, a timeout or an error is an
// outcome in the report, never the end of the search; each trial starts
// with a fresh allocator, so one trial's cache never distorts the next
// (TrialServer, for meta trials only, runs several in one child).
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

/// Trials one after another in one long-lived child process (`oomtune
/// trial --serve`), which loads libtorch and the trial module once: about
/// 0.5 s of each trial of the example GPT on meta, more than the trial
/// itself (bench/meta_memory). Only for trials whose report does not depend
/// on what ran before them in the process: the meta device's (no data, no
/// allocator cache, no timing; probes and verification runs keep a fresh
/// process each: run_trial_in_child). Isolation stays: a crash, an error
/// exit or a timeout (ChildTrialOptions::timeout_seconds, per trial) is
/// that trial's outcome, as with run_trial_in_child, and the next trial
/// starts a fresh child. The child dies with this object (or its process).
/// Not copyable; one trial at a time.
class TrialServer {
 public:
  explicit TrialServer(ChildTrialOptions child);
  ~TrialServer();
  TrialServer(const TrialServer&) = delete;
  TrialServer& operator=(const TrialServer&) = delete;

  /// Runs one trial in the child (starting it when none runs) and returns
  /// its report, with the outcomes of run_trial_in_child. Throws Error when
  /// no child can be started (the trial module is missing, fork failure, no
  /// temp folder).
  ProbeReport run(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options);

  /// COUNT: child processes started so far (1 when every trial ran in one).
  int children_started() const { return children_started_; }

 private:
  void stop();
  ChildTrialOptions child_;
  int pid_ = -1;          // the child serving trials; -1: none
  int requests_fd_ = -1;  // its standard input: one "REQUEST<TAB>RESULT" line per trial
  std::string dir_;       // its trials' files
  int trials_ = 0;
  int children_started_ = 0;
};

}  // namespace oomtune
