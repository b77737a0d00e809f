#pragma once
// TorchScript class names for people. The TorchScript compiler mangles a
// class it compiles twice by inserting "___torch_mangle_N." atoms
// (c10/util/QualifiedName.h, torch/csrc/jit/frontend/name_mangler.cpp); a
// report names the class as its author wrote it.

#include <string>

namespace oomtune {

/// `qualified` (c10::QualifiedName::qualifiedName()) without its
/// `___torch_mangle_N` atoms:
/// "__torch__.torchvision.models.resnet.___torch_mangle_12.BasicBlock" ->
/// "__torch__.torchvision.models.resnet.BasicBlock". Throws nothing.
std::string unmangled_name(const std::string& qualified);

/// The last atom of `qualified`: "__torch__.model.Decoder" -> "Decoder"; a
/// name without a dot is returned as it is. Throws nothing.
std::string short_class_name(const std::string& qualified);

}  // namespace oomtune
