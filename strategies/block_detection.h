#pragma once
// Block detection: finds the repeated submodules of a TorchScript model that
// activation checkpointing can recompute (strategies/activation_checkpointing.h).
//
// Rules:
// - A block is a child of a container (nn.ModuleList or nn.Sequential) whose
//   children are two or more modules of one class, each with submodules of
//   its own: GPT's `blocks.0` .. `blocks.3`, ResNet's `layer1.0`, `layer1.1`,
//   ..., `layer4.1`. A Sequential of mixed layers (Linear, GELU, Linear) and a
//   list of leaf layers (Linear, Linear) are not blocks.
// - In a container with other children too, a run of two or more
//   consecutive such children of one class is blocks, unless that class is
//   itself nn.Sequential or nn.ModuleList: MobileNetV3's `features.1` ..
//   `features.11` (InvertedResidual, between a stem and a head), SqueezeNet's
//   Fire modules between pooling layers.
// - In such a container, two or more consecutive plain containers (stages)
//   whose children are all modules of one class, each with submodules: those
//   children are the blocks, however many each stage holds. EfficientNet-B0's seven stages of
//   one to four MBConvs give `features.1.0` .. `features.7.0` (16). Stages
//   holding anything else are looked inside one by one.
// - A module of any other class whose children are all two or more such
//   modules of one class (not nn.Sequential or nn.ModuleList) holds blocks
//   as well: DenseNet's `features.denseblock1.denselayer1` .. `denselayer6`
//   (a ModuleDict subclass of _DenseLayer). A module with other children
//   too (a stem, a norm) is looked inside instead.
// - Blocks are not looked for inside a block (the outermost repetition wins).
// - Order: depth-first in registration order, which is forward order for
//   Sequential and for a ModuleList walked by `for block in self.blocks`.
// - The class is compared without TorchScript's `___torch_mangle_N.` prefix:
//   ResNet's `layer2.0` (with downsample) and `layer2.1` have different
//   TorchScript types but one Python class, BasicBlock.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/csrc/jit/api/module.h>

namespace oomtune {

/// One detected block.
struct BlockInfo {
  std::string path;        // dotted submodule path, e.g. "blocks.0", "layer2.1"
  std::string type_name;   // Python class, unmangled: "__torch__.Block"
  int64_t parameters = 0;  // COUNT: parameter elements of the block (recursive)
};

/// The repeated blocks of `module`, in forward order (see the rules above).
/// Empty when the model has no container of repeated composite submodules.
std::vector<BlockInfo> detect_blocks(const torch::jit::Module& module);

/// A TorchScript class name without the `___torch_mangle_N.` atoms:
/// "__torch__.torchvision.models.resnet.___torch_mangle_12.BasicBlock" ->
/// "__torch__.torchvision.models.resnet.BasicBlock".
std::string unmangled_type_name(const torch::jit::Module& module);

/// Dotted paths and unmangled class names of every submodule of `module`
/// (not `module` itself), depth-first in registration order.
std::vector<std::pair<std::string, std::string>> submodule_types(const torch::jit::Module& module);

}  // namespace oomtune
