#include "trial/serve_trial.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string_view>
#include <thread>
#include <vector>

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/json_text.h"
#include "session/model_session.h"
#include "trial/trial_request.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

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
  if (g_note_fd >= 0) ::close(g_note_fd);  // the previous trial's, in a child that serves several
  g_phase = 0;
  g_note_fd = ::open(note_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  for (int s : kCrashSignals) ::signal(s, on_crash);
}

// OOMTUNE_TEST_FAULT="KIND:PHASE[:TEXT]": fail on purpose when PHASE
// begins (KIND: abort, segv, hang, oom, error), in trials whose
// "<config>,global_batch=<G>," contains TEXT (all
// when absent); the ',' lets "precision=bf16," name bf16 but not bf16_params,
// and "global_batch=16," the verification runs of a job with G = 16 (a probe
// runs one micro-batch per step, so its G is its micro-batch).
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
    // As the budget's allocator throws it, so the trial reports out_of_memory.
    if (kind == "oom") C10_THROW_ERROR(OutOfMemoryError, "out of memory (test fault: OOMTUNE_TEST_FAULT)");
    // As a CUDA kernel launched past its grid's limits fails (c10::Error).
    if (kind == "error")
      TORCH_CHECK(false, "CUDA error: invalid configuration argument (test fault: OOMTUNE_TEST_FAULT)");
  };
}

// OOMTUNE_TEST_NO_ONEDNN=1: libtorch uses no oneDNN in this trial, as on a
// CPU it does not route bf16 or convolutions to oneDNN for (bf16 needs
// AVX512-BW, ATen/native/mkldnn/Utils.h): the other kernels, whose byte
// figures must equal oneDNN's (tests/autotune/machine_independence_test.cpp).
void onednn_from_environment() {
  const char* text = std::getenv("OOMTUNE_TEST_NO_ONEDNN");
  if (text && std::string_view(text) == "1") at::globalContext().setUserEnabledMkldnn(false);
}

}  // namespace

int serve_trial(const std::string& request_path, const std::string& result_path) {
  TrialRequest request = read_trial_request(request_path);
  install_crash_notes(crash_note_path(result_path));
  onednn_from_environment();
  auto fault = fault_from_environment(request.config + ",global_batch=" + std::to_string(request.job.global_batch));
  request.options.on_phase = [fault](Phase phase) {
    g_phase = static_cast<sig_atomic_t>(phase);
    if (fault) fault(phase);
  };
  ProbeReport report;
  TrainingConfig config;
  const auto failed = [&](const std::string& message, bool input_error) {
    report = outcome_report(request.job, config, TrialOutcome::kError, message, static_cast<Phase>(g_phase));
    report.input_error = input_error;
  };
  try {
    config = parse_config_overrides(request.config, TrainingConfig{});
    report = run_trial(request.job, config, request.options);
  } catch (const InputError& e) {
    failed(e.what(), true);
  } catch (const std::exception& e) {
    // Error, or an exception from libtorch (c10::Error) that nothing
    // wrapped: one failed trial, not the end of the search. The report
    // carries one line, not libtorch's C++ or TorchScript traceback.
    failed(one_line(error_text(e)), false);
  }
  write_file_atomically(result_path, json_text(to_json(report)));
  return kExitOk;
}

}  // namespace oomtune
