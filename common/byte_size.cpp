#include "common/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace oomtune {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<double> unit_multiplier(std::string_view suffix) {
  const std::string s = lower(suffix);
  if (s.empty() || s == "b") return 1.0;
  if (s == "kib") return 1024.0;
  if (s == "mib") return 1024.0 * 1024;
  if (s == "gib") return 1024.0 * 1024 * 1024;
  if (s == "tib") return 1024.0 * 1024 * 1024 * 1024;
  if (s == "kb") return 1e3;
  if (s == "mb") return 1e6;
  if (s == "gb") return 1e9;
  if (s == "tb") return 1e12;
  return std::nullopt;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

}  // namespace

std::optional<int64_t> parse_byte_size(std::string_view text) {
  text = trim(text);
  if (text.empty()) return std::nullopt;
  // The number is the longest prefix strtod accepts; the rest is the unit.
  const std::string owned(text);
  char* end = nullptr;
  const double number = std::strtod(owned.c_str(), &end);
  if (end == owned.c_str() || !std::isfinite(number) || number < 0) return std::nullopt;
  std::string_view suffix = trim(std::string_view(owned).substr(end - owned.c_str()));
  // Reject things like "0x10" or "inf" that strtod takes but a size is not.
  for (char c : std::string_view(owned).substr(0, end - owned.c_str())) {
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-')
      return std::nullopt;
  }
  const auto multiplier = unit_multiplier(suffix);
  if (!multiplier) return std::nullopt;
  const double bytes = std::floor(number * *multiplier);
  if (bytes >= 9.2e18) return std::nullopt;
  return static_cast<int64_t>(bytes);
}

std::string format_bytes(int64_t bytes) {
  const double magnitude = std::fabs(static_cast<double>(bytes));
  if (magnitude < kKiB) return fmt::format("{} B", bytes);
  if (magnitude < kMiB) return fmt::format("{:.2f} KiB", bytes / double(kKiB));
  if (magnitude < kGiB) return fmt::format("{:.2f} MiB", bytes / double(kMiB));
  return fmt::format("{:.2f} GiB", bytes / double(kGiB));
}

}  // namespace oomtune
