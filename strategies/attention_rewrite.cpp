#include "strategies/attention_rewrite.h"

#include <unordered_set>
#include <vector>

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include "strategies/attention_op.h"

namespace oomtune {
namespace {

// aten::scaled_dot_product_attention's arguments with enable_gqa, and
// without it (files exported by PyTorch 2.0 to 2.4).
constexpr std::size_t kArguments = 8;
constexpr std::size_t kArgumentsBeforeGqa = 7;

int64_t rewrite_block(torch::jit::Block* block, torch::jit::Graph& graph) {
  static const auto kAten = c10::Symbol::fromQualString("aten::scaled_dot_product_attention");
  static const auto kOurs = c10::Symbol::fromQualString(kAttentionOpName);
  int64_t replaced = 0;
  std::vector<torch::jit::Node*> nodes(block->nodes().begin(), block->nodes().end());
  for (torch::jit::Node* node : nodes) {
    for (torch::jit::Block* inner : node->blocks()) replaced += rewrite_block(inner, graph);
    if (node->kind() != kAten) continue;
    std::vector<torch::jit::Value*> inputs(node->inputs().begin(), node->inputs().end());
    if (inputs.size() != kArguments && inputs.size() != kArgumentsBeforeGqa) continue;
    torch::jit::WithInsertPoint here(node);
    if (inputs.size() == kArgumentsBeforeGqa) inputs.push_back(graph.insertConstant(false));
    torch::jit::Node* ours = graph.create(kOurs, inputs, 1);
    ours->insertBefore(node);
    ours->output()->setType(node->output()->type());
    ours->setSourceRange(node->sourceRange());
    node->output()->replaceAllUsesWith(ours->output());
    node->destroy();
    ++replaced;
  }
  return replaced;
}

}  // namespace

int64_t replace_attention(torch::jit::Module& module) {
  ensure_attention_op_registered();
  int64_t replaced = 0;
  std::unordered_set<const torch::jit::Graph*> seen;
  for (const torch::jit::Module& m : module.modules()) {
    for (torch::jit::Function* function : m.type()->methods()) {
      auto* graph_function = dynamic_cast<torch::jit::GraphFunction*>(function);
      if (!graph_function) continue;
      const std::shared_ptr<torch::jit::Graph> graph = graph_function->graph();
      if (!seen.insert(graph.get()).second) continue;
      replaced += rewrite_block(graph->block(), *graph);
    }
  }
  return replaced;
}

}  // namespace oomtune
