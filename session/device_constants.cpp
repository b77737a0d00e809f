#include "session/device_constants.h"

#include <unordered_set>

#include <fmt/format.h>
#include <torch/csrc/jit/ir/ir.h>

#include "session/node_source.h"

namespace oomtune {
namespace {

bool is_cpu_device_constant(const torch::jit::Value* value) {
  if (!value->type()->isSubtypeOf(*c10::DeviceObjType::get())) return false;
  const torch::jit::Node* producer = value->node();
  if (producer->kind() != c10::prim::Constant) return false;
  const auto constant = torch::jit::toIValue(value);
  return constant && constant->isDevice() && constant->toDevice().is_cpu();
}

void scan_block(const torch::jit::Block* block, const std::string& method, std::vector<DeviceConstant>& found) {
  for (const torch::jit::Node* node : block->nodes()) {
    for (const torch::jit::Value* input : node->inputs()) {
      if (is_cpu_device_constant(input)) {
        found.push_back({method, node->kind().toQualString(), node_source(node)});
        break;
      }
    }
    for (const torch::jit::Block* inner : node->blocks()) scan_block(inner, method, found);
  }
}

void scan_module(const torch::jit::Module& module, const std::string& prefix, std::vector<DeviceConstant>& found) {
  for (const torch::jit::Method& method : module.get_methods())
    scan_block(method.graph()->block(), prefix + method.name(), found);
  for (const torch::jit::NameModule& child : module.named_children())
    scan_module(child.value, prefix + child.name + ".", found);
}

int retarget_block(torch::jit::Block* block, torch::jit::Graph& graph, c10::Device device) {
  int changed = 0;
  for (torch::jit::Node* node : block->nodes()) {
    for (std::size_t i = 0; i < node->inputs().size(); ++i) {
      torch::jit::Value* input = node->inputs()[i];
      if (!is_cpu_device_constant(input)) continue;
      torch::jit::WithInsertPoint guard(node);
      node->replaceInput(i, graph.insertConstant(device));
      ++changed;
    }
    for (torch::jit::Block* inner : node->blocks()) changed += retarget_block(inner, graph, device);
  }
  return changed;
}

void collect_tensor_constants(const torch::jit::Block* block, std::unordered_set<const c10::TensorImpl*>& seen,
                              std::vector<at::Tensor>& out) {
  for (const torch::jit::Node* node : block->nodes()) {
    if (node->kind() == c10::prim::Constant) {
      const auto constant = torch::jit::toIValue(node->output());
      if (constant && constant->isTensor() && seen.insert(constant->toTensor().unsafeGetTensorImpl()).second)
        out.push_back(constant->toTensor());
    }
    for (const torch::jit::Block* inner : node->blocks()) collect_tensor_constants(inner, seen, out);
  }
}

}  // namespace

std::vector<at::Tensor> tensor_constants(const torch::jit::Module& module) {
  std::vector<at::Tensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const torch::jit::Module& m : module.modules())
    for (const torch::jit::Method& method : m.get_methods())
      collect_tensor_constants(method.graph()->block(), seen, out);
  return out;
}

int retarget_cpu_device_constants(torch::jit::Module& module, c10::Device device) {
  int changed = 0;
  for (const torch::jit::Module& m : module.modules())
    for (const torch::jit::Method& method : m.get_methods())
      changed += retarget_block(method.graph()->block(), *method.graph(), device);
  return changed;
}

std::vector<DeviceConstant> find_cpu_device_constants(const torch::jit::Module& module) {
  std::vector<DeviceConstant> found;
  scan_module(module, "", found);
  return found;
}

std::string device_constant_note(const std::string& model_path, const std::vector<DeviceConstant>& found,
                                 c10::Device device) {
  if (found.empty()) return "";
  const std::string where = device.str();
  std::string out = fmt::format(
      "note: {}: traced on the CPU: {} node(s) create tensors on a constant CPU device; oomtune makes them on {}, "
      "as the eager model (device=x.device) would. A forward that moves a tensor to the CPU on purpose would now "
      "keep it on {}: torch.jit.script the model, or trace it on the GPU, to keep that.\n",
      model_path, found.size(), where, where);
  for (const DeviceConstant& d : found)
    out += fmt::format("note:   {} in {}{}\n", d.op, d.method, d.source.empty() ? "" : " at " + d.source);
  return out;
}

}  // namespace oomtune
