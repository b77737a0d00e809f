#pragma once
// What travels between the parent of a trial (trial/child_trial.h) and
// the child that runs it (trial/serve_trial.h): the request is one JSON
// object {job, config, options} in a file, the answer a ProbeReport's JSON
// (probes/probe_report.h). No libtorch: the oomtune executable writes
// requests without loading it.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "job/job_spec.h"
#include "probes/probe_report.h"
#include "strategies/training_config.h"
#include "trial/trial_options.h"

namespace oomtune {

/// One trial as the child reads it.
struct TrialRequest {
  JobSpec job;
  std::string config;    // to_string(TrainingConfig); the child parses it
  TrialOptions options;  // on_phase stays empty: a function does not travel
};

/// The request for running `config` of `job` with `options`.
nlohmann::json trial_request_json(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options);

/// Reads a request written by trial_request_json. Throws InputError naming
/// `path` when the file is missing or is not a trial request.
TrialRequest read_trial_request(const std::string& path);

/// A report that carries only an outcome (an error, a crash, a timeout), its
/// message and the phase it happened in (nullopt when unknown).
ProbeReport outcome_report(const JobSpec& job, const TrainingConfig& config, TrialOutcome outcome,
                           const std::string& message, std::optional<Phase> phase);

/// Where the child notes the phase it crashed in: beside the result file.
inline std::string crash_note_path(const std::string& result_path) { return result_path + ".phase"; }

/// The whole file as bytes; "" when it cannot be read (a missing crash note
/// is an answer, not an error).
std::string read_file_or_empty(const std::string& path);

}  // namespace oomtune
