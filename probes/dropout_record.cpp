#include "probes/dropout_record.h"

#include <fmt/format.h>

#include "common/byte_size.h"
#include "common/error.h"

namespace oomtune {

std::string dropout_text(const DropoutRecord& r) {
  return fmt::format(
      "{} call{}, CUDA's fused kernel keeps 1-byte masks: {} of them in the step, summed over its micro-batches and "
      "recomputations (the composite dropout of the CPU and meta would keep {} of noise)",
      r.calls, r.calls == 1 ? "" : "s", format_bytes(r.kept_bytes), format_bytes(r.composite_kept_bytes));
}

nlohmann::json to_json(const DropoutRecord& r) {
  return {{"calls", r.calls}, {"kept_bytes", r.kept_bytes}, {"composite_kept_bytes", r.composite_kept_bytes}};
}

DropoutRecord dropout_record_from_json(const nlohmann::json& j) {
  try {
    DropoutRecord r;
    r.calls = j.at("calls").get<int64_t>();
    r.kept_bytes = j.at("kept_bytes").get<int64_t>();
    r.composite_kept_bytes = j.at("composite_kept_bytes").get<int64_t>();
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("probe report: dropout: {}", e.what()));
  }
}

}  // namespace oomtune
