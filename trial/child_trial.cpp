#include "trial/child_trial.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <thread>
#include <vector>

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

// A fresh folder for a trial's files under $TMPDIR.
std::filesystem::path make_trial_dir() {
  std::error_code ignored;
  std::string dir_template = (std::filesystem::temp_directory_path(ignored) / "oomtune-trial-XXXXXX").string();
  if (!::mkdtemp(dir_template.data()))
    throw Error(fmt::format("cannot make a temp folder for a trial in {}: {}",
                            std::filesystem::path(dir_template).parent_path().string(), std::strerror(errno)));
  return dir_template;
}

// Starts `executable` with `arguments` (after argv[0]); `stdin_fd` becomes
// its standard input when >= 0. The child dies with its parent (see the
// header), and its stdout goes to stderr. Throws Error when fork fails
// (after removing `dir`).
pid_t start_child(const std::string& executable, const std::vector<std::string>& arguments, int stdin_fd,
                  const std::filesystem::path& dir) {
  std::vector<const char*> argv = {executable.c_str()};
  for (const std::string& a : arguments) argv.push_back(a.c_str());
  argv.push_back(nullptr);
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
    if (stdin_fd >= 0) ::dup2(stdin_fd, STDIN_FILENO);
    ::dup2(STDERR_FILENO, STDOUT_FILENO);  // the parent's stdout carries its own report only
    ::execv(executable.c_str(), const_cast<char* const*>(argv.data()));
    ::_exit(127);
  }
  return pid;
}

// How a wait for a child's trial ended.
enum class Waited { kAnswered, kExited, kTimedOut, kStopped };

// Waits for `pid` to end or, when `answered` is given, for it to say the
// trial is done; past `timeout_seconds` or on a stop signal the child is
// killed. `status` receives the child's wait status when it ended.
Waited wait_for_child(pid_t pid, double timeout_seconds, int& status, const std::function<bool()>& answered) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (answered && answered()) return Waited::kAnswered;
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return Waited::kExited;
    if (StopSignals::caught()) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return Waited::kStopped;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_seconds) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return Waited::kTimedOut;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

// The report of a trial whose wait ended as `waited` (not kStopped): the
// child's own from `result_path`, else its timeout, crash or exit.
ProbeReport report_of(Waited waited, int status, const std::string& result_path, const JobSpec& job,
                      const TrainingConfig& config, double timeout_seconds) {
  if (waited == Waited::kTimedOut)
    return outcome_report(job, config, TrialOutcome::kTimeout,
                          fmt::format("timeout: no result after {:.0f} s", timeout_seconds), std::nullopt);
  if (waited == Waited::kExited && WIFSIGNALED(status)) {
    const std::string phase = read_file_or_empty(crash_note_path(result_path));
    return outcome_report(
        job, config, TrialOutcome::kCrashed,
        fmt::format("crashed: {}{}", signal_name(WTERMSIG(status)), phase.empty() ? "" : " during " + phase),
        phase_from_name(phase));
  }
  if (std::filesystem::exists(result_path))
    return probe_report_from_json(nlohmann::json::parse(read_file_or_empty(result_path)));
  return outcome_report(
      job, config, TrialOutcome::kError,
      fmt::format("the trial process exited with code {} and no result", WIFEXITED(status) ? WEXITSTATUS(status) : -1),
      std::nullopt);
}

}  // namespace

ProbeReport run_trial_in_child(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options,
                               const ChildTrialOptions& child) {
  const std::string executable = child.executable.empty() ? "/proc/self/exe" : child.executable;
  require_trial_module(executable);
  const std::filesystem::path dir = make_trial_dir();
  const std::string request_path = (dir / "request.json").string();
  const std::string result_path = (dir / "result.json").string();
  write_file_atomically(request_path, json_text(trial_request_json(job, config, options)));

  StopSignals stop_signals;
  const pid_t pid = start_child(executable, {"trial", request_path, result_path}, -1, dir);
  int status = 0;
  const Waited waited = wait_for_child(pid, child.timeout_seconds, status, nullptr);
  if (waited == Waited::kStopped) {  // Ctrl-C reaches the child too: its death is not a result
    remove_tree(dir.string());
    stop_signals.reraise();
  }
  ProbeReport report = report_of(waited, status, result_path, job, config, child.timeout_seconds);
  remove_tree(dir.string());
  return report;
}

TrialServer::TrialServer(ChildTrialOptions child) : child_(std::move(child)) {
  if (child_.executable.empty()) child_.executable = "/proc/self/exe";
}

TrialServer::~TrialServer() { stop(); }

// The child is idle between trials: killing it loses nothing.
void TrialServer::stop() {
  if (requests_fd_ >= 0) ::close(requests_fd_);
  requests_fd_ = -1;
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  pid_ = -1;
  if (!dir_.empty()) remove_tree(dir_);
  dir_.clear();
}

ProbeReport TrialServer::run(const JobSpec& job, const TrainingConfig& config, const TrialOptions& options) {
  require_trial_module(child_.executable);
  StopSignals stop_signals;
  if (pid_ <= 0) {
    dir_ = make_trial_dir().string();
    int fds[2];
    // A socket, not a pipe: a request to a child that just died fails with
    // EPIPE (MSG_NOSIGNAL) instead of killing this process by SIGPIPE.
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      const int error = errno;
      remove_tree(dir_);
      dir_.clear();
      throw Error(fmt::format("cannot start a trial process: {}", std::strerror(error)));
    }
    // The child's end loses CLOEXEC by dup2 onto its stdin.
    try {
      pid_ = start_child(child_.executable, {"trial", "--serve"}, fds[1], dir_);
    } catch (const Error&) {
      ::close(fds[0]);
      ::close(fds[1]);
      dir_.clear();
      throw;
    }
    ++children_started_;
    ::close(fds[1]);
    requests_fd_ = fds[0];
  }
  const std::filesystem::path dir(dir_);
  const std::string n = std::to_string(++trials_);
  const std::string request_path = (dir / ("request-" + n + ".json")).string();
  const std::string result_path = (dir / ("result-" + n + ".json")).string();
  write_file_atomically(request_path, json_text(trial_request_json(job, config, options)));
  const std::string line = request_path + "\t" + result_path + "\n";
  const bool sent = ::send(requests_fd_, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size());
  int status = 0;
  // The result file appears whole (written atomically) once the trial is done.
  const Waited waited =
      sent ? wait_for_child(pid_, child_.timeout_seconds, status, [&] { return std::filesystem::exists(result_path); })
           : Waited::kExited;
  if (waited == Waited::kStopped) {
    pid_ = -1;
    stop();
    stop_signals.reraise();
  }
  if (waited != Waited::kAnswered) {
    if (!sent) {  // its end of the socket closed: it is ending, or ended
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
    pid_ = -1;  // it ended, or was killed: the next trial starts a fresh one
  }
  ProbeReport report = report_of(waited, status, result_path, job, config, child_.timeout_seconds);
  std::error_code ignored;
  std::filesystem::remove(request_path, ignored);
  std::filesystem::remove(result_path, ignored);
  std::filesystem::remove(crash_note_path(result_path), ignored);
  if (pid_ <= 0) stop();
  return report;
}

}  // namespace oomtune
