#include "session/device_constants.h"

#include <gtest/gtest.h>

#include "support/require_file.h"
#include "test_jobs.h"

namespace oomtune {
namespace {

TEST(DeviceConstants, ATraceOnCpuBakesTheDeviceIn) {
  const std::string traced = testing::test_model("arange_trace");
  OOMTUNE_REQUIRE_FILE(traced);
  const auto found = find_cpu_device_constants(torch::jit::load(traced));
  ASSERT_FALSE(found.empty());
  EXPECT_EQ(found[0].op, "aten::arange");
  EXPECT_EQ(found[0].method, "forward");
  const std::string warning = device_constant_warning("m.pt", found);
  EXPECT_NE(warning.find("warning: m.pt: 1 node(s) create tensors on a constant CPU device"), std::string::npos)
      << warning;
  EXPECT_NE(warning.find("torch.jit.script the model instead of tracing it"), std::string::npos);
  EXPECT_NE(warning.find("aten::arange in forward"), std::string::npos);
}

TEST(DeviceConstants, TheScriptedModelTakesTheDeviceFromItsInput) {
  const std::string scripted = testing::test_model("arange_script");
  OOMTUNE_REQUIRE_FILE(scripted);
  EXPECT_TRUE(find_cpu_device_constants(torch::jit::load(scripted)).empty());
  EXPECT_EQ(device_constant_warning("m.pt", {}), "");
}

}  // namespace
}  // namespace oomtune
