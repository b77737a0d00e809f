#include "strategies/activation_checkpointing.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include "common/class_name.h"
#include "common/closest_name.h"
#include "common/error.h"
#include "strategies/argument_writes.h"
#include "strategies/recompute_op.h"

// Note [Rewrite at the call site]
// Rationale: TorchScript keeps a scripted model's submodule calls as
// `prim::CallMethod[name="forward"](%block, %x)` in the un-inlined method
// graphs (GraphFunction::graph()). The graph executor copies that graph when
// it first runs a method (GraphFunction::optimized_graph()); with optimization
// on it also inlines the callees' graphs there. A node that replaces the call
// in graph() is therefore what both executors run, as long as nothing has run
// yet.
// Approach: for every TorchScript class in the module tree and every method
// of it, find the forward calls whose callee is reached from `self` by a chain
// of prim::GetAttr (GPT: `self.blocks.0`, unrolled from the ModuleList loop;
// ResNet: `self.0` inside the Sequential `layer1`). Such a call site serves
// every object of the method's class, so it reaches the paths
// `<instance>.<chain>` for each instance of that class. A call site that
// reaches a chosen path becomes
//   %in  : Any[]    = prim::ListConstruct(%x, ...)
//   %out : Tensor[] = oomtune::checkpoint(%block, "forward", %in)
//   %y, ...         = prim::ListUnpack(%out)      (+ prim::TupleConstruct)
// and every object of the callee's class gets the attribute
// `_oomtune_checkpoint` (true for chosen paths, false otherwise), which the
// operator reads at run time. With optimization off the interpreter runs the
// rewritten graph as it is; with optimization on the inliner inlines the
// surrounding methods but leaves the operator alone (it is not a call), the
// block's own forward runs through its own GraphExecutor from inside the
// operator, and autodiff never sees the operator (it has no symbolic
// gradient), so its gradient comes from the autograd Function.
// Limitations: a module whose methods already ran keeps its compiled plan
// (GraphExecutor has no public way to drop it); blocks called through
// something other than a GetAttr chain from self (a module passed as an
// argument, an interface call) are not found; the callee's forward (or the
// overload called, forward__N) must take Tensors, Optional[Tensor]s,
// List[Tensor]s or tuples of Tensors besides plain values and return Tensors (a tuple of Tensors
// on output); a block that puts a Tensor into its List[Tensor] argument
// rather than return it, or modifies a Tensor argument in place, is refused
// here when its graph shows it (strategies/argument_writes.h), otherwise at
// run time (the operator checks the list and the version counters).

namespace oomtune {
namespace {

using torch::jit::Node;
using torch::jit::Value;

/// One `forward` call of a submodule found in a method graph.
struct CallSite {
  Node* node = nullptr;
  c10::ClassTypePtr callee;          // TorchScript class of the called block
  std::vector<std::string> reaches;  // full paths of the objects it may call
  bool rewritten = false;            // already an oomtune::checkpoint node
};

std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string model_label(const torch::jit::Module& module, const std::string& model_name) {
  return model_name.empty() ? "model " + module.type()->name()->qualifiedName() : model_name;
}

std::string top_level_children(const torch::jit::Module& module) {
  std::string out;
  for (const auto& child : module.named_children()) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} ({})", child.name, short_class_name(unmangled_type_name(child.value)));
  }
  return out.empty() ? "none" : out;
}

std::string block_list(const std::vector<BlockInfo>& blocks) {
  std::string out;
  for (const auto& block : blocks) {
    if (!out.empty()) out += ", ";
    out += block.path;
  }
  return out.empty() ? "none" : out;
}

/// The GetAttr chain from the graph's `self` to `value` ("blocks.0"), or
/// nullopt when `value` is not reached that way.
std::optional<std::string> attribute_chain(const Value* value, const Value* self) {
  std::vector<std::string> names;
  while (value != self) {
    const Node* node = value->node();
    if (node->kind() != c10::prim::GetAttr) return std::nullopt;
    names.push_back(node->s(c10::attr::name));
    value = node->input(0);
  }
  std::string path;
  for (auto it = names.rbegin(); it != names.rend(); ++it) path = join_path(path, *it);
  return path;
}

/// Whether a prim::CallMethod calls a forward: `forward` itself, or one of
/// its overloads, which TorchScript compiles as `forward__0`, `forward__1`,
/// ... (torch/jit/_recursive.py; torchvision's _DenseLayer has two).
bool is_forward_method(const std::string& name) {
  const std::string prefix = "forward";
  if (name == prefix) return true;
  if (name.size() <= prefix.size() + 2 || name.compare(0, prefix.size() + 2, prefix + "__") != 0) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size() + 2), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

