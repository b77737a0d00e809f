#pragma once
// Text for the SVG renderers (render_svg.cpp, render_compare.cpp).

#include <string>

namespace oomtune::diagnose {

/// Text as XML character data: markup characters escaped, and what XML 1.0
/// does not allow even escaped (ill-formed UTF-8, control characters other
/// than tab, newline and carriage return) written as U+FFFD, so that a
/// snapshot's odd file names still give a file a browser opens.
std::string svg_escape(const std::string& text);

}  // namespace oomtune::diagnose
