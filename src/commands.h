#pragma once
// The subcommand table (ninja's kTools[]): one row per subcommand, in the
// order `oomtune --help` lists them. Each row's `add` registers the
// subcommand's flags on the CLI11 app and a callback that runs it and stores
// its exit code.

#include <vector>

namespace CLI {
class App;
}

namespace oomtune {

struct JobOverrides;
struct JobSpec;

/// One subcommand. `add` creates it under `app`; the callback it installs
/// writes the command's exit code to *exit_code.
struct Command {
  const char* name;
  const char* help;
  void (*add)(CLI::App& app, const Command& self, int* exit_code);
};

/// All subcommands compiled into this build.
const std::vector<Command>& commands();

/// Each adds its subcommand under `app` (Command::add of one entry of
/// commands()); its callback writes the command's outcome to *exit_code.
/// Errors are not caught here: they reach main as oomtune::Error.
void add_diagnose_command(CLI::App& app, const Command& self, int* exit_code);
void add_emit_command(CLI::App& app, const Command& self, int* exit_code);
#ifdef OOMTUNE_WITH_TORCH
void add_probe_command(CLI::App& app, const Command& self, int* exit_code);
void add_autotune_command(CLI::App& app, const Command& self, int* exit_code);
void add_trial_command(CLI::App& app, const Command& self, int* exit_code);

/// Throws InputError when `job` asks for device = "cuda" and this build's
/// libtorch has no CUDA, before any trial starts (issue #44, item 6), or for
/// device = "meta" where libtorch cannot count meta tensors (1.13:
/// compat::meta_device_problem). In a CUDA build the trial says whether a
/// GPU answers (trial_runner.h).
void require_device_support(const JobSpec& job);
#endif

/// Adds --budget, --device and --batch (the job-spec overrides) to `cmd`.
void add_job_override_flags(CLI::App& cmd, JobOverrides& overrides);

/// "oomtune 0.1.0 (libtorch 1.13.1, CUDA: no)".
const char* version_string();

}  // namespace oomtune
