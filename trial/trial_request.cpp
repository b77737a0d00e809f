#include "trial/trial_request.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/error.h"
#include "job/job_json.h"

namespace oomtune {
namespace {

nlohmann::json options_json(const TrialOptions& o) {
  return {{"min_timed_steps", o.min_timed_steps},
          {"max_timed_steps", o.max_timed_steps},
          {"total_steps", o.total_steps},
          {"enforce_budget", o.enforce_budget},
          {"record_events", o.record_events},
          {"timing_tolerance", o.timing_tolerance},
          {"step_events_path", o.step_events_path},
          {"snapshot_path", o.snapshot_path},
          {"device_check_only", o.device_check_only}};
}

TrialOptions options_from_json(const nlohmann::json& j) {
  TrialOptions o;
  o.min_timed_steps = j.at("min_timed_steps").get<int64_t>();
  o.max_timed_steps = j.at("max_timed_steps").get<int64_t>();
  o.total_steps = j.at("total_steps").get<int64_t>();
  o.enforce_budget = j.at("enforce_budget").get<bool>();
  o.record_events = j.at("record_events").get<bool>();
  o.timing_tolerance = j.at("timing_tolerance").get<double>();
  o.step_events_path = j.value("step_events_path", "");
  o.snapshot_path = j.value("snapshot_path", "");
  o.device_check_only = j.value("device_check_only", false);
  return o;
}

}  // namespace

nlohmann::json trial_request_json(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options) {
  return {{"job", to_json(job)}, {"config", to_string(config)}, {"options", options_json(options)}};
}

TrialRequest read_trial_request(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open the trial request", path));
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    return {job_spec_from_json(j.at("job")), j.at("config").get<std::string>(), options_from_json(j.at("options"))};
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: not a trial request: {}", path, e.what()));
  }
}

ProbeReport outcome_report(const JobSpec& job, const TrainingConfig& config, TrialOutcome outcome,
                           const std::string& message, std::optional<Phase> phase) {
  ProbeReport r;
  r.config = to_string(config);
  r.micro_batch = config.micro_batch;
  r.accumulation_steps = config.accumulation_steps;
  r.global_batch = job.global_batch;
  r.outcome = outcome;
  r.message = message;
  r.phase_at_failure = phase;
  return r;
}

std::string read_file_or_empty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace oomtune