void collect_calls(torch::jit::Block* block, const Value* self, const std::vector<std::string>& owners,
                   std::vector<CallSite>& out) {
  static const c10::Symbol kCheckpointSymbol = c10::Symbol::fromQualString(kCheckpointOpName);
  for (Node* node : block->nodes()) {
    for (torch::jit::Block* sub : node->blocks()) collect_calls(sub, self, owners, out);
    const bool is_call = node->kind() == c10::prim::CallMethod && is_forward_method(node->s(c10::attr::name));
    const bool is_checkpoint = node->kind() == kCheckpointSymbol;
    if (!is_call && !is_checkpoint) continue;
    auto callee = node->input(0)->type()->cast<c10::ClassType>();
    if (!callee) continue;
    const auto chain = attribute_chain(node->input(0), self);
    if (!chain || chain->empty()) continue;
    CallSite site;
    site.node = node;
    site.callee = callee;
    site.rewritten = is_checkpoint;
    for (const auto& owner : owners) site.reaches.push_back(join_path(owner, *chain));
    out.push_back(std::move(site));
  }
}

/// Every submodule forward call in every method of every class in the tree.
std::vector<CallSite> find_call_sites(const torch::jit::Module& module) {
  // Instances of each class, in tree order.
  std::vector<c10::ClassTypePtr> classes;
  std::map<const c10::ClassType*, std::vector<std::string>> instances;
  for (const auto& entry : module.named_modules()) {
    const auto type = entry.value.type();
    auto& paths = instances[type.get()];
    if (paths.empty()) classes.push_back(type);
    paths.push_back(entry.name);
  }
  std::vector<CallSite> sites;
  for (const auto& type : classes) {
    for (torch::jit::Function* method : type->methods()) {
      torch::jit::GraphFunction* function = torch::jit::tryToGraphFunction(*method);
      if (function == nullptr) continue;
      const auto graph = function->graph();
      if (graph->inputs().empty()) continue;
      collect_calls(graph->block(), graph->inputs()[0], instances[type.get()], sites);
    }
  }
  return sites;
}

bool is_tensor(const c10::TypePtr& type) { return type->kind() == c10::TypeKind::TensorType; }

/// Whether a value of this type can hold a Tensor (inside a list, tuple,
/// dict, object, ...): such an argument would reach the block's forward
/// without autograd seeing its Tensors.
bool holds_tensors(const c10::TypePtr& type) {
  if (is_tensor(type) || type->kind() == c10::TypeKind::AnyType || type->kind() == c10::TypeKind::ClassType ||
      type->kind() == c10::TypeKind::InterfaceType) {
    return true;
  }
  for (const auto& contained : type->containedTypes()) {
    if (holds_tensors(contained)) return true;
  }
  return false;
}

/// A class's TorchScript name without the "(of Python compilation unit at:
/// 0x...)" that repr_str() appends.
std::string type_name(const c10::TypePtr& type) {
  const auto class_type = type->cast<c10::ClassType>();
  return class_type && class_type->name() ? class_type->name()->qualifiedName() : type->repr_str();
}

/// Throws ConfigError unless the call's forward takes one or more Tensor,
/// Optional[Tensor], List[Tensor] or Tuple[Tensor, ...] arguments, other
/// arguments that hold no Tensor (None, bool, int, float, str, ...), and
/// returns a Tensor or a tuple of Tensors.
void check_call(const Node* call, const std::string& path, const std::string& label) {
  std::vector<const Value*> inputs(call->inputs().begin() + 1, call->inputs().end());
  std::string signature;
  bool arguments_ok = false;
  for (const Value* input : inputs) {
    if (!signature.empty()) signature += ", ";
    signature += type_name(input->type());
    arguments_ok = arguments_ok || is_tensor_argument_type(input->type());
  }
  for (const Value* input : inputs) {
    arguments_ok = arguments_ok && (is_tensor_argument_type(input->type()) || !holds_tensors(input->type()));
  }
  const c10::TypePtr out_type = call->output()->type();
  const auto tuple_type = out_type->cast<c10::TupleType>();
  bool output_ok = is_tensor(out_type);
  if (tuple_type) {
    output_ok = !tuple_type->elements().empty();
    for (const auto& element : tuple_type->elements()) output_ok = output_ok && is_tensor(element);
  }
  if (!arguments_ok || !output_ok) {
    throw ConfigError(
        fmt::format("{}: cannot checkpoint '{}' ({}): its forward takes ({}) and returns {}; the recompute operator "
                    "needs one or more Tensor, Optional[Tensor], List[Tensor] or Tuple[Tensor, ...] arguments, no "
                    "other argument that holds Tensors (a dict of them, an object, a tuple mixing them with other "
                    "values), and a Tensor or a tuple of Tensors as output",
                    label, path, type_name(call->input(0)->type()), signature, type_name(out_type)));
  }
}

