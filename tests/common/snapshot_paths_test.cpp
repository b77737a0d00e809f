// Where GPU trials write their snapshots (src/snapshot_paths.h): paths
// worked out by hand from the job's name, the trial order and the
// configuration's micro-batch and accumulation.

#include "snapshot_paths.h"

#include <gtest/gtest.h>

namespace oomtune {
namespace {

TrainingConfig config(int64_t micro_batch, int64_t accumulation) {
  TrainingConfig c;
  c.micro_batch = micro_batch;
  c.accumulation_steps = accumulation;
  return c;
}

TEST(SnapshotPaths, GpuTrialsAreNumberedInTheFolderUnderTheJobsName) {
  JobSpec job;
  job.device = Device::kCuda;
  job.spec_path = "jobs/gpt.toml";
  SnapshotFlags flags;
  flags.dir = "/tmp/snaps";
  SnapshotPaths paths(flags, job);
  EXPECT_EQ(paths.next(config(8, 2)), "/tmp/snaps/gpt-1-8x2.pickle");
  EXPECT_EQ(paths.next(config(16, 1)), "/tmp/snaps/gpt-2-16x1.pickle");
  EXPECT_EQ(SnapshotPaths(SnapshotFlags{}, job).next(config(4, 1)), "oomtune-snapshots/gpt-1-4x1.pickle");
}

TEST(SnapshotPaths, NoneOffTheGpuOrWhenTurnedOff) {
  JobSpec job;
  job.spec_path = "gpt.toml";
  job.device = Device::kCpu;
  EXPECT_EQ(SnapshotPaths(SnapshotFlags{}, job).next(config(8, 1)), "");
  job.device = Device::kMeta;
  EXPECT_EQ(SnapshotPaths(SnapshotFlags{}, job).next(config(8, 1)), "");
  job.device = Device::kCuda;
  SnapshotFlags off;
  CLI::App app;
  add_snapshot_flags(app, off);
  app.parse(std::vector<std::string>{"--no-snapshots"});
  EXPECT_TRUE(off.none);
  EXPECT_EQ(SnapshotPaths(off, job).next(config(8, 1)), "");
  SnapshotFlags elsewhere;
  CLI::App app2;
  add_snapshot_flags(app2, elsewhere);
  app2.parse(std::vector<std::string>{"d", "--snapshot-dir"});  // CLI11 parses a reversed argv
  EXPECT_EQ(SnapshotPaths(elsewhere, job).next(config(8, 1)), "d/gpt-1-8x1.pickle");
}

}  // namespace
}  // namespace oomtune
