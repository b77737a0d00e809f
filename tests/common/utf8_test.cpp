// UTF-8 checks (common/utf8.h) and JSON text (common/json_text.h). The
// expectations follow the Unicode Standard's table 3-7 and its example of
// "substitution of maximal subparts" (section 3.9, table 3-8), which
// Python's bytes.decode("utf-8", "replace") reproduces.

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "common/utf8.h"

namespace oomtune {
namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

TEST(Utf8, WellFormedTextIsValidAndUnchanged) {
  for (const std::string& text : {std::string(), std::string("plain ascii"), std::string("m\xC3\xA9moire"),
                                  std::string("\xE2\x82\xAC \xF0\x9F\x98\x80"),  // euro sign, an emoji
                                  std::string("\xF4\x8F\xBF\xBF"),               // U+10FFFF
                                  std::string("nul \0 inside", 13)}) {
    EXPECT_TRUE(is_valid_utf8(text)) << text;
    EXPECT_EQ(to_valid_utf8(text), text);
  }
}

TEST(Utf8, IllFormedBytesBecomeOneReplacementPerMaximalSubpart) {
  // A Latin-1 file name: 0xE9 starts a 3-byte sequence that 'm' breaks.
  EXPECT_FALSE(is_valid_utf8("m\xE9moire"));
  EXPECT_EQ(to_valid_utf8("m\xE9moire"), "m" + kReplacement + "moire");
  // Overlong '/', a surrogate, above U+10FFFF, a lone continuation byte: each
  // byte on its own (none is a prefix of a well-formed sequence).
  EXPECT_EQ(to_valid_utf8("\xC0\xAF"), kReplacement + kReplacement);
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), kReplacement + kReplacement + kReplacement);
  EXPECT_EQ(to_valid_utf8("\xF4\x90\x80\x80"), kReplacement + kReplacement + kReplacement + kReplacement);
  EXPECT_EQ(to_valid_utf8("a\x80z"), "a" + kReplacement + "z");
  // A truncated sequence is one maximal subpart, at the end or before ASCII.
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98"), kReplacement);
  EXPECT_EQ(to_valid_utf8("\xE2\x82z"), kReplacement + "z");
  // Table 3-8 of the standard: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  EXPECT_EQ(
      to_valid_utf8("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
      "a" + kReplacement + kReplacement + kReplacement + "b" + kReplacement + "c" + kReplacement + kReplacement + "d");
  for (const char* bad : {"\xC0\xAF", "\xED\xA0\x80", "\xF0\x9F\x98", "\xFF"}) EXPECT_FALSE(is_valid_utf8(bad));
}

TEST(JsonText, IllFormedStringsAreWrittenWithReplacementsNotThrown) {
  const nlohmann::json value = {{"file", "m\xE9moire.pickle"}, {"ok", "caf\xC3\xA9"}};
  EXPECT_THROW((void)value.dump(), nlohmann::json::type_error);  // nlohmann's default
  const std::string text = json_text(value);
  const nlohmann::json back = nlohmann::json::parse(text);
  EXPECT_EQ(back["file"], "m" + kReplacement + "moire.pickle");
  EXPECT_EQ(back["ok"], "caf\xC3\xA9");  // not escaped to \u00e9: the bytes stay
  EXPECT_EQ(json_text(nlohmann::json{{"a", 1}}, 2), "{\n  \"a\": 1\n}");
}

}  // namespace
}  // namespace oomtune