/// The method a call site calls: the CallMethod's name, or the name a
/// rewritten site passes to the recompute operator.
std::string called_method(const CallSite& site) {
  if (!site.rewritten) return site.node->s(c10::attr::name);
  const auto name = torch::jit::toIValue(site.node->input(1));  // c10::optional in 1.13
  return name && name->isString() ? name->toStringRef() : "forward";
}

/// Throws CheckpointRefused for the first chosen block, in forward order,
/// whose called forward certainly writes to its argument.
void refuse_argument_writes(const torch::jit::Module& module, const std::vector<std::string>& chosen,
                            const std::vector<CallSite>& sites, const std::string& label) {
  std::map<std::string, std::string> class_of;  // submodule path -> unmangled class
  for (const auto& entry : module.named_modules()) class_of[entry.name] = unmangled_type_name(entry.value);
  std::map<std::pair<const c10::ClassType*, std::string>, std::optional<ArgumentWrite>> checked;
  for (const auto& path : chosen) {
    for (const auto& site : sites) {
      if (std::find(site.reaches.begin(), site.reaches.end(), path) == site.reaches.end()) continue;
      const std::string method = called_method(site);
      const auto key = std::make_pair(site.callee.get(), method);
      if (checked.count(key) == 0) {
        torch::jit::Function* function = site.callee->findMethod(method);
        checked[key] = function ? certain_argument_write(*function) : std::nullopt;
      }
      if (!checked[key]) continue;
      const std::string& refused = class_of[path];
      std::vector<CheckpointedBlock> chosen_blocks;
      for (const auto& other : chosen) chosen_blocks.push_back({other, class_of[other]});
      throw CheckpointRefused(
          fmt::format("{}: cannot checkpoint '{}': {} of {} {}", label, path, method, refused, describe(*checked[key])),
          refused, chosen, blocks_of_other_classes(chosen_blocks, refused));
    }
  }
}

/// Replaces a prim::CallMethod forward (checked by check_call) by the
/// recompute operator (Note [Rewrite at the call site]).
void rewrite_call(Node* call) {
  std::vector<Value*> inputs(call->inputs().begin() + 1, call->inputs().end());
  const c10::TypePtr out_type = call->output()->type();
  const auto tuple_type = out_type->cast<c10::TupleType>();
  torch::jit::Graph* graph = call->owningGraph();
  torch::jit::WithInsertPoint guard(call);
  Node* list = graph->insertNode(graph->createList(c10::AnyType::get(), inputs));
  Value* method = graph->insertConstant(call->s(c10::attr::name));
  Node* op = graph->insertNode(
      graph->create(c10::Symbol::fromQualString(kCheckpointOpName), {call->input(0), method, list->output()}, 1));
  op->output()->setType(c10::ListType::ofTensors());
  op->setSourceRange(call->sourceRange());
  const size_t count = tuple_type ? tuple_type->elements().size() : 1;
  Node* unpack = graph->insertNode(graph->createListUnpack(op->output(), count));
  for (size_t i = 0; i < count; ++i) {
    unpack->output(i)->setType(tuple_type ? tuple_type->elements()[i] : out_type);
  }
  Value* result = unpack->output(0);
  if (tuple_type) {
    Node* tuple = graph->insertNode(graph->createTuple(unpack->outputs(), tuple_type->schema() ? tuple_type : nullptr));
    result = tuple->output();
  }
  call->output()->replaceAllUsesWith(result);
  call->destroy();
}

}  // namespace

