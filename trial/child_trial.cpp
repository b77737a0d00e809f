#include "trial/child_trial.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <thread>

#include <fmt/format.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/json_text.h"
#include "common/remove_tree.h"
#include "trial/trial_module.h"
#include "trial/trial_request.h"

namespace oomtune {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(10);

std::string signal_name(int signal_number) {
  const char* abbreviation = sigabbrev_np(signal_number);
  return abbreviation ? fmt::format("SIG{}", abbreviation) : fmt::format("signal {}", signal_number);
}

volatile sig_atomic_t g_stop_signal = 0;
extern "C" void note_stop_signal(int signal_number) { g_stop_signal = signal_number; }

// While a trial runs, SIGINT (Ctrl-C), SIGTERM and SIGHUP only set a flag;
// the wait loop then kills the child, removes the trial's folder and
// re-raises the signal with its default action, so the run still ends as
// the signal asked (exit status 128 + N) and leaves nothing behind. A
// signal the caller ignores (nohup) stays ignored.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction note {};
    note.sa_handler = note_stop_signal;
    sigemptyset(&note.sa_mask);
    for (std::size_t i = 0; i < std::size(kSignals); ++i) {
      ::sigaction(kSignals[i], nullptr, &old_[i]);
      if (old_[i].sa_handler != SIG_IGN) ::sigaction(kSignals[i], &note, nullptr);
    }
  }
  ~StopSignals() { restore(); }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// The caught signal, or 0.
  static int caught() { return g_stop_signal; }
  /// Ends the process by the caught signal, as it would have without us.
  [[noreturn]] void reraise() {
    const int signal_number = g_stop_signal;
    restore();
    ::signal(signal_number, SIG_DFL);
    ::raise(signal_number);
    ::_exit(128 + signal_number);  // not reached: the default action ends the process
  }

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  void restore() {
    for (std::size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  struct sigaction old_[std::size(kSignals)]{};
};

}  // namespace

ProbeReport run_trial_in_child(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options,
                               const ChildTrialOptions& child) {
  const std::string executable = child.executable.empty() ? "/proc/self/exe" : child.executable;
  require_trial_module(executable);
  std::error_code ignored;
  std::string dir_template = (std::filesystem::temp_directory_path(ignored) / "oomtune-trial-XXXXXX").string();
  if (!::mkdtemp(dir_template.data()))
    throw Error(fmt::format("cannot make a temp folder for a trial in {}: {}",
                            std::filesystem::path(dir_template).parent_path().string(), std::strerror(errno)));
  const std::filesystem::path dir(dir_template);
  const std::string request_path = (dir / "request.json").string();
  const std::string result_path = (dir / "result.json").string();
  write_file_atomically(request_path, json_text(trial_request_json(job, config, options)));

  StopSignals stop_signals;
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    remove_tree(dir.string());
    throw Error(fmt::format("cannot start a trial process: {}", std::strerror(error)));
  }
  if (pid == 0) {
    // The trial dies with its parent, however the parent ends (even by
    // SIGKILL): an orphaned trial would hold memory, on a GPU too, until its
    // timeout. The flag survives execv; the check covers a parent that died
    // before the prctl.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
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
    if (StopSignals::caught()) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > child.timeout_seconds) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(kPollInterval);
  }

  if (StopSignals::caught()) {  // Ctrl-C reaches the child too: its death is not a result
    remove_tree(dir.string());
    stop_signals.reraise();
  }

  ProbeReport report;
  if (timed_out) {
    report = outcome_report(job, config, TrialOutcome::kTimeout,
                            fmt::format("timeout: no result after {:.0f} s", child.timeout_seconds), std::nullopt);
  } else if (WIFSIGNALED(status)) {
    const std::string phase = read_file_or_empty(crash_note_path(result_path));
    report = outcome_report(
        job, config, TrialOutcome::kCrashed,
        fmt::format("crashed: {}{}", signal_name(WTERMSIG(status)), phase.empty() ? "" : " during " + phase),
        phase_from_name(phase));
  } else if (std::filesystem::exists(result_path)) {
    report = probe_report_from_json(nlohmann::json::parse(read_file_or_empty(result_path)));
  } else {
    report = outcome_report(job, config, TrialOutcome::kError,
                            fmt::format("the trial process exited with code {} and no result",
                                        WIFEXITED(status) ? WEXITSTATUS(status) : -1),
                            std::nullopt);
  }
  remove_tree(dir.string());
  return report;
}

}  // namespace oomtune
