#pragma once
// Renderers of a Diagnosis: they only read it.

#include <string>

#include "diagnose/compare.h"
#include "diagnose/diagnosis.h"

namespace oomtune::diagnose {

/// The human report for stdout (sizes in IEC units, times in ms).
std::string render_text(const Diagnosis& diagnosis);

/// Everything as JSON; every quantity's key names its unit (`_bytes`, `_us`).
std::string render_json(const Diagnosis& diagnosis);

/// A standalone SVG (no scripts): the timeline stacked by category with the
/// reserved line and oom markers, then the segment map.
std::string render_svg(const Diagnosis& diagnosis);

/// A comparison of two snapshots (compare.h) for stdout: the sides, the
/// verdicts, the table of changes by category, the layers that changed.
std::string render_compare_text(const Comparison& comparison);

/// The comparison as JSON; every quantity's key names its unit (`_bytes`).
std::string render_compare_json(const Comparison& comparison);

/// A standalone SVG (no scripts): A's and B's bytes stacked by category and
/// reserved-but-free on one scale, then the layers' changes as bars either
/// side of an axis.
std::string render_compare_svg(const Comparison& comparison);

}  // namespace oomtune::diagnose
