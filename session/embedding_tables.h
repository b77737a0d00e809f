#pragma once
// The embedding tables of a TorchScript model, for the error a forward gives
// when an index runs past one: a sequence longer than the model's position
// table (`--seq 2048` on GPT-2's 1024 positions), or token ids past the
// vocabulary.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/script.h>

#include "job/job_spec.h"
#include "session/batch.h"

namespace oomtune {

/// An nn.Embedding inside a TorchScript module.
struct EmbeddingTable {
  std::string name;  ///< its path in the module, e.g. "transformer.wpe"
  int64_t rows = 0;  ///< num_embeddings: it takes the indices [0, rows)
};

/// The module's nn.Embedding submodules, in module order: those whose
/// TorchScript class is torch.nn.modules.sparse.Embedding, mangled or not
/// ("__torch__.torch.nn.modules.sparse.___torch_mangle_325.Embedding" in a
/// traced Hugging Face GPT-2), with a 2-d `weight`. An F.embedding on a bare
/// parameter is not found. Throws nothing.
std::vector<EmbeddingTable> embedding_tables(const torch::jit::Module& module);

/// What to append to a forward's error whose one line is `cause`, when the
/// cause is an index past an embedding table's rows; "" otherwise. Returns
/// "; ..." naming the tables with their rows and the integer inputs passed
/// to forward (`which`, indices into `batch`) with their value ranges (from
/// `job`) and lengths, so that "200 long" stands beside "128 rows":
///   - "index out of range in self" (CPU: index_select and embedding,
///     aten/src/ATen/native/TensorAdvancedIndexing.cpp) or a CUDA
///     "device-side assert" (the same check in a kernel): every table;
///   - a shape mismatch that names a table's row count, "(1024)", where an
///     input is longer than that table: that table, as the positions a
///     model slices to the input's length.
/// Throws nothing.
std::string embedding_hint(const std::vector<EmbeddingTable>& tables, const JobSpec& job, const Batch& batch,
                           const std::vector<std::size_t>& which, const std::string& cause);

}  // namespace oomtune
