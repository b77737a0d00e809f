#pragma once
// UTF-8 for text oomtune did not make. File names and the strings inside a
// memory snapshot can hold any bytes, while JSON, SVG and the trial protocol
// need well-formed UTF-8.

#include <string>
#include <string_view>

namespace oomtune {

/// U+FFFD REPLACEMENT CHARACTER, encoded.
inline constexpr const char* kReplacementCharacter = "\xEF\xBF\xBD";

/// Whether `bytes` is well-formed UTF-8: the byte sequences of the Unicode
/// Standard's table 3-7 (section 3.9), so no overlong forms, no surrogates
/// (U+D800..U+DFFF) and nothing above U+10FFFF. Throws nothing.
bool is_valid_utf8(std::string_view bytes);

/// `bytes` with each maximal ill-formed subpart replaced by U+FFFD (the
/// Unicode Standard's "substitution of maximal subparts", section 3.9, which
/// Python's errors="replace" also follows); well-formed text comes back
/// unchanged. Throws nothing but std::bad_alloc.
std::string to_valid_utf8(std::string_view bytes);

}  // namespace oomtune
