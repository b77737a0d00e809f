#include "common/host_memory.h"

#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace oomtune {
namespace {

TEST(HostMemory, ParsesACgroupLimit) {
  EXPECT_EQ(parse_cgroup_memory_limit("1073741824\n"), int64_t{1} << 30);
  EXPECT_EQ(parse_cgroup_memory_limit("9223372036854771712\n"), 9223372036854771712);  // v1's "no limit"
  EXPECT_EQ(parse_cgroup_memory_limit("max\n"), std::nullopt);                         // v2's "no limit"
  EXPECT_EQ(parse_cgroup_memory_limit(""), std::nullopt);
  EXPECT_EQ(parse_cgroup_memory_limit("12 MiB"), std::nullopt);
  EXPECT_EQ(parse_cgroup_memory_limit("99999999999999999999"), std::nullopt);  // past int64
}

// /proc/meminfo's MemTotal is the physical memory sysconf counts; a
// container's cgroup limit lowers it.
TEST(HostMemory, IsThePhysicalMemoryOrTheCgroupLimitBelowIt) {
  std::ifstream meminfo("/proc/meminfo");
  if (!meminfo) GTEST_SKIP() << "no /proc/meminfo";
  std::string key;
  int64_t kib = 0;
  while (meminfo >> key && key != "MemTotal:") meminfo.ignore(1 << 10, '\n');
  ASSERT_TRUE(meminfo >> kib);
  int64_t expected = kib * 1024;
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream file(path);
    std::string text;
    if (file >> text && text != "max") expected = std::min<int64_t>(expected, std::stoll(text));
  }
  EXPECT_EQ(machine_memory_bytes(), expected);
}

}  // namespace
}  // namespace oomtune
