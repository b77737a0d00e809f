#pragma once
// The one line oomtune prints for a command line CLI11 could not parse.

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace oomtune {

/// "oomtune autotune: unknown option --budgett (did you mean --budget?); see
/// 'oomtune autotune --help'": CLI11's error with the subcommand it belongs
/// to, an unknown option matched to the closest option of that subcommand,
/// an unknown command to the commands, a unit written apart from its number
/// ("8 GiB") named, and the help hint on the same line. `args` are argv[1..].
/// For --help and --version (exit code 0) the caller lets CLI11 print.
std::string command_line_error(const CLI::App& app, const CLI::ParseError& error, const std::vector<std::string>& args);

}  // namespace oomtune