std::vector<std::string> select_checkpoint_paths(const torch::jit::Module& module, const CheckpointPlan& plan,
                                                 const std::string& model_name) {
  using Mode = CheckpointPlan::Mode;
  const std::string label = model_label(module, model_name);
  if (plan.mode == Mode::kNone) return {};
  const std::vector<BlockInfo> blocks = detect_blocks(module);

  if (plan.mode == Mode::kPaths) {
    if (plan.paths.empty()) {
      throw ConfigError(fmt::format("{}: ckpt=paths: needs at least one submodule path; detected blocks: {}", label,
                                    block_list(blocks)));
    }
    std::vector<std::string> known;
    for (const auto& [path, type] : submodule_types(module)) known.push_back(path);
    std::vector<std::string> block_paths;
    for (const auto& block : blocks) block_paths.push_back(block.path);
    for (const auto& path : plan.paths) {
      if (std::find(known.begin(), known.end(), path) == known.end()) {
        throw ConfigError(
            fmt::format("{}: unknown submodule path '{}' for checkpointing (did you mean '{}'?; "
                        "detected blocks: {})",
                        label, path, closest_name(path, known), block_list(blocks)));
      }
    }
    std::vector<std::string> chosen;  // forward (tree) order, no duplicates
    for (const auto& path : known) {
      if (std::find(plan.paths.begin(), plan.paths.end(), path) != plan.paths.end()) chosen.push_back(path);
    }
    return chosen;
  }

  if (blocks.empty()) {
    throw ConfigError(fmt::format(
        "{}: activation checkpointing (ckpt={}) found no repeated blocks (a ModuleList or Sequential of two "
        "or more submodules of one class); name submodules with ckpt=paths:a+b; top-level children: {}",
        label, to_string(plan), top_level_children(module)));
  }
  std::vector<std::string> chosen;
  const int64_t count = static_cast<int64_t>(blocks.size());
  if (plan.mode == Mode::kAll) {
    for (const auto& block : blocks) chosen.push_back(block.path);
  } else if (plan.mode == Mode::kEveryK) {
    if (plan.every_k < 1) {
      throw ConfigError(fmt::format("{}: ckpt=every:k needs k >= 1, got {}", label, plan.every_k));
    }
    for (int64_t i = 0; i < count; i += plan.every_k) chosen.push_back(blocks[i].path);
  } else if (plan.mode == Mode::kFirstN) {
    if (plan.first_n < 1 || plan.first_n > count) {
      throw ConfigError(fmt::format("{}: ckpt=first:n needs 1 <= n <= {} (the detected blocks: {}), got {}", label,
                                    count, block_list(blocks), plan.first_n));
    }
    for (int64_t i = 0; i < plan.first_n; ++i) chosen.push_back(blocks[i].path);
  }
  return chosen;
}

std::vector<std::string> paths_of(const std::vector<CheckpointedBlock>& blocks) {
  std::vector<std::string> paths;
  for (const CheckpointedBlock& block : blocks) paths.push_back(block.path);
  return paths;
}

std::vector<std::string> blocks_of_other_classes(const std::vector<CheckpointedBlock>& blocks,
                                                 const std::string& refused_class) {
  std::vector<std::string> others;
  for (const CheckpointedBlock& block : blocks)
    if (block.class_name != refused_class) others.push_back(block.path);
  return others;
}

CheckpointReport apply_checkpointing(torch::jit::Module& module, const CheckpointPlan& plan,
                                     const std::string& model_name) {
  ensure_recompute_op_registered();
  const std::string label = model_label(module, model_name);
  CheckpointReport report;
  report.blocks = detect_blocks(module);
  const std::vector<std::string> chosen = select_checkpoint_paths(module, plan, model_name);
  const std::set<std::string> chosen_set(chosen.begin(), chosen.end());

  std::vector<CallSite> sites = find_call_sites(module);
  std::set<std::string> reachable;
  for (const auto& site : sites) reachable.insert(site.reaches.begin(), site.reaches.end());
  for (const auto& path : chosen) {
    if (reachable.count(path) == 0) {
      throw ConfigError(
          fmt::format("{}: cannot checkpoint '{}': no TorchScript method calls its forward as "
                      "prim::CallMethod on self.<path> (detected blocks: {})",
                      label, path, block_list(report.blocks)));
    }
  }

  // The call sites that reach a chosen block, all checked before the first
  // rewrite so that a refused plan leaves the graphs as they were.
  refuse_argument_writes(module, chosen, sites, label);
  std::vector<CallSite*> to_rewrite;
  for (auto& site : sites) {
    if (site.rewritten) continue;
    for (const auto& path : site.reaches) {
      if (chosen_set.count(path) > 0) {
        check_call(site.node, path, label);
        to_rewrite.push_back(&site);
        break;
      }
    }
  }
  for (CallSite* site : to_rewrite) {
    rewrite_call(site->node);
    site->rewritten = true;
    ++report.rewritten_calls;
  }

  // Remember the classes whose objects need the flag.
  std::vector<c10::ClassTypePtr> flagged_classes;
  for (const auto& site : sites) {
    if (!site.rewritten) continue;
    if (std::find(flagged_classes.begin(), flagged_classes.end(), site.callee) == flagged_classes.end()) {
      flagged_classes.push_back(site.callee);
    }
  }

  // Per-object switch, read by the operator at run time.
  for (const auto& entry : module.named_modules()) {
    const auto type = entry.value.type();
    if (std::find(flagged_classes.begin(), flagged_classes.end(), type) == flagged_classes.end()) continue;
    torch::jit::Module object = entry.value;
    object.register_attribute(kCheckpointFlag, c10::BoolType::get(), chosen_set.count(entry.name) > 0);
    if (chosen_set.count(entry.name) > 0) {
      report.checkpointed.push_back({entry.name, unmangled_type_name(entry.value)});
      for (const auto& parameter : object.parameters(/*recurse=*/true)) {
        report.checkpointed_parameters += parameter.numel();
      }
    }
  }
  return report;
}

}  // namespace oomtune
