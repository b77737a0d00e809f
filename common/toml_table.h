#pragma once
// Reading one TOML table with errors that point at the source: every error
// is "ORIGIN:LINE:COLUMN: KEY: what is wrong" (STYLE.md), and an unknown key
// names the closest valid one. Shared by the job spec (job) and
// plan.toml (recipes/).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <toml++/toml.h>

namespace oomtune {

/// Parses the TOML document `text`; `origin` names the file in messages.
/// Throws SpecError "ORIGIN:LINE:COLUMN: what toml++ found wrong".
toml::table parse_toml(const std::string& text, const std::string& origin);

/// One table of a TOML document. Getters return nullopt for an absent key
/// and throw SpecError for a value of the wrong type or range.
class TomlTable {
 public:
  /// `origin` names the file in messages; `prefix` is the table's dotted path
  /// ("" for the root, "optimizer", "inputs[0]").
  TomlTable(const toml::table& table, std::string origin, std::string prefix);

  /// Throws SpecError "origin:line:col: full(key): message" at `where`.
  [[noreturn]] void fail_at(const toml::source_region& where, const std::string& key, const std::string& message) const;
  /// Fails at the value of `key`, or at the table when the key is absent.
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;
  /// "missing required key" at the table.
  [[noreturn]] void missing(const std::string& key) const;
  /// Throws for the first key not in `allowed` (with the closest valid name).
  void reject_unknown(const std::vector<std::string>& allowed) const;

  /// The raw value of `key`, or nullptr when absent.
  const toml::node* get(const std::string& key) const { return table_.get(key); }
  /// Whether `key` is present (with any type).
  bool has(const std::string& key) const { return table_.contains(key); }

  /// A string; nullopt when absent; throws for any other type.
  std::optional<std::string> string(const std::string& key) const;
  /// An integer >= min_value.
  std::optional<int64_t> integer(const std::string& key, int64_t min_value) const;
  /// A finite number (integer or float).
  std::optional<double> number(const std::string& key) const;
  /// `node` (the value of `key`) as a finite number; throws otherwise.
  double number_of(const toml::node& node, const std::string& key) const;
  /// A boolean; nullopt when absent; throws for any other type.
  std::optional<bool> boolean(const std::string& key) const;
  /// The sub-table `key`, or nullptr when absent.
  const toml::table* table(const std::string& key) const;

  /// "optimizer.lr" for key "lr" in table "optimizer".
  std::string full(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }
  /// The file name that error messages start with.
  const std::string& origin() const { return origin_; }
  /// The wrapped table.
  const toml::table& node() const { return table_; }

  /// "a string", "an integer", ... for messages.
  static std::string type_name(const toml::node& node);

 private:
  const toml::table& table_;
  std::string origin_;
  std::string prefix_;
};

}  // namespace oomtune
