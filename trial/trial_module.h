#pragma once
// The child side of a trial lives in a shared module beside the executable,
// liboomtune_trial_module.so, with libtorch behind it; the executable loads
// it (dlopen) only to serve a trial. Loading libtorch costs about 0.65 s and
// 160 MB of resident memory (Debian's libtorch 1.13: `oomtune --version`
// with libtorch linked into the executable), which diagnose, emit, probe and
// the parent of autotune do not need: those run no model in their own
// process (DESIGN.md: a trial is a record in and a record out).

#include <cstddef>
#include <string>

/// The module's one export. C linkage and C types only: no C++ object
/// crosses the boundary. Runs serve_trial (trial/serve_trial.h); on an
/// error returns its exit code and copies its one-line message, truncated
/// and NUL-terminated, into `message` (`message_size` bytes).
extern "C" int oomtune_serve_trial(const char* request_path, const char* result_path, char* message,
                                   std::size_t message_size);

namespace oomtune {

/// The module's path for the oomtune executable at `executable`: the file
/// liboomtune_trial_module.so in the same folder (symbolic links followed).
std::string trial_module_path(const std::string& executable);

/// Throws Error naming the module's path when the module beside
/// `executable` is missing: without it no trial can run, which is one clear
/// error rather than a trial outcome that would read as the model's failure.
/// Throws Error naming the executable when `executable` is a link Linux
/// marks " (deleted)" (/proc/self/exe of a binary rebuilt while it ran).
void require_trial_module(const std::string& executable);

/// Runs serve_trial from the module beside the running executable
/// (trial_module_path("/proc/self/exe")), loading it on the first call. Returns the exit code (0).
/// Throws Error naming the module's path and the loader's reason when it
/// cannot be loaded, and the module's own errors with their exit codes
/// (InputError for 2, Error otherwise).
int serve_trial_from_module(const std::string& request_path, const std::string& result_path);

}  // namespace oomtune
