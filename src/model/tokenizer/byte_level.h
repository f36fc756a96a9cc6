// SPDX-License-Identifier: Apache-2.0
// GPT-2's byte-to-unicode table: every byte 0..255 maps to one printable code point so that BPE
// vocabularies never contain raw control bytes or spaces. Bytes that are already printable
// ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) map to themselves; the other 68 map, in increasing
// byte order, to U+0100, U+0101, ... (so ' ' (0x20, the 33rd) becomes U+0120 'Ġ' and '\n' (0x0A,
// the 11th) U+010A 'Ċ'). Covered by tests/unit/tokenizer/byte_level_test.cpp.
#pragma once

#include <string>
#include <string_view>

namespace ferry::model::tok {

// UTF-8 encoding of the code point byte b maps to.
const std::string& byte_to_unicode_utf8(unsigned char b);

// Maps every byte of s through the table (result is valid UTF-8, 1-2 bytes per input byte).
std::string byte_level_encode(std::string_view s);

// Inverse of the table: the byte code point cp stands for, or -1 if cp is not in the table.
int unicode_to_byte(char32_t cp);

// Appends the bytes token (valid UTF-8) stands for. Code points outside the table are appended
// as their own UTF-8 bytes (what HF's ByteLevel decoder does).
void byte_level_decode_append(std::string_view token, std::string& out);

}  // namespace ferry::model::tok
