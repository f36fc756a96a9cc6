// SPDX-License-Identifier: Apache-2.0
// GPT-2 byte table and UTF-8 helpers. Table values follow from its definition (byte_level.h):
// the 68 non-printable bytes 0x00-0x20, 0x7F-0xA0, 0xAD map to U+0100.. in increasing order.
#include <gtest/gtest.h>

#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/utf8.h"

namespace ferry::model::tok {
namespace {

TEST(ByteLevel, TableMatchesDefinition) {
  EXPECT_EQ(byte_to_unicode_utf8(0x00), "\xC4\x80");  // U+0100, first remapped byte
  EXPECT_EQ(byte_to_unicode_utf8(0x0A), "\xC4\x8A");  // U+010A 'Ċ' (11th)
  EXPECT_EQ(byte_to_unicode_utf8(0x20), "\xC4\xA0");  // U+0120 'Ġ' (33rd)
  EXPECT_EQ(byte_to_unicode_utf8(0x7F), "\xC4\xA1");  // U+0121 (34th)
  EXPECT_EQ(byte_to_unicode_utf8(0xAD), "\xC5\x83");  // U+0143 (68th and last)
  EXPECT_EQ(byte_to_unicode_utf8('A'), "A");
  EXPECT_EQ(byte_to_unicode_utf8(0xE9), "\xC3\xA9");  // printable Latin-1 maps to itself
  EXPECT_EQ(unicode_to_byte(0x120), 0x20);
  EXPECT_EQ(unicode_to_byte(0x144), -1);
  EXPECT_EQ(unicode_to_byte(0x4E00), -1);
}

TEST(ByteLevel, AllBytesRoundTrip) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string mapped = byte_level_encode(all);
  EXPECT_EQ(utf8_first_invalid(mapped), std::string_view::npos);
  std::string back;
  byte_level_decode_append(mapped, back);
  EXPECT_EQ(back, all);
}

TEST(Utf8, Validation) {
  EXPECT_EQ(utf8_first_invalid("plain ascii text here"), std::string_view::npos);
  EXPECT_EQ(utf8_first_invalid("caf\xC3\xA9 \xF0\x9F\x98\x80"), std::string_view::npos);
  EXPECT_EQ(utf8_first_invalid("ab\xC0\xAF"), 2u);         // overlong '/'
  EXPECT_EQ(utf8_first_invalid("\xED\xA0\x80"), 0u);       // surrogate U+D800
  EXPECT_EQ(utf8_first_invalid("x\xF4\x90\x80\x80"), 1u);  // > U+10FFFF
  EXPECT_EQ(utf8_first_invalid("123456789\xE2\x82"), 9u);  // truncated after fast path
  EXPECT_EQ(utf8_first_invalid("\x80"), 0u);               // stray continuation
}

TEST(Utf8, RepairReplacesMaximalSubparts) {
  EXPECT_EQ(utf8_repair("a\xC3(b"), "a\xEF\xBF\xBD(b");
  // Truncated 4-byte sequence is one maximal subpart -> one U+FFFD.
  EXPECT_EQ(utf8_repair("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  // ED A0 is not a valid prefix (A0 > 9F), so ED, A0 and 80 are three subparts.
  EXPECT_EQ(utf8_repair("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_repair("ok"), "ok");
}

TEST(Utf8, Whitespace) {
  EXPECT_TRUE(is_unicode_whitespace(' '));
  EXPECT_TRUE(is_unicode_whitespace(0x3000));
  EXPECT_TRUE(is_unicode_whitespace(0x85));
  EXPECT_FALSE(is_unicode_whitespace(0x200B));  // zero width space is not White_Space
  EXPECT_FALSE(is_unicode_whitespace('x'));
}

}  // namespace
}  // namespace ferry::model::tok
