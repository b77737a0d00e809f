#include "common/toml_table.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/closest_name.h"
#include "common/error.h"

namespace oomtune {

toml::table parse_toml(const std::string& text, const std::string& origin) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw SpecError(fmt::format("{}:{}:{}: {}", origin, e.source().begin.line, e.source().begin.column,
                                std::string(e.description())));
  }
}

TomlTable::TomlTable(const toml::table& table, std::string origin, std::string prefix)
    : table_(table), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

void TomlTable::fail_at(const toml::source_region& where, const std::string& key, const std::string& message) const {
  throw SpecError(fmt::format("{}:{}:{}: {}: {}", origin_, where.begin.line, where.begin.column, full(key), message));
}

void TomlTable::fail(const std::string& key, const std::string& message) const {
  const toml::node* n = table_.get(key);
  fail_at(n ? n->source() : table_.source(), key, message);
}

void TomlTable::missing(const std::string& key) const { fail_at(table_.source(), key, "missing required key"); }

void TomlTable::reject_unknown(const std::vector<std::string>& allowed) const {
  for (const auto& [key, value] : table_) {
    const std::string name(key.str());
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end())
      fail_at(key.source(), name, fmt::format("unknown key ({})", suggest(name, allowed)));
  }
}

std::optional<std::string> TomlTable::string(const std::string& key) const {
  const toml::node* n = get(key);
  if (!n) return std::nullopt;
  if (!n->is_string()) fail(key, fmt::format("expected a string, got {}", type_name(*n)));
  return std::string(*n->value<std::string>());
}

std::optional<int64_t> TomlTable::integer(const std::string& key, int64_t min_value) const {
  const toml::node* n = get(key);
  if (!n) return std::nullopt;
  if (!n->is_integer()) fail(key, fmt::format("expected an integer, got {}", type_name(*n)));
  const int64_t value = *n->value<int64_t>();
  if (value < min_value) fail(key, fmt::format("must be >= {}, got {}", min_value, value));
  return value;
}

std::optional<double> TomlTable::number(const std::string& key) const {
  const toml::node* n = get(key);
  if (!n) return std::nullopt;
  return number_of(*n, key);
}

double TomlTable::number_of(const toml::node& n, const std::string& key) const {
  if (!n.is_number()) fail_at(n.source(), key, fmt::format("expected a number, got {}", type_name(n)));
  const double value = *n.value<double>();
  if (!std::isfinite(value)) fail_at(n.source(), key, fmt::format("must be finite, got {}", value));
  return value;
}

std::optional<bool> TomlTable::boolean(const std::string& key) const {
  const toml::node* n = get(key);
  if (!n) return std::nullopt;
  if (!n->is_boolean()) fail(key, fmt::format("expected true or false, got {}", type_name(*n)));
  return *n->value<bool>();
}

const toml::table* TomlTable::table(const std::string& key) const {
  const toml::node* n = get(key);
  if (!n) return nullptr;
  if (!n->is_table()) fail(key, fmt::format("expected a table [{}], got {}", key, type_name(*n)));
  return n->as_table();
}

std::string TomlTable::type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

}  // namespace oomtune
