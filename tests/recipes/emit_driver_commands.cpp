// A test-only command table for src/main.cpp: just the emit row, so the
// emit end-to-end tests run through the real main() (error printing, exit
// codes) even before every subcommand of the full binary links.
#include "src/commands.h"

namespace oomtune {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"emit", "Write DeepSpeed / HF / Lightning / Accelerate configs for a plan.toml", add_emit_command},
  };
  return kCommands;
}

const char* version_string() { return "oomtune emit test driver"; }

}  // namespace oomtune
