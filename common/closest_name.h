#pragma once
// "Did you mean ...?" for unknown keys and names.

#include <string>
#include <string_view>
#include <vector>

namespace oomtune {

/// The candidate that spells the initials of `name`'s words
/// ("learning_rate" -> "lr"), else the first that has `name` as one of its
/// words ("mask" -> "attention_mask"; words split at _ - .), else the one
/// with the smallest Levenshtein distance to `name` (ties: the first); ""
/// when `candidates` is empty.
std::string closest_name(std::string_view name, const std::vector<std::string>& candidates);

/// "unknown X 'name' (did you mean 'closest'?; valid: a, b, c)" tail used in
/// error messages: returns "did you mean 'closest'?; valid: a, b, c".
std::string suggest(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace oomtune
