#include "diagnose/svg_text.h"

#include "common/utf8.h"

namespace oomtune::diagnose {

std::string svg_escape(const std::string& text) {
  std::string out;
  for (char c : to_valid_utf8(text)) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          out += kReplacementCharacter;
        } else {
          out.push_back(c);
        }
    }
  }
  return out;
}

}  // namespace oomtune::diagnose
