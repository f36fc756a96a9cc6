// SPDX-License-Identifier: Apache-2.0
// UTF-8 validation, decoding and lossy repair (see utf8.h). Validation follows the Unicode
// well-formed byte sequence table (Unicode 15, table 3-7).
#include "model/tokenizer/utf8.h"

#include <cstdint>

namespace ferry::model::tok {
namespace {

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Number of bytes of the longest prefix of an ill-formed sequence at s[i] that could still start
// a valid one (the "maximal subpart"); at least 1.
std::size_t maximal_subpart(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const std::size_t n = s.size() - i;
  const unsigned char c0 = b(0);
  std::size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    need = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    need = 3;
    if (c0 == 0xE0) lo = 0xA0;
    if (c0 == 0xED) hi = 0x9F;
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    need = 4;
    if (c0 == 0xF0) lo = 0x90;
    if (c0 == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  std::size_t k = 1;
  if (k < n && k < need && b(k) >= lo && b(k) <= hi) {
    ++k;
    while (k < n && k < need && is_cont(b(k))) ++k;
  }
  return k;
}

}  // namespace

std::size_t utf8_valid_length(std::string_view s, std::size_t i) {
  const std::size_t n = s.size() - i;
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c0 = b(0);
  if (c0 < 0x80) return 1;
  if (c0 >= 0xC2 && c0 <= 0xDF) return n >= 2 && is_cont(b(1)) ? 2 : 0;
  if (c0 >= 0xE0 && c0 <= 0xEF) {
    if (n < 3) return 0;
    const unsigned char lo = c0 == 0xE0 ? 0xA0 : 0x80, hi = c0 == 0xED ? 0x9F : 0xBF;
    return b(1) >= lo && b(1) <= hi && is_cont(b(2)) ? 3 : 0;
  }
  if (c0 >= 0xF0 && c0 <= 0xF4) {
    if (n < 4) return 0;
    const unsigned char lo = c0 == 0xF0 ? 0x90 : 0x80, hi = c0 == 0xF4 ? 0x8F : 0xBF;
    return b(1) >= lo && b(1) <= hi && is_cont(b(2)) && is_cont(b(3)) ? 4 : 0;
  }
  return 0;
}

std::size_t utf8_first_invalid(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      std::uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const std::size_t len = utf8_valid_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

char32_t utf8_decode(std::string_view s, std::size_t i, std::size_t* len) {
  const auto b = [&](std::size_t k) {
    return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]));
  };
  const char32_t c0 = b(0);
  if (c0 < 0x80) {
    *len = 1;
    return c0;
  }
  if (c0 < 0xE0) {
    *len = 2;
    return ((c0 & 0x1F) << 6) | (b(1) & 0x3F);
  }
  if (c0 < 0xF0) {
    *len = 3;
    return ((c0 & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  }
  *len = 4;
  return ((c0 & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_unicode_whitespace(char32_t cp) {
  // PropList.txt White_Space (Unicode 15).
  if (cp >= 0x09 && cp <= 0x0D) return true;
  switch (cp) {
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string utf8_repair(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t len = utf8_valid_length(s, i);
    if (len > 0) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += maximal_subpart(s, i);
    }
  }
  return out;
}

}  // namespace ferry::model::tok
