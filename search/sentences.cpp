#include "search/sentences.h"

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

namespace oomtune::search_detail {

std::string describe(const TrainingConfig& c) {
  std::vector<std::string> parts;
  parts.push_back(fmt::format("micro-batch {} x {}", c.micro_batch, c.accumulation_steps));
  if (c.checkpoint.enabled()) parts.push_back("ckpt " + to_string(c.checkpoint));
  parts.push_back(to_string(c.optimizer));
  if (c.offload_optimizer) parts.push_back("offload");
  parts.push_back(to_string(c.precision));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string bf16_fallback_note(const ProbeReport& failed) {
  return fmt::format(
      "bf16: autocast failed ({}), so bf16 runs as bf16 parameters with fp32 master weights "
      "kept by the optimizer (precision = \"bf16_params\")",
      outcome_text(failed));
}

}  // namespace oomtune::search_detail
