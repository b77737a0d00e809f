#include "trial/child_trial.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "job/job_json.h"

namespace oomtune {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(10);

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json options_json(const TrialOptions& o) {
  return {{"min_timed_steps", o.min_timed_steps}, {"max_timed_steps", o.max_timed_steps},
          {"total_steps", o.total_steps},         {"enforce_budget", o.enforce_budget},
          {"record_events", o.record_events},     {"timing_tolerance", o.timing_tolerance}};
}

TrialOptions options_from_json(const nlohmann::json& j) {
  TrialOptions o;
  o.min_timed_steps = j.at("min_timed_steps").get<int64_t>();
  o.max_timed_steps = j.at("max_timed_steps").get<int64_t>();
  o.total_steps = j.at("total_steps").get<int64_t>();
  o.enforce_budget = j.at("enforce_budget").get<bool>();
  o.record_events = j.at("record_events").get<bool>();
  o.timing_tolerance = j.at("timing_tolerance").get<double>();
  return o;
}

// ---- child side: crash notes -------------------------------------------

// The phase the child is in, for the crash note; written by on_phase,
// read by the signal handler (async-signal-safe: only write(2)).
volatile sig_atomic_t g_phase = 0;
int g_note_fd = -1;
constexpr int kCrashSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL};

void on_crash(int signal_number) {
  if (g_note_fd >= 0) {
    const std::string_view name = phase_name(static_cast<Phase>(g_phase));
    ssize_t ignored = ::write(g_note_fd, name.data(), name.size());
    (void)ignored;
  }
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

void install_crash_notes(const std::string& note_path) {
  g_note_fd = ::open(note_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  for (int s : kCrashSignals) ::signal(s, on_crash);
}

// OOMTUNE_TEST_FAULT="KIND:PHASE[:TEXT]": fail on purpose when PHASE
// begins, in trials whose config string followed by ',' contains TEXT (all
// when absent); the ',' lets "precision=bf16," name bf16 but not bf16_params.
std::function<void(Phase)> fault_from_environment(const std::string& config) {
  const char* text = std::getenv("OOMTUNE_TEST_FAULT");
  if (!text || !*text) return nullptr;
  std::vector<std::string> parts;
  std::string part;
  for (std::istringstream in(text); std::getline(in, part, ':');) parts.push_back(part);
  const std::string kind = parts.empty() ? "abort" : parts[0];
  const std::string phase = parts.size() > 1 ? parts[1] : "forward";
  if (parts.size() > 2 && (config + ",").find(parts[2]) == std::string::npos) return nullptr;
  return [kind, phase](Phase now) {
    if (phase_name(now) != phase) return;
    if (kind == "abort") std::abort();
    if (kind == "segv") ::raise(SIGSEGV);
    if (kind == "hang")
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  };
}

std::string signal_name(int signal_number) {
  const char* abbreviation = sigabbrev_np(signal_number);
  return abbreviation ? fmt::format("SIG{}", abbreviation) : fmt::format("signal {}", signal_number);
}

ProbeReport outcome_only(const JobSpec& job, const TrainingConfig& config, TrialOutcome outcome,
                         const std::string& message, const std::string& phase) {
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

}  // namespace

int serve_trial(const std::string& request_path, const std::string& result_path) {
  const nlohmann::json request = [&] {
    try {
      return nlohmann::json::parse(read_file(request_path));
    } catch (const nlohmann::json::exception& e) {
      throw InputError(fmt::format("{}: not a trial request: {}", request_path, e.what()));
    }
  }();
  const JobSpec job = job_spec_from_json(request.at("job"));
  TrialOptions options = options_from_json(request.at("options"));
  install_crash_notes(result_path + ".phase");
  auto fault = fault_from_environment(request.at("config").get<std::string>());
  options.on_phase = [fault](Phase phase) {
    g_phase = static_cast<sig_atomic_t>(phase);
    if (fault) fault(phase);
  };
  ProbeReport report;
  TrainingConfig config;
  try {
    config = parse_config_overrides(request.at("config").get<std::string>(), TrainingConfig{});
    report = run_trial(job, config, options);
  } catch (const Error& e) {
    report = outcome_only(job, config, TrialOutcome::kError, e.what(), std::string(phase_name(static_cast<Phase>(g_phase))));
  }
  write_file_atomically(result_path, to_json(report).dump());
  return kExitOk;
}

ProbeReport run_trial_in_child(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options,
                               const ChildTrialOptions& child) {
  char dir_template[] = "/tmp/oomtune-trial-XXXXXX";
  if (!::mkdtemp(dir_template)) throw Error(fmt::format("cannot make a temp folder for a trial: {}", std::strerror(errno)));
  const std::filesystem::path dir(dir_template);
  const std::string request_path = (dir / "request.json").string();
  const std::string result_path = (dir / "result.json").string();
  nlohmann::json request = {{"job", to_json(job)}, {"config", to_string(config)}, {"options", options_json(options)}};
  write_file_atomically(request_path, request.dump());

  const std::string executable = child.executable.empty() ? "/proc/self/exe" : child.executable;
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(fmt::format("cannot start a trial process: {}", std::strerror(errno)));
  if (pid == 0) {
    ::dup2(STDERR_FILENO, STDOUT_FILENO);  // the parent's stdout carries its own report only
    const char* argv[] = {executable.c_str(), "trial", request_path.c_str(), result_path.c_str(), nullptr};
    ::execv(executable.c_str(), const_cast<char* const*>(argv));
    ::_exit(127);
  }

  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  bool timed_out = false;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > child.timeout_seconds) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(kPollInterval);
  }

  ProbeReport report;
  if (timed_out) {
    report = outcome_only(job, config, TrialOutcome::kTimeout,
                          fmt::format("timeout: no result after {:.0f} s", child.timeout_seconds), "");
  } else if (WIFSIGNALED(status)) {
    const std::string phase = read_file(result_path + ".phase");
    report = outcome_only(job, config, TrialOutcome::kCrashed,
                          fmt::format("crashed: {}{}", signal_name(WTERMSIG(status)),
                                      phase.empty() ? "" : " during " + phase),
                          phase);
  } else if (std::filesystem::exists(result_path)) {
    report = probe_report_from_json(nlohmann::json::parse(read_file(result_path)));
  } else {
    report = outcome_only(job, config, TrialOutcome::kError,
                          fmt::format("the trial process exited with code {} and no result",
                                      WIFEXITED(status) ? WEXITSTATUS(status) : -1),
                          "");
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return report;
}

}  // namespace oomtune
