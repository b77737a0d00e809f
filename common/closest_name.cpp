#include "common/closest_name.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

namespace oomtune {
namespace {

std::size_t levenshtein(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t above = row[j];
      std::size_t substitution = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitution});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// "learning_rate" -> "lr": users often spell out an abbreviated key.
std::string initials(std::string_view name) {
  std::string out;
  bool word_start = true;
  for (char c : name) {
    if (c == '_' || c == '-' || c == '.') {
      word_start = true;
    } else if (word_start) {
      out += c;
      word_start = false;
    }
  }
  return out;
}

// "mask" is a word of "attention_mask": users often give the short name.
bool has_word(std::string_view candidate, std::string_view word) {
  for (std::size_t at = candidate.find(word); at != std::string_view::npos; at = candidate.find(word, at + 1)) {
    const auto separator = [](char c) { return c == '_' || c == '-' || c == '.'; };
    const bool starts = at == 0 || separator(candidate[at - 1]);
    const std::size_t end = at + word.size();
    if (starts && (end == candidate.size() || separator(candidate[end]))) return true;
  }
  return false;
}

}  // namespace

std::string closest_name(std::string_view name, const std::vector<std::string>& candidates) {
  const std::string abbreviation = initials(name);
  if (abbreviation.size() > 1)
    for (const auto& candidate : candidates)
      if (candidate == abbreviation) return candidate;
  if (name.size() > 1)
    for (const auto& candidate : candidates)
      if (candidate != name && has_word(candidate, name)) return candidate;
  std::string best;
  std::size_t best_distance = SIZE_MAX;
  for (const auto& candidate : candidates) {
    std::size_t distance = levenshtein(name, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

std::string suggest(std::string_view name, const std::vector<std::string>& candidates) {
  return fmt::format("did you mean '{}'?; valid: {}", closest_name(name, candidates), fmt::join(candidates, ", "));
}

}  // namespace oomtune
