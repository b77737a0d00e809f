#include "strategies/block_detection.h"

#include <algorithm>
#include <utility>

#include "common/class_name.h"

namespace oomtune {
namespace {

bool is_container(const std::string& type_name) {
  return type_name == "__torch__.torch.nn.modules.container.ModuleList" ||
         type_name == "__torch__.torch.nn.modules.container.Sequential";
}

bool has_children(const torch::jit::Module& module) {
  for (const auto& child : module.children()) {
    (void)child;
    return true;
  }
  return false;
}

int64_t parameter_count(const torch::jit::Module& module) {
  int64_t count = 0;
  for (const auto& parameter : module.parameters(/*recurse=*/true)) count += parameter.numel();
  return count;
}

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

using NamedModules = std::vector<std::pair<std::string, torch::jit::Module>>;

/// Whether `units` (path, module) are one or more composite modules of one
/// class that is not a plain container.
bool one_block_class(const NamedModules& units) {
  if (units.empty()) return false;
  const std::string first = unmangled_type_name(units.front().second);
  return std::all_of(units.begin(), units.end(), [&](const auto& unit) {
    return has_children(unit.second) && !is_container(first) && unmangled_type_name(unit.second) == first;
  });
}

void add_block(const std::string& path, const torch::jit::Module& module, std::vector<BlockInfo>& out) {
  out.push_back(BlockInfo{path, unmangled_type_name(module), parameter_count(module)});
}

void find_blocks(const torch::jit::Module& module, const std::string& path, std::vector<BlockInfo>& out) {
  NamedModules children;
  for (const auto& child : module.named_children()) children.emplace_back(join(path, child.name), child.value);
  if (!is_container(unmangled_type_name(module))) {
    // A module of its own class whose children are all composite units of
    // one class (not plain containers) holds blocks too: torchvision's
    // _DenseBlock, a ModuleDict subclass of _DenseLayers, is one.
    const bool all_blocks = children.size() >= 2 && one_block_class(children);
    for (const auto& [child_path, child] : children) {
      if (all_blocks) {
        add_block(child_path, child, out);
      } else {
        find_blocks(child, child_path, out);
      }
    }
    return;
  }
  // Runs of consecutive composite children of one class. All children in one
  // run: they are the blocks, whatever their class (the outermost repetition
  // wins). Several runs (a stem, then repeated units, then a head): each run
  // of two or more is blocks unless its class is a plain container itself
  // (stages). Stages whose children are all composite modules of one class
  // give those children as blocks, however many each stage holds
  // (EfficientNet's hold one to four MBConvs); other stages are looked
  // inside one by one.
  size_t begin = 0;
  while (begin < children.size()) {
    const std::string type = unmangled_type_name(children[begin].second);
    size_t end = begin;
    while (end < children.size() && has_children(children[end].second) &&
           unmangled_type_name(children[end].second) == type) {
      ++end;
    }
    const bool whole_container = begin == 0 && end == children.size();
    NamedModules units;  // the stages' children, when the run is stages
    if (end - begin >= 2 && !whole_container && is_container(type)) {
      for (size_t i = begin; i < end; ++i) {
        for (const auto& unit : children[i].second.named_children()) {
          units.emplace_back(join(children[i].first, unit.name), unit.value);
        }
      }
    }
    if (one_block_class(units)) {
      for (const auto& [unit_path, unit] : units) add_block(unit_path, unit, out);
      begin = end;
    } else if (end - begin >= 2 && (whole_container || !is_container(type))) {
      for (size_t i = begin; i < end; ++i) add_block(children[i].first, children[i].second, out);
      begin = end;
    } else {
      const size_t next = std::max(end, begin + 1);
      for (size_t i = begin; i < next; ++i) find_blocks(children[i].second, children[i].first, out);
      begin = next;
    }
  }
}

}  // namespace

std::string unmangled_type_name(const torch::jit::Module& module) {
  return unmangled_name(module.type()->name()->qualifiedName());
}

std::vector<BlockInfo> detect_blocks(const torch::jit::Module& module) {
  std::vector<BlockInfo> blocks;
  find_blocks(module, "", blocks);
  return blocks;
}

std::vector<std::pair<std::string, std::string>> submodule_types(const torch::jit::Module& module) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& entry : module.named_modules()) {
    if (entry.name.empty()) continue;  // the module itself
    out.emplace_back(entry.name, unmangled_type_name(entry.value));
  }
  return out;
}

}  // namespace oomtune
