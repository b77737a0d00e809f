#pragma once
// The autotune report: the decision trail, the probes, the chosen
// configuration and its margin, and why faster-looking alternatives were
// rejected; as a table for people and JSON for machines. No libtorch.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "job/job_spec.h"
#include "search/search.h"

namespace oomtune {

/// Per-GPU memory under data parallelism when nothing fits one GPU
/// (filled from recipes/zero_estimate.h by the command).
struct NothingFits {
  std::string table;    // rendered ZeRO/FSDP table
  nlohmann::json json;  // the same, as JSON
};

/// What `oomtune autotune` prints.
struct AutotuneReport {
  std::string job_path;
  JobSpec job;
  SearchResult search;
  std::optional<NothingFits> nothing_fits;
  std::vector<std::string> emitted_files;  // paths written by --emit
};

/// Human report (stdout).
std::string render_autotune_text(const AutotuneReport& report);
/// The same numbers as JSON; units in key names.
nlohmann::json autotune_json(const AutotuneReport& report);

}  // namespace oomtune
