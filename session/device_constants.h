#pragma once
// Device constants baked into a traced graph (and its tensor constants).
//
// A model traced on CPU that creates a tensor inside forward
// (`torch.arange(T, device=x.device)`) records device=cpu as a constant; on
// CUDA it then fails with "Expected all tensors to be on the same device"
// (issue #10, measured on the GPU machine; both Hugging Face GPT-2 fixtures,
// 7 nodes each). On CUDA, as on meta, oomtune makes those constants the
// trial's device, where the eager model would make the tensors, and says so
// in a note naming each node and its source line.

#include <string>
#include <vector>

#include <torch/script.h>

namespace oomtune {

/// One node that uses a constant CPU device.
struct DeviceConstant {
  std::string method;  // "forward" or "blocks.0.forward"
  std::string op;      // "aten::arange"
  std::string source;  // "model.py:12:8" when the graph kept source ranges, else ""
};

/// Every node, in every method of every submodule, that takes a constant
/// device "cpu" as an argument. Order: module order, then graph order.
std::vector<DeviceConstant> find_cpu_device_constants(const torch::jit::Module& module);

/// Makes every constant device "cpu" in every method of `module` `device`
/// instead, and returns how many constants it changed. For a run on CUDA:
/// the eager model made those tensors on its input's device. For a run on meta:
/// a model traced on the CPU creates its position ids and masks with
/// device=cpu (`torch.arange(T, device=x.device)` in a Hugging Face Llama),
/// which would meet the meta parameters and fail with "Expected all tensors
/// to be on the same device". On meta nothing is computed, so where a
/// tensor is made changes no byte the tracker counts on the device.
int retarget_cpu_device_constants(torch::jit::Module& module, c10::Device device);

/// Every tensor constant in the graphs of every method of every submodule
/// of `module`, each tensor once, in module then graph order: a traced
/// file's scalar constants (the 0.5 of GELU's tanh approximation, the 2 of a
/// Llama's rotate_half), kept in the archive's constants/ records. They are
/// memory of the model on whatever device the file loads to.
std::vector<at::Tensor> tensor_constants(const torch::jit::Module& module);

/// The note printed for `found` when the job runs on `device` (CUDA) and
/// oomtune has retargeted them: one line per node, and what it cannot know
/// (a forward that moves a tensor to the CPU on purpose now keeps it on the
/// device; scripting, or tracing on the GPU, records the intent). Empty
/// when `found` is empty.
std::string device_constant_note(const std::string& model_path, const std::vector<DeviceConstant>& found,
                                 c10::Device device);

}  // namespace oomtune
