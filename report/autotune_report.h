#pragma once
// The autotune report: the decision trail, the probes, the chosen
// configuration and its margin, and why faster-looking alternatives were
// rejected; as a table for people and JSON for machines. No libtorch.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "job/job_spec.h"
#include "report/sequence_fit.h"
#include "search/search.h"

namespace oomtune {

/// Per-GPU memory under data parallelism when nothing fits one GPU
/// (filled from recipes/zero_estimate.h by the command; absent where the
/// parameter count is unknown: no trial got past loading the weights,
/// SearchResult::parameters_alone).
struct NothingFits {
  std::string table;    // rendered ZeRO/FSDP table
  nlohmann::json json;  // the same, as JSON
};

/// The sequence length of a job whose inputs name "seq": autotune keeps it
/// as given (every trial at job.seq_len; with seq = [min, max], the max);
/// with a range it fits the chosen configuration's peak over lengths in the
/// range and reports the longest sequence that fits
/// (docs/sequence_length.md).
struct AutotuneSequence {
  int64_t length = 0;                 // COUNT: tokens of every trial
  std::optional<int64_t> min_length;  // COUNT: with a range, its min
  std::optional<SequenceFit> fit;     // with a range and a chosen configuration: its fit at lengths in the range
  std::string problem;                // why there is no fit ("" when there is, or no range)
};

/// What `oomtune autotune` prints.
struct AutotuneReport {
  std::string job_path;
  JobSpec job;
  SearchResult search;
  std::optional<NothingFits> nothing_fits;
  std::vector<std::string> emitted_files;    // paths written by --emit
  std::optional<AutotuneSequence> sequence;  // jobs whose inputs name "seq"
};

/// Human report (stdout).
std::string render_autotune_text(const AutotuneReport& report);
/// The same numbers as JSON; units in key names.
nlohmann::json autotune_json(const AutotuneReport& report);

}  // namespace oomtune
