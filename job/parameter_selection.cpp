#include "job/parameter_selection.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/error.h"

namespace oomtune {
namespace {

bool wildcard(char c) { return c == '*' || c == '?'; }

// The edit distance from `name` to the nearest string `glob` matches: a
// Levenshtein table over (glob prefix, name prefix) where `*` takes any run
// of name characters and `?` any one character at no cost.
std::size_t glob_distance(std::string_view glob, std::string_view name) {
  std::vector<std::size_t> row(name.size() + 1), next(name.size() + 1);
  std::iota(row.begin(), row.end(), std::size_t{0});
  for (std::size_t i = 1; i <= glob.size(); ++i) {
    const char g = glob[i - 1];
    next[0] = g == '*' ? row[0] : row[0] + 1;
    for (std::size_t j = 1; j <= name.size(); ++j) {
      if (g == '*') {
        next[j] = std::min(row[j], next[j - 1]);  // the star ends here, or takes name[j - 1] too
      } else {
        const std::size_t substitute = row[j - 1] + (g == '?' || g == name[j - 1] ? 0 : 1);
        next[j] = std::min({substitute, row[j] + 1, next[j - 1] + 1});
      }
    }
    std::swap(row, next);
  }
  return row[name.size()];
}

// How far `name` is from `glob`, allowing for a forgotten prefix or suffix
// at the cost of one edit each: "lm_head.*" is one from
// "base_model.model.lm_head.weight" (PEFT's prefix), not seventeen.
std::size_t nearness(std::string_view glob, std::string_view name) {
  const std::string g(glob);
  return std::min({glob_distance(g, name), glob_distance("*" + g, name) + 1, glob_distance(g + "*", name) + 1,
                   glob_distance("*" + g + "*", name) + 2});
}

}  // namespace

bool ParameterSelection::operator==(const ParameterSelection& other) const {
  return rule == other.rule && globs == other.globs && frozen_bf16 == other.frozen_bf16;
}

std::string key_of(ParameterSelection::Rule rule) {
  switch (rule) {
    case ParameterSelection::Rule::kAll:
      return "";
    case ParameterSelection::Rule::kTrainable:
      return "trainable";
    case ParameterSelection::Rule::kFrozen:
      return "frozen";
  }
  return "";
}

bool glob_matches(std::string_view glob, std::string_view name) {
  // Greedy with one backtrack point (the last star): linear in practice,
  // and never exponential however many stars the glob has.
  std::size_t g = 0, n = 0, star = std::string_view::npos, star_n = 0;
  while (n < name.size()) {
    if (g < glob.size() && (glob[g] == '?' || (glob[g] == name[n] && !wildcard(glob[g])))) {
      ++g;
      ++n;
    } else if (g < glob.size() && glob[g] == '*') {
      star = g++;
      star_n = n;
    } else if (star != std::string_view::npos) {
      g = star + 1;
      n = ++star_n;
    } else {
      return false;
    }
  }
  while (g < glob.size() && glob[g] == '*') ++g;
  return g == glob.size();
}

std::vector<std::string> nearest_names(std::string_view glob, const std::vector<std::string>& names,
                                       std::size_t count) {
  std::vector<std::pair<std::size_t, std::size_t>> ranked;  // (distance, index)
  for (std::size_t i = 0; i < names.size(); ++i) ranked.emplace_back(nearness(glob, names[i]), i);
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (std::size_t i = 0; i < ranked.size() && out.size() < count; ++i) out.push_back(names[ranked[i].second]);
  return out;
}

std::vector<bool> frozen_names(const ParameterSelection& selection, const std::vector<std::string>& names,
                               const std::string& where, const std::string& model) {
  std::vector<bool> matched(names.size(), false);
  for (const std::string& glob : selection.globs) {
    bool any = false;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (!glob_matches(glob, names[i])) continue;
      matched[i] = true;
      any = true;
    }
    if (!any) {
      constexpr std::size_t kListed = 3;
      throw SpecError(fmt::format("{}: {} glob '{}' matches no parameter of {} (nearest: {})", where,
                                  key_of(selection.rule), glob, model,
                                  fmt::join(nearest_names(glob, names, kListed), ", ")));
    }
  }
  std::vector<bool> frozen(names.size(), false);
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (selection.rule == ParameterSelection::Rule::kTrainable) frozen[i] = !matched[i];
    if (selection.rule == ParameterSelection::Rule::kFrozen) frozen[i] = matched[i];
  }
  return frozen;
}

}  // namespace oomtune
