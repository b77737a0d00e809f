#include "common/seconds_text.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace oomtune {

std::string format_seconds(double seconds) {
  if (seconds < 0) return "-" + format_seconds(-seconds);  // a fitted intercept can be below zero
  if (!(seconds > 0) || seconds >= 100 || !std::isfinite(seconds)) return fmt::format("{:.0f}", seconds);
  const int decimals = std::clamp(2 - static_cast<int>(std::floor(std::log10(seconds))), 0, 12);
  return fmt::format("{:.{}f}", seconds, decimals);
}

}  // namespace oomtune
