// SPDX-License-Identifier: Apache-2.0
// GPT-2 byte <-> unicode tables (see byte_level.h), built once on first use.
#include "model/tokenizer/byte_level.h"

#include <array>

#include "model/tokenizer/utf8.h"

namespace ferry::model::tok {
namespace {

bool maps_to_itself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<std::string, 256> utf8;
  std::array<char32_t, 256> cp{};
  std::array<short, 324> inverse{};  // code points 0..323 cover the whole table
  Tables() {
    inverse.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      cp[b] = maps_to_itself(b) ? static_cast<char32_t>(b) : next++;
      utf8_append(utf8[b], cp[b]);
      inverse[cp[b]] = static_cast<short>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& byte_to_unicode_utf8(unsigned char b) { return tables().utf8[b]; }

std::string byte_level_encode(std::string_view s) {
  const Tables& t = tables();
  std::string out;
  out.reserve(s.size() + s.size() / 2);
  for (const char c : s) out += t.utf8[static_cast<unsigned char>(c)];
  return out;
}

int unicode_to_byte(char32_t cp) { return cp < 324 ? tables().inverse[cp] : -1; }

void byte_level_decode_append(std::string_view token, std::string& out) {
  std::size_t i = 0;
  while (i < token.size()) {
    std::size_t len = 1;
    const char32_t cp = utf8_decode(token, i, &len);
    const int b = unicode_to_byte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(token.substr(i, len));
    }
    i += len;
  }
}

}  // namespace ferry::model::tok
