#include "snapshot_paths.h"

#include <filesystem>

#include <fmt/format.h>

namespace oomtune {

void add_snapshot_flags(CLI::App& cmd, SnapshotFlags& flags) {
  CLI::Option* dir =
      cmd.add_option("--snapshot-dir", flags.dir,
                     "On a GPU, where a trial that runs out of memory writes the allocator's snapshot for oomtune "
                     "diagnose (default oomtune-snapshots)");
  cmd.add_flag("--no-snapshots", flags.none, "Record no allocator history on a GPU and write no snapshot")
      ->excludes(dir);
}

SnapshotPaths::SnapshotPaths(const SnapshotFlags& flags, const JobSpec& job) {
  if (flags.none || flags.dir.empty() || job.device != Device::kCuda) return;
  const std::string& named = job.spec_path.empty() ? job.model_path : job.spec_path;
  prefix_ = (std::filesystem::path(flags.dir) / std::filesystem::path(named).stem()).string() + "-";
}

std::string SnapshotPaths::next(const TrainingConfig& config) {
  if (prefix_.empty()) return "";
  return fmt::format("{}{}-{}x{}.pickle", prefix_, ++trials_, config.micro_batch, config.accumulation_steps);
}

}  // namespace oomtune
