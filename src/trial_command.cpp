// `oomtune trial REQUEST RESULT` (hidden): the child side of a trial, run
// from the libtorch module (trial/trial_module.h). `oomtune trial --serve`
// serves one trial per line "REQUEST<TAB>RESULT" of its standard input,
// one after another, until it closes (trial/child_trial.h, TrialServer);
// the parent knows a trial is done when its RESULT file appears.

#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "common/error.h"
#include "trial/trial_module.h"

namespace oomtune {
namespace {

struct TrialArguments {
  std::string request, result;
  bool serve = false;
};

int serve_lines() {
  for (std::string line; std::getline(std::cin, line);) {
    const std::size_t tab = line.find('\t');
    if (tab == std::string::npos) throw InputError("oomtune trial --serve: a request line is not REQUEST<TAB>RESULT");
    serve_trial_from_module(line.substr(0, tab), line.substr(tab + 1));
  }
  return kExitOk;
}

}  // namespace

void add_trial_command(CLI::App& app, const Command& self, int* exit_code) {
  auto args = std::make_shared<TrialArguments>();
  CLI::App* cmd = app.add_subcommand(self.name, self.help);
  cmd->group("");  // hidden from --help: oomtune starts it, people do not
  CLI::Option* serve =
      cmd->add_flag("--serve", args->serve, "Serve one trial per line REQUEST<TAB>RESULT of standard input");
  cmd->add_option("request", args->request, "Trial request (JSON)")->excludes(serve);
  cmd->add_option("result", args->result, "Where to write the ProbeReport (JSON)")->excludes(serve);
  cmd->callback([args, exit_code] {
    if (args->serve) {
      *exit_code = serve_lines();
      return;
    }
    if (args->request.empty() || args->result.empty())
      throw InputError("oomtune trial: needs REQUEST and RESULT, or --serve");
    *exit_code = serve_trial_from_module(args->request, args->result);
  });
}

}  // namespace oomtune
