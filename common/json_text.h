#pragma once
// JSON text for everything oomtune writes as JSON: reports on stdout, the
// framework configs, the trial protocol's files.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace oomtune {

/// `value` (an nlohmann::json, or an ordered_json whose keys keep their
/// insertion order, as the framework configs do) as JSON text: compact when
/// `indent` < 0, else pretty-printed with `indent` spaces per level. A string
/// that is not UTF-8 (a file name or a snapshot frame can hold any bytes) has
/// its ill-formed bytes written as U+FFFD. nlohmann's default
/// (error_handler_t::strict, nlohmann/detail/output/serializer.hpp) throws
/// type_error 316 instead, which turned `diagnose --json` on such a file into
/// an internal error. Throws nothing but std::bad_alloc.
template <typename Json>
std::string json_text(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

/// `value` as JSON, or null when it holds none (a report's or record's
/// absent number: "no budget", "no fit").
template <typename T>
nlohmann::json json_or_null(const std::optional<T>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

}  // namespace oomtune
