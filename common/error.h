#pragma once
// The one exception family of oomtune. Everything thrown on purpose derives
// from oomtune::Error; main() catches it once, prints "oomtune: <message>" on
// one line and exits with exit_code(). An out-of-memory result inside a trial
// is data (a ProbeReport outcome), never an Error.

#include <stdexcept>
#include <string>

namespace oomtune {

/// Exit codes of the oomtune executable.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,      ///< the tool could not do its job (internal or runtime failure)
  kExitBadInput = 2,     ///< the user's input (file, flag, model) is wrong
  kExitNothingFits = 3,  ///< autotune: no configuration fits the budget on one device
  kExitUnverified = 4,   ///< autotune: candidates were predicted to fit, but none finished its verification run
};

/// Base of all oomtune errors. The message is one line, names the file, key
/// or operator involved, and says what was expected and what was received.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
  /// The process exit code main() uses for this error.
  virtual int exit_code() const { return kExitFailure; }
};

/// Bad user input: a job spec, a flag, a snapshot, a model file. Exit code 2.
class InputError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitBadInput; }
};

/// A job spec (TOML) that cannot be used. Message starts "FILE:LINE:COLUMN: key".
class SpecError : public InputError {
 public:
  using InputError::InputError;
};

/// A model file that cannot be loaded or run with the given inputs.
class ModelError : public InputError {
 public:
  using InputError::InputError;
};

/// A pickle or memory snapshot that cannot be read safely.
class SnapshotError : public InputError {
 public:
  using InputError::InputError;
};

/// A training configuration (strategy combination) that cannot be applied.
class ConfigError : public InputError {
 public:
  using InputError::InputError;
};

/// An output file that could not be written.
class OutputError : public Error {
 public:
  using Error::Error;
};

}  // namespace oomtune
