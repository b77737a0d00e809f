#include "common/utf8.h"

#include <cstddef>

namespace oomtune {
namespace {

/// One step of decoding at bytes[i]: the length of the well-formed sequence
/// there, or of the maximal ill-formed subpart (at least 1) when !valid.
struct Step {
  std::size_t length;
  bool valid;
};

Step step(std::string_view bytes, std::size_t i) {
  const auto lead = static_cast<unsigned char>(bytes[i]);
  if (lead < 0x80) return {1, true};
  // Table 3-7: the continuation bytes needed, and the range of the first one.
  std::size_t continuation = 0;
  unsigned char low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    continuation = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    continuation = 2;
    if (lead == 0xE0) low = 0xA0;   // overlong below U+0800
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    continuation = 3;
    if (lead == 0xF0) low = 0x90;   // overlong below U+10000
    if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
  } else {
    return {1, false};  // 0x80..0xC1, 0xF5..0xFF never start a sequence
  }
  for (std::size_t k = 1; k <= continuation; ++k) {
    if (i + k >= bytes.size()) return {k, false};
    const auto b = static_cast<unsigned char>(bytes[i + k]);
    if (b < low || b > high) return {k, false};
    low = 0x80;
    high = 0xBF;
  }
  return {continuation + 1, true};
}

}  // namespace

bool is_valid_utf8(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    const Step s = step(bytes, i);
    if (!s.valid) return false;
    i += s.length;
  }
  return true;
}

std::string to_valid_utf8(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    const Step s = step(bytes, i);
    if (s.valid) {
      text.append(bytes.substr(i, s.length));
    } else {
      text += kReplacementCharacter;
    }
    i += s.length;
  }
  return text;
}

}  // namespace oomtune
