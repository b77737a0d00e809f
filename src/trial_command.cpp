// `oomtune trial REQUEST RESULT` (hidden): the child side of a trial, run
// from the libtorch module (trial/trial_module.h).

#include <memory>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "trial/trial_module.h"

namespace oomtune {

void add_trial_command(CLI::App& app, const Command& self, int* exit_code) {
  auto paths = std::make_shared<std::pair<std::string, std::string>>();
  CLI::App* cmd = app.add_subcommand(self.name, self.help);
  cmd->group("");  // hidden from --help: oomtune starts it, people do not
  cmd->add_option("request", paths->first, "Trial request (JSON)")->required();
  cmd->add_option("result", paths->second, "Where to write the ProbeReport (JSON)")->required();
  cmd->callback([paths, exit_code] { *exit_code = serve_trial_from_module(paths->first, paths->second); });
}

}  // namespace oomtune
