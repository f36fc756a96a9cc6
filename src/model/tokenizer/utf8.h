// SPDX-License-Identifier: Apache-2.0
// UTF-8 helpers for the tokenizer: validation (encode refuses invalid input before PCRE2 sees it,
// since the regex runs with PCRE2_NO_UTF_CHECK), code-point iteration, Unicode White_Space (for
// added-token lstrip/rstrip) and the lossy repair decode() applies to byte sequences that do not
// form valid UTF-8 (each maximal invalid subpart becomes one U+FFFD, as Rust's
// String::from_utf8_lossy does). Covered by tests/unit/tokenizer/utf8_test.cpp.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ferry::model::tok {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is invalid (overlong,
// surrogate, > U+10FFFF, truncated, stray continuation byte).
std::size_t utf8_valid_length(std::string_view s, std::size_t i);

// Byte offset of the first invalid sequence, or npos when s is valid UTF-8.
std::size_t utf8_first_invalid(std::string_view s);

// Decodes the (valid) code point at s[i] and stores its byte length in *len.
char32_t utf8_decode(std::string_view s, std::size_t i, std::size_t* len);

void utf8_append(std::string& out, char32_t cp);

// Unicode White_Space property (what Rust's char::is_whitespace tests).
bool is_unicode_whitespace(char32_t cp);

// Returns s with every maximal invalid subpart replaced by U+FFFD.
std::string utf8_repair(std::string_view s);

}  // namespace ferry::model::tok
