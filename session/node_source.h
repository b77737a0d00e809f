#pragma once
// Where a TorchScript graph node came from, for messages that point a user at
// a line of their model.

#include <string>

#include <torch/csrc/jit/ir/ir.h>

namespace oomtune {

/// "FILE:LINE:COLUMN" of the code that made `node`: the user's source
/// ("/home/me/model.py:12:8") when the file kept its debug tables (the
/// default of torch.jit.save), else the archive's serialized code
/// ("code/__torch__.py:22:9"); "" when the graph kept no source range for it
/// (a traced call of a submodule: ":0:0"). SourceRange::
/// findSourceRangeThatGenerated, torch/csrc/jit/frontend/source_range.h.
/// Throws nothing.
std::string node_source(const torch::jit::Node* node);

}  // namespace oomtune
