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
  const std::string note = device_constant_note("m.pt", found, c10::Device(c10::DeviceType::CUDA, 0));
  EXPECT_NE(note.find("note: m.pt: traced on the CPU: 1 node(s) create tensors on a constant CPU device; oomtune "
                      "makes them on cuda:0"),
            std::string::npos)
      << note;
  EXPECT_NE(note.find("torch.jit.script the model, or trace it on the GPU"), std::string::npos);
  EXPECT_NE(note.find("note:   aten::arange in forward"), std::string::npos);
}

// What the run on CUDA does to such a file (no GPU needed to see the
// graph change): every constant CPU device becomes the trial's.
TEST(DeviceConstants, RetargetingLeavesNoConstantCpuDevice) {
  const std::string traced = testing::test_model("arange_trace");
  OOMTUNE_REQUIRE_FILE(traced);
  torch::jit::Module module = torch::jit::load(traced);
  const std::size_t found = find_cpu_device_constants(module).size();
  ASSERT_GT(found, 0u);
  EXPECT_GE(retarget_cpu_device_constants(module, c10::Device(c10::DeviceType::CUDA, 0)), static_cast<int>(found));
  EXPECT_TRUE(find_cpu_device_constants(module).empty());
  EXPECT_EQ(retarget_cpu_device_constants(module, c10::Device(c10::DeviceType::CUDA, 0)), 0);
}

TEST(DeviceConstants, TheScriptedModelTakesTheDeviceFromItsInput) {
  const std::string scripted = testing::test_model("arange_script");
  OOMTUNE_REQUIRE_FILE(scripted);
  EXPECT_TRUE(find_cpu_device_constants(torch::jit::load(scripted)).empty());
  EXPECT_EQ(device_constant_note("m.pt", {}, c10::Device(c10::DeviceType::CUDA, 0)), "");
}

}  // namespace
}  // namespace oomtune
