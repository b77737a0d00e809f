#include "trial/child_trial.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "trial/trial_module.h"
#include "trial/trial_request.h"

namespace oomtune {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(10);

std::string signal_name(int signal_number) {
  const char* abbreviation = sigabbrev_np(signal_number);
  return abbreviation ? fmt::format("SIG{}", abbreviation) : fmt::format("signal {}", signal_number);
}

}  // namespace

ProbeReport run_trial_in_child(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options,
                               const ChildTrialOptions& child) {
  const std::string executable = child.executable.empty() ? "/proc/self/exe" : child.executable;
  require_trial_module(executable);
  char dir_template[] = "/tmp/oomtune-trial-XXXXXX";
  if (!::mkdtemp(dir_template)) throw Error(fmt::format("cannot make a temp folder for a trial: {}", std::strerror(errno)));
  const std::filesystem::path dir(dir_template);
  const std::string request_path = (dir / "request.json").string();
  const std::string result_path = (dir / "result.json").string();
  write_file_atomically(request_path, trial_request_json(job, config, options).dump());

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
    report = outcome_report(job, config, TrialOutcome::kTimeout,
                            fmt::format("timeout: no result after {:.0f} s", child.timeout_seconds), "");
  } else if (WIFSIGNALED(status)) {
    const std::string phase = read_file_or_empty(crash_note_path(result_path));
    report = outcome_report(job, config, TrialOutcome::kCrashed,
                            fmt::format("crashed: {}{}", signal_name(WTERMSIG(status)),
                                        phase.empty() ? "" : " during " + phase),
                            phase);
  } else if (std::filesystem::exists(result_path)) {
    report = probe_report_from_json(nlohmann::json::parse(read_file_or_empty(result_path)));
  } else {
    report = outcome_report(job, config, TrialOutcome::kError,
                            fmt::format("the trial process exited with code {} and no result",
                                        WIFEXITED(status) ? WEXITSTATUS(status) : -1),
                            "");
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return report;
}

}  // namespace oomtune
