#include "strategies/argument_writes.h"

#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>
#include <torch/csrc/jit/ir/ir.h>

#include "session/node_source.h"
#include "strategies/recompute_op.h"

namespace oomtune {

const char* const kInPlaceAdvice =
    "make that operation out of place (x = x * 2 rather than x.mul_(2) or x *= 2, ReLU(inplace=False)) or "
    "checkpoint the blocks around it instead";
const char* const kListAdvice =
    "a checkpointed block must return the Tensors it makes, so checkpoint the blocks around it instead";

namespace {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

// Deep enough for nn.ReLU -> F.relu and the like; TorchScript has no
// recursion, so this only bounds pathological nesting.
constexpr int kMaxCallDepth = 16;

/// What one graph being scanned knows: the values that are (or certainly
/// alias) a watched argument, by the index of that argument among the
/// graph's inputs, and the constants its caller passed.
struct Scope {
  std::unordered_map<const Value*, size_t> watched;
  std::unordered_map<const Value*, c10::IValue> constants;
};

/// A write found in one graph: the graph input it writes.
struct Found {
  size_t input = 0;
  bool list = false;
  std::string op;
  std::string source;
};

/// Operators whose outputs always alias their first input (views, and the
/// pieces of a Tensor or of a list): a write to an output is a write to it.
/// Operators that may copy instead (reshape, contiguous, to, flatten) are not
/// here: a write after them may or may not reach the argument.
bool always_aliases_first_input(const Node* node) {
  static const std::vector<c10::Symbol> kinds = {c10::aten::view,           c10::aten::view_as,
                                                 c10::aten::transpose,      c10::aten::t,
                                                 c10::aten::permute,        c10::aten::select,
                                                 c10::aten::slice,          c10::aten::narrow,
                                                 c10::aten::unsqueeze,      c10::aten::squeeze,
                                                 c10::aten::expand,         c10::aten::expand_as,
                                                 c10::aten::detach,         c10::aten::alias,
                                                 c10::aten::diagonal,       c10::aten::unbind,
                                                 c10::aten::split,          c10::aten::chunk,
                                                 c10::aten::movedim,        c10::aten::unfold,
                                                 c10::aten::__getitem__,    c10::prim::TupleUnpack,
                                                 c10::prim::ListUnpack,     c10::prim::TupleIndex,
                                                 c10::prim::unchecked_cast, c10::prim::unchecked_unwrap_optional};
  return std::find(kinds.begin(), kinds.end(), node->kind()) != kinds.end();
}

/// The value the scope knows for `value`: a constant node's, or the constant
/// the caller passed for it.
std::optional<c10::IValue> known_value(const Value* value, const Scope& scope) {
  // `auto`: toIValue returns c10::optional in libtorch 1.13, and IValue
  // converts from an empty one to None.
  if (const auto constant = torch::jit::toIValue(value)) return *constant;
  const auto passed = scope.constants.find(value);
  if (passed != scope.constants.end()) return passed->second;
  return std::nullopt;
}

std::optional<bool> known_bool(const Value* value, const Scope& scope) {
  const std::optional<c10::IValue> constant = known_value(value, scope);
  if (!constant || !constant->isBool()) return std::nullopt;
  return constant->toBool();
}

/// Whether a prim::Loop certainly runs its body once: a known trip count of
/// at least one (`for i in range(2)`; a `while` has INT64_MAX) and a known
/// true first condition.
bool runs_once(const Node* loop, const Scope& scope) {
  const std::optional<c10::IValue> trips = known_value(loop->input(0), scope);
  return trips && trips->isInt() && trips->toInt() >= 1 && known_bool(loop->input(1), scope) == true;
}

std::optional<Found> scan_block(const Block* block, Scope& scope, int depth);

/// The graph a prim::CallMethod or prim::CallFunction runs, and the index of
/// the node input that becomes the graph's first input.
std::pair<std::shared_ptr<torch::jit::Graph>, size_t> callee_graph(const Node* node) {
  torch::jit::Function* function = nullptr;
  size_t first = 0;
  if (node->kind() == c10::prim::CallMethod) {
    if (const auto type = node->input(0)->type()->cast<c10::ClassType>())
      function = type->findMethod(node->s(c10::attr::name));
  } else if (node->kind() == c10::prim::CallFunction) {
    if (const auto type = node->input(0)->type()->cast<c10::FunctionType>()) function = type->function();
    first = 1;
  }
  if (function == nullptr) return {nullptr, 0};
  torch::jit::GraphFunction* graph_function = torch::jit::tryToGraphFunction(*function);
  if (graph_function == nullptr) return {nullptr, 0};
  graph_function->ensure_defined();  // a loaded file's functions compile on first use
  return {graph_function->graph(), first};
}

/// A write inside the method or function `call` runs, traced back to the
/// watched value of `scope` that the call passed.
std::optional<Found> scan_call(const Node* call, Scope& scope, int depth) {
  if (depth >= kMaxCallDepth) return std::nullopt;
  const auto [graph, first] = callee_graph(call);
  if (!graph || graph->inputs().size() + first != call->inputs().size()) return std::nullopt;
  Scope inner;
  bool passes_watched = false;
  for (size_t i = 0; i < graph->inputs().size(); ++i) {
    const Value* passed = call->input(first + i);
    if (scope.watched.count(passed) > 0) {
      inner.watched[graph->inputs()[i]] = i;
      passes_watched = true;
    }
    if (const std::optional<c10::IValue> constant = known_value(passed, scope))
      inner.constants.emplace(graph->inputs()[i], *constant);
  }
  if (!passes_watched) return std::nullopt;
  std::optional<Found> found = scan_block(graph->block(), inner, depth + 1);
  if (!found) return std::nullopt;
  // Report the caller's argument, and the caller's line when it has one:
  // the user's `y = self.relu(x)` rather than torch/nn/functional.py.
  found->input = scope.watched.at(call->input(first + found->input));
  const std::string here = node_source(call);
  if (!here.empty()) found->source = here;
  return found;
}

std::optional<Found> scan_block(const Block* block, Scope& scope, int depth) {
  for (const Node* node : block->nodes()) {
    if (node->kind() == c10::prim::If) {
      const std::optional<bool> condition = known_bool(node->input(0), scope);
      if (!condition) continue;
      const Block* taken = node->blocks()[*condition ? 0 : 1];
      if (auto found = scan_block(taken, scope, depth)) return found;
      for (size_t i = 0; i < node->outputs().size(); ++i) {
        const auto watched = scope.watched.find(taken->outputs()[i]);
        if (watched != scope.watched.end()) scope.watched[node->output(i)] = watched->second;
      }
      continue;
    }
    if (node->kind() == c10::prim::Loop) {
      // The first iteration runs every top-level node of the body (the
      // compiler puts what follows a break or continue under an If) with
      // the loop's inputs as its carried values. After it the carried
      // values may be new Tensors: the loop's outputs are not watched.
      if (!runs_once(node, scope)) continue;
      const Block* body = node->blocks()[0];
      Scope first = scope;
      for (size_t i = 2; i < node->inputs().size(); ++i) {  // body input 0 is the iteration number
        const auto watched = scope.watched.find(node->input(i));
        if (watched != scope.watched.end()) first.watched[body->inputs()[i - 1]] = watched->second;
      }
      if (auto found = scan_block(body, first, depth)) return found;
      continue;
    }
    if (node->kind() == c10::prim::CallMethod || node->kind() == c10::prim::CallFunction) {
      if (auto found = scan_call(node, scope, depth)) return found;
      continue;
    }
    if (const c10::FunctionSchema* schema = node->maybeSchema()) {
      const size_t count = std::min(node->inputs().size(), schema->arguments().size());
      for (size_t i = 0; i < count; ++i) {
        const auto watched = scope.watched.find(node->input(i));
        const c10::AliasInfo* alias = schema->arguments()[i].alias_info();
        if (watched == scope.watched.end() || alias == nullptr || !alias->isWrite()) continue;
        const bool list = node->input(i)->type()->kind() == c10::TypeKind::ListType;
        return Found{watched->second, list, node->kind().toQualString(), node_source(node)};
      }
    }
    if (node->inputs().empty() || !always_aliases_first_input(node)) continue;
    const auto watched = scope.watched.find(node->input(0));
    if (watched == scope.watched.end()) continue;
    for (const Value* output : node->outputs()) scope.watched[output] = watched->second;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ArgumentWrite> certain_argument_write(const torch::jit::Function& method) {
  torch::jit::GraphFunction* function = torch::jit::tryToGraphFunction(const_cast<torch::jit::Function&>(method));
  if (function == nullptr) return std::nullopt;
  function->ensure_defined();
  const std::shared_ptr<torch::jit::Graph> graph = function->graph();
  Scope scope;
  for (size_t i = 1; i < graph->inputs().size(); ++i) {  // input 0 is self
    if (is_tensor_argument_type(graph->inputs()[i]->type())) scope.watched[graph->inputs()[i]] = i;
  }
  const std::optional<Found> found = scan_block(graph->block(), scope, 0);
  if (!found) return std::nullopt;
  const c10::FunctionSchema& schema = method.getSchema();
  ArgumentWrite write;
  write.argument = found->input < schema.arguments().size() ? schema.arguments()[found->input].name()
                                                            : graph->inputs()[found->input]->debugName();
  write.list = found->list;
  write.op = found->op;
  write.source = found->source;
  return write;
}

std::string describe(const ArgumentWrite& write) {
  const std::string where = write.source.empty() ? write.op : write.op + " at " + write.source;
  if (write.list) {
    return fmt::format("changes its List[Tensor] argument {} ({}); {}", write.argument, where, kListAdvice);
  }
  return fmt::format(
      "modifies its argument {} in place ({}), so its recomputation would start from the "
      "modified values; {}",
      write.argument, where, kInPlaceAdvice);
}

}  // namespace oomtune
