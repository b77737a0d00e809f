#pragma once
// Running the built oomtune binary from a test (kOomtuneBinary), or any
// program: its exit code, stdout and stderr. Shared by the end-to-end tests.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include "support/build_values.h"

namespace oomtune::testing {

/// What one run of the binary gave.
struct RunResult {
  int exit_code = -1;  // 128 + signal when killed by a signal
  std::string out;
  std::string err;
};

/// The whole file as text ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Runs `program args` through the shell; `env` ("NAME=VALUE ...") is set
/// for it alone.
inline RunResult run_program(const std::string& program, const std::string& args, const std::string& env = "") {
  static int calls = 0;
  const auto err_path = std::filesystem::temp_directory_path() /
                        ("oomtune_test_stderr_" + std::to_string(::getpid()) + "_" + std::to_string(++calls) + ".txt");
  const std::string command =
      (env.empty() ? "" : "env " + env + " ") + program + " " + args + " 2>" + err_path.string();
  RunResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  char buffer[4096];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.out.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.err = slurp(err_path);
  std::filesystem::remove(err_path);
  return result;
}

/// Runs `kOomtuneBinary args`; `env` ("NAME=VALUE ...") is set for it alone.
inline RunResult run_oomtune(const std::string& args, const std::string& env = "") {
  return run_program(kOomtuneBinary, args, env);
}

/// The last non-empty line (stderr: progress lines come before the error).
inline std::string last_line(const std::string& text) {
  std::string line, last;
  std::istringstream in(text);
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

}  // namespace oomtune::testing
