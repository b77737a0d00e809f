#include "session/node_source.h"

#include <fmt/format.h>

namespace oomtune {

std::string node_source(const torch::jit::Node* node) {
  torch::jit::SourceRange range = node->sourceRange();
  // A loaded file's graph points into the archive's serialized code; its
  // debug tables name the user's line that generated it.
  if (const auto original = range.findSourceRangeThatGenerated()) range = *original;
  const auto location = range.file_line_col();
  if (!location) return "";
  const auto& [file, line, column] = *location;
  if (file.empty()) return "";  // traced graphs: ":0:0"
  return fmt::format("{}:{}:{}", file, line, column);
}

}  // namespace oomtune
