// `oomtune emit PLAN.toml --out DIR`: write the framework configs for a plan.
// The work is recipes/recipes.h emit_all(); this file only parses flags and
// prints what was written.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "commands.h"
#include "common/error.h"
#include "recipes/plan_toml.h"
#include "recipes/recipes.h"

namespace oomtune {
namespace {

struct EmitFlags {
  std::string plan_path;
  std::string out_dir;
  std::vector<std::string> formats;
  bool list = false;
};

/// The writer table as text: the same rows drive dispatch and this listing.
std::string writer_listing() {
  std::string out = "formats (--format, comma-separated; default all):\n";
  out += fmt::format("  {:<12} {:<24} {}\n", "all", "", "every file below");
  for (const auto& writer : recipe_writers())
    out += fmt::format("  {:<12} {:<24} {}\n", writer.name, writer.file_name, writer.help);
  return out;
}

int run_emit(const EmitFlags& flags) {
  if (flags.list) {
    fmt::print("{}", writer_listing());
    return kExitOk;
  }
  if (flags.plan_path.empty()) throw InputError("emit: missing PLAN.toml (the plan written by autotune)");
  if (flags.out_dir.empty()) throw InputError("emit: missing --out DIR (the folder to write into)");
  const Plan plan = read_plan_toml(flags.plan_path);
  const std::vector<std::string> formats = flags.formats.empty() ? std::vector<std::string>{"all"} : flags.formats;
  // Each note once, after the files, with the writers whose files carry it:
  // a caveat such as offload's needing a GPU is the same in four files.
  std::vector<std::pair<std::string, std::vector<std::string>>> notes;
  for (const EmittedFile& file : emit_all(plan, flags.out_dir, formats)) {
    fmt::print("wrote {}\n", file.path);
    for (const std::string& note : file.notes) {
      auto same = std::find_if(notes.begin(), notes.end(), [&](const auto& n) { return n.first == note; });
      if (same == notes.end()) same = notes.insert(notes.end(), {note, {}});
      if (std::find(same->second.begin(), same->second.end(), file.writer) == same->second.end())
        same->second.push_back(file.writer);
    }
  }
  std::fflush(stdout);
  for (const auto& [note, writers] : notes) fmt::print(stderr, "emit: {}: note: {}\n", fmt::join(writers, ", "), note);
  return kExitOk;
}

}  // namespace

void add_emit_command(CLI::App& app, const Command& self, int* exit_code) {
  auto flags = std::make_shared<EmitFlags>();
  CLI::App* cmd = app.add_subcommand(self.name, self.help);
  cmd->add_option("plan", flags->plan_path, "Plan file (plan.toml, written by autotune)");
  cmd->add_option("--out,-o", flags->out_dir, "Folder to write into (created if missing)");
  cmd->add_option("--format,-f", flags->formats, "Which files: all (default) or names from --list")->delimiter(',');
  cmd->add_flag("--list", flags->list, "List the formats and their files, then exit");
  cmd->footer(writer_listing());
  cmd->callback([flags, exit_code] { *exit_code = run_emit(*flags); });
}

}  // namespace oomtune
