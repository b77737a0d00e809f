#include "strategies/kernel_rewrite.h"

#include <unordered_set>
#include <vector>

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include "compat/torch_compat.h"
#include "strategies/attention_op.h"
#include "strategies/dropout_op.h"

namespace oomtune {
namespace {

// One operator to replace: ATen's, oomtune's, and the argument counts a
// call may have. A call with `short_arity` arguments gets a trailing false
// (aten::scaled_dot_product_attention before enable_gqa, PyTorch 2.0 to 2.4).
struct Replacement {
  c10::Symbol aten;
  c10::Symbol ours;
  std::size_t arity;
  std::size_t short_arity;
  int64_t KernelSites::*sites;
};

// Rewrites graphs, each once: a module's methods, and the free functions
// they call (prim::CallFunction of a constant: torch.nn.functional.dropout
// in a scripted nn.Dropout), which the graph executor inlines when the
// method first runs.
class Rewriter {
 public:
  explicit Rewriter(const std::vector<Replacement>& replacements) : replacements_(replacements) {}

  void rewrite(torch::jit::Function* function) {
    auto* graph_function = dynamic_cast<torch::jit::GraphFunction*>(function);
    if (!graph_function) return;
    const std::shared_ptr<torch::jit::Graph> graph = graph_function->graph();
    if (!seen_.insert(graph.get()).second) return;
    rewrite_block(graph->block(), *graph);
  }

  const KernelSites& sites() const { return sites_; }

 private:
  void rewrite_block(torch::jit::Block* block, torch::jit::Graph& graph) {
    std::vector<torch::jit::Node*> nodes(block->nodes().begin(), block->nodes().end());
    for (torch::jit::Node* node : nodes) {
      for (torch::jit::Block* inner : node->blocks()) rewrite_block(inner, graph);
      if (node->kind() == c10::prim::Constant && node->output()->type()->kind() == c10::TypeKind::FunctionType) {
        rewrite(node->output()->type()->expectRef<c10::FunctionType>().function());
        continue;
      }
      for (const Replacement& r : replacements_) {
        if (node->kind() == r.aten) {
          replace(node, graph, r);
          break;
        }
      }
    }
  }

  void replace(torch::jit::Node* node, torch::jit::Graph& graph, const Replacement& r) {
    std::vector<torch::jit::Value*> inputs(node->inputs().begin(), node->inputs().end());
    if (inputs.size() != r.arity && inputs.size() != r.short_arity) return;
    torch::jit::WithInsertPoint here(node);
    if (inputs.size() != r.arity) inputs.push_back(graph.insertConstant(false));
    torch::jit::Node* ours = graph.create(r.ours, inputs, 1);
    ours->insertBefore(node);
    ours->output()->setType(node->output()->type());
    ours->setSourceRange(node->sourceRange());
    node->output()->replaceAllUsesWith(ours->output());
    node->destroy();
    ++(sites_.*r.sites);
  }

  const std::vector<Replacement>& replacements_;
  std::unordered_set<const torch::jit::Graph*> seen_;
  KernelSites sites_;
};

std::vector<Replacement> replacements() {
  ensure_dropout_op_registered();
  std::vector<Replacement> list{{c10::Symbol::fromQualString("aten::dropout"),
                                 c10::Symbol::fromQualString(kDropoutOpName), 3, 3, &KernelSites::dropout}};
  if (compat::kTorchMajor >= 2) {
    ensure_attention_op_registered();
    list.push_back({c10::Symbol::fromQualString("aten::scaled_dot_product_attention"),
                    c10::Symbol::fromQualString(kAttentionOpName), 8, 7, &KernelSites::attention});
  }
  return list;
}

}  // namespace

KernelSites replace_device_kernels(torch::jit::Module& module) {
  static const std::vector<Replacement> kReplacements = replacements();
  Rewriter rewriter(kReplacements);
  for (const torch::jit::Module& m : module.modules())
    for (torch::jit::Function* function : m.type()->methods()) rewriter.rewrite(function);
  return rewriter.sites();
}

}  // namespace oomtune
