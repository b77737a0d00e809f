#pragma once
// Where GPU trials that run out of memory write the caching allocator's
// snapshot (TrialOptions::snapshot_path; issue #44 item 4), for `oomtune
// diagnose`: DIR/<job>-<n>-<micro>x<accum>.pickle, numbered in the order the
// trials run, the folder made by the trial that writes. Only a job on a GPU
// records one; `--no-snapshots` records none. Shared by probe and autotune.

#include <string>

#include <CLI/CLI.hpp>

#include "job/job_spec.h"
#include "strategies/training_config.h"

namespace oomtune {

/// The folder, or none.
struct SnapshotFlags {
  std::string dir = "oomtune-snapshots";  // relative to the working folder
  bool none = false;                      // --no-snapshots
};

/// Adds --snapshot-dir and --no-snapshots to `cmd`.
void add_snapshot_flags(CLI::App& cmd, SnapshotFlags& flags);

/// Hands out the trials' snapshot paths for one job.
class SnapshotPaths {
 public:
  SnapshotPaths(const SnapshotFlags& flags, const JobSpec& job);
  /// The next trial's path; "" when the job is not on a GPU or snapshots
  /// are off.
  std::string next(const TrainingConfig& config);

 private:
  std::string prefix_;  // "DIR/<job stem>-"; "" = off
  int trials_ = 0;
};

}  // namespace oomtune
