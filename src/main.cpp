// oomtune: ends "CUDA out of memory" as a trial-and-error exercise.
// main() only parses the command line, dispatches, and catches errors once.

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "command_line_error.h"
#include "commands.h"
#include "common/error.h"

int main(int argc, char** argv) {
  CLI::App app{"oomtune: find a training configuration that fits GPU memory, and explain OOMs"};
  app.set_version_flag("--version", oomtune::version_string());
  app.require_subcommand(1);
  int exit_code = oomtune::kExitOk;
  for (const auto& command : oomtune::commands()) command.add(app, command, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" that exit 0; CLI11 prints them.
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "{}\n", oomtune::command_line_error(app, e, std::vector<std::string>(argv + 1, argv + argc)));
    return oomtune::kExitBadInput;
  } catch (const oomtune::Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "oomtune: {}\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "oomtune: internal error: {}\n", e.what());
    return oomtune::kExitFailure;
  }
  // Results that never reached stdout (a full disk, /dev/full) are a failure, not a success.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    fmt::print(stderr, "oomtune: cannot write the results to standard output: {}\n", std::strerror(errno));
    return oomtune::kExitFailure;
  }
  return exit_code;
}
