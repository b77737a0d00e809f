#pragma once
// Durations for people: a toy model steps in microseconds, a large one in
// seconds, and a report compares both kinds.

#include <string>

namespace oomtune {

/// `seconds` with three significant digits and no exponent, without the
/// unit: 0.000134 -> "0.000134", 0.1344 -> "0.134", 0.01 -> "0.0100",
/// 12.34 -> "12.3", 1234.5 -> "1234" (from 100 s on, whole seconds);
/// negative values likewise with a minus sign (-0.0000123 -> "-0.0000123");
/// zero and non-finite values as "{:.0f}" prints them ("0", "inf", "nan").
/// Throws nothing.
std::string format_seconds(double seconds);

}  // namespace oomtune
