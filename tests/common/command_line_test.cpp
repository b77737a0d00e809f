// Command lines CLI11 cannot parse: one line on stderr naming the command,
// what is wrong and the closest valid spelling, then exit code 2. Run
// through the built binary with the commands every build has (diagnose,
// emit), so these hold with and without libtorch.

#include <string>

#include <gtest/gtest.h>

#include "support/run_oomtune.h"

namespace oomtune {
namespace {

using testing::run_oomtune;
using testing::RunResult;

// The error, checked to be the only line and to exit 2.
std::string error_line(const std::string& args) {
  const RunResult r = run_oomtune(args);
  EXPECT_EQ(r.exit_code, 2) << args;
  EXPECT_EQ(r.out, "") << args;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "not one line: " << r.err;
  return r.err.substr(0, r.err.size() - 1);
}

TEST(CommandLine, AnUnknownOptionNamesTheClosestOptionOfItsCommand) {
  EXPECT_EQ(error_line("diagnose s.pickle --jsn"),
            "oomtune diagnose: unknown option --jsn (did you mean --json?); see 'oomtune diagnose --help'");
  // Its would-be value is not reported as a second unexpected argument.
  EXPECT_EQ(error_line("emit plan.toml --outt dir"),
            "oomtune emit: unknown option --outt (did you mean --out?); see 'oomtune emit --help'");
  EXPECT_EQ(error_line("diagnose s.pickle --svgg=t.svg"),
            "oomtune diagnose: unknown option --svgg (did you mean --svg?); see 'oomtune diagnose --help'");
}

TEST(CommandLine, ValuesThatAreMissingOrNotNumbersSayWhichOption) {
  EXPECT_EQ(error_line("diagnose s.pickle --top"),
            "oomtune diagnose: --top: needs a value; see 'oomtune diagnose --help'");
  EXPECT_EQ(error_line("diagnose s.pickle --top 3x"),
            "oomtune diagnose: --top: expected a whole number, got '3x'; see 'oomtune diagnose --help'");
  EXPECT_EQ(error_line("diagnose s.pickle --top -1"),
            "oomtune diagnose: --top: must be >= 0, got -1; see 'oomtune diagnose --help'");
}

TEST(CommandLine, ExtraArgumentsAndUnitsWrittenApart) {
  EXPECT_EQ(error_line("diagnose a.pickle b.pickle"),
            "oomtune diagnose: unexpected argument 'b.pickle'; see 'oomtune diagnose --help'");
  EXPECT_EQ(error_line("diagnose a.pickle --top 8 GiB"),
            "oomtune diagnose: unexpected argument 'GiB': write a size without a space, e.g. 8GiB; see "
            "'oomtune diagnose --help'");
  EXPECT_EQ(error_line("diagnose"), "oomtune diagnose: snapshot is required; see 'oomtune diagnose --help'");
}

TEST(CommandLine, UnknownOrMissingCommands) {
  const std::string unknown = error_line("diagnos s.pickle");
  EXPECT_EQ(unknown.rfind("oomtune: 'diagnos' is not a command (did you mean 'diagnose'?; valid: ", 0), 0u) << unknown;
  EXPECT_EQ(unknown.find("trial"), std::string::npos) << "the hidden trial command is not offered: " << unknown;
  EXPECT_EQ(error_line("").rfind("oomtune: give a command: ", 0), 0u);
  EXPECT_EQ(error_line("--bogus").rfind("oomtune: unknown option --bogus (give --version, --help or a command: ", 0),
            0u);
}

TEST(CommandLine, HelpAndVersionStillExitZero) {
  RunResult r = run_oomtune("diagnose --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--top"), std::string::npos) << r.out;
  r = run_oomtune("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("oomtune ", 0), 0u) << r.out;
}

}  // namespace
}  // namespace oomtune
