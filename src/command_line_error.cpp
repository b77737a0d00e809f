#include "command_line_error.h"

#include <algorithm>
#include <cctype>
#include <regex>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"
#include "common/closest_name.h"

namespace oomtune {
namespace {

bool starts_with_dash(const std::string& arg) { return arg.size() > 1 && arg[0] == '-'; }

// The names a user can type for `app`'s options: --long and -s.
std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    for (const std::string& name : option->get_snames()) names.push_back("-" + name);
  }
  return names;
}

// The visible subcommands (the hidden `trial` has no group).
std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App* s) { return !s->get_group().empty(); }))
    names.push_back(sub->get_name());
  return names;
}

// "GiB" in "--budget 8 GiB": a word that parse_byte_size takes as a unit.
bool is_size_unit(const std::string& arg) {
  const bool word =
      !arg.empty() && std::all_of(arg.begin(), arg.end(), [](unsigned char c) { return std::isalpha(c); });
  return word && parse_byte_size("1" + arg).has_value();
}

// What is wrong with the arguments CLI11 could not place.
std::string describe_extras(const CLI::App& scope, const std::vector<std::string>& extras) {
  const auto option = std::find_if(extras.begin(), extras.end(), starts_with_dash);
  if (option != extras.end()) {
    // "--budget=8GiB" is matched by its name alone.
    const std::string name = option->substr(0, option->find('='));
    const std::string closest = closest_name(name, option_names(scope));
    return fmt::format("unknown option {}{}", name, closest.empty() ? "" : fmt::format(" (did you mean {}?)", closest));
  }
  if (is_size_unit(extras.front()))
    return fmt::format("unexpected argument '{}': write a size without a space, e.g. 8{}", extras.front(),
                       extras.front());
  return fmt::format("unexpected argument{} '{}'", extras.size() == 1 ? "" : "s", fmt::join(extras, "' '"));
}

}  // namespace

std::string command_line_error(const CLI::App& app, const CLI::ParseError& error,
                               const std::vector<std::string>& args) {
  const std::vector<CLI::App*> parsed = app.get_subcommands();
  const CLI::App* scope = parsed.empty() ? &app : parsed.front();
  const std::string name = parsed.empty() ? "oomtune" : "oomtune " + scope->get_name();
  std::string what = error.what();
  const std::vector<std::string> commands = command_names(app);
  static const std::regex missing_value(R"(^(\S+): 1 required .* missing$)");
  static const std::regex not_converted(R"(^Could not convert: (\S+) = (.*)$)");
  std::smatch match;
  if (parsed.empty() && !args.empty() && !starts_with_dash(args.front())) {
    what = fmt::format("'{}' is not a command ({})", args.front(), suggest(args.front(), commands));
  } else if (parsed.empty() && !args.empty()) {
    what = fmt::format("unknown option {} (give --version, --help or a command: {})", args.front(),
                       fmt::join(commands, ", "));
  } else if (parsed.empty()) {
    what = fmt::format("give a command: {}", fmt::join(commands, ", "));
  } else if (std::regex_match(what, match, missing_value)) {
    what = match[1].str() + ": needs a value";
  } else if (std::regex_match(what, match, not_converted)) {
    // Every option CLI11 converts is a count (text options take any text).
    what = fmt::format("{}: expected a whole number, got '{}'", match[1].str(), match[2].str());
  } else if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
    std::vector<std::string> extras = scope->remaining();
    if (extras.empty()) extras = app.remaining();
    if (!extras.empty()) what = describe_extras(*scope, extras);
  }
  return fmt::format("{}: {}; see '{} --help'", name, what, name);
}

}  // namespace oomtune
