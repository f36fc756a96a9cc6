// SPDX-License-Identifier: Apache-2.0
// decode(encode(x)) == normalize(x) for seeded random valid UTF-8 (all planes, combining marks,
// whitespace runs, special-token text inline) on the HF fixture tokenizers, and linear-time
// behaviour on long whitespace / digit runs on a handcrafted byte-level tokenizer whose ids are
// the input bytes (derivation in the comments).
#include <gtest/gtest.h>

#include <random>

#include "core/json.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/utf8.h"

namespace ferry::model {
namespace {

using Ids = std::vector<TokenId>;

std::string random_utf8(std::mt19937& rng, const std::vector<std::string>& specials) {
  std::string s;
  const int n = std::uniform_int_distribution<int>(0, 120)(rng);
  for (int i = 0; i < n; ++i) {
    const int kind = std::uniform_int_distribution<int>(0, 11)(rng);
    char32_t cp = 0;
    const auto in = [&](char32_t lo, char32_t hi) {
      return std::uniform_int_distribution<char32_t>(lo, hi)(rng);
    };
    switch (kind) {
      case 0:
      case 1:
        cp = in(0x20, 0x7E);
        break;
      case 2:
        cp = std::array<char32_t, 7>{' ', '\t', '\n', '\r', 0xA0, 0x3000, 0x2003}[in(0, 6)];
        break;
      case 3:
        cp = in('0', '9');
        break;
      case 4:
        cp = in(0xC0, 0x17F);
        break;
      case 5:
        cp = in(0x300, 0x36F);
        break;  // combining marks
      case 6:
        cp = in(0x4E00, 0x9FFF);
        break;
      case 7:
        cp = in(0x1F300, 0x1FAFF);
        break;
      case 8:
        cp = std::array<char32_t, 3>{0x200D, 0xFE0F, 0x1F3FD}[in(0, 2)];
        break;
      case 9:
        cp = in(0x590, 0x6FF);
        break;  // Hebrew, Arabic
      case 10: {
        do cp = in(0, 0x10FFFF);
        while (cp >= 0xD800 && cp <= 0xDFFF);
        break;
      }
      default:
        if (!specials.empty()) s += specials[in(0, static_cast<char32_t>(specials.size() - 1))];
        continue;
    }
    tok::utf8_append(s, cp);
  }
  return s;
}

void check_round_trip(const std::string& name, const std::vector<std::string>& specials) {
  const std::string path =
      std::string(FERRY_TEST_DATA_DIR) + "/tokenizer/" + name + "/tokenizer.json";
  auto loaded = Tokenizer::from_file(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  std::mt19937 rng(20240611);
  for (int i = 0; i < 300; ++i) {
    const std::string x = random_utf8(rng, specials);
    auto ids = loaded->encode(x);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    auto back = loaded->decode(ids.value());
    ASSERT_TRUE(back.ok());
    auto want = loaded->normalize(x);
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(back.value(), want.value()) << "seed case " << i << ": " << Json(x).dump();
  }
}

TEST(RoundTrip, Qwen2FixtureRandomUtf8) {
  check_round_trip("qwen2", {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "ferryboat"});
}

TEST(RoundTrip, Llama3FixtureRandomUtf8) {
  check_round_trip("llama3", {"<|begin_of_text|>", "<|eot_id|>"});
}

// Byte-level tokenizer whose vocab is the 256 byte symbols with id == byte value, plus "ĠĠ" (two
// spaces) = 256 from the single merge "Ġ Ġ"; Qwen2's split pattern.
Tokenizer byte_tokenizer() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[tok::byte_to_unicode_utf8(static_cast<unsigned char>(b))] = b;
  vocab["\xC4\xA0\xC4\xA0"] = 256;
  Json j = {
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         Json::array(
             {{{"type", "Split"},
               {"pattern",
                {{"Regex",
                  R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array({"\xC4\xA0 \xC4\xA0"})}}}};
  auto t = Tokenizer::from_json_text(j.dump());
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

TEST(RoundTrip, IdsAreBytesWithoutMerges) {
  const Tokenizer t = byte_tokenizer();
  const std::string s = "h\xC3\xA9 \xF0\x9F\x98\x80\t\r\n";
  auto ids = t.encode(s);
  ASSERT_TRUE(ids.ok());
  Ids want;
  for (const char c : s) want.push_back(static_cast<unsigned char>(c));
  EXPECT_EQ(ids.value(), want);
}

TEST(RoundTrip, LongWhitespaceRunIsLinear) {
  const Tokenizer t = byte_tokenizer();
  // "x" + 60001 spaces + "y": split "x" | 60000 spaces (\s+(?!\S) leaves the last one) | " y".
  // The spaces merge pairwise, leftmost first: 30000 x 256. " y" has no merge: 32, 121.
  const std::string s = "x" + std::string(60001, ' ') + "y";
  auto ids = t.encode(s);
  ASSERT_TRUE(ids.ok());
  Ids want{120};
  want.insert(want.end(), 30000, 256);
  want.push_back(32);
  want.push_back(121);
  EXPECT_EQ(ids.value(), want);
  auto back = t.decode(ids.value());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back.value(), s);
}

TEST(RoundTrip, LongDigitRunIsLinear) {
  const Tokenizer t = byte_tokenizer();
  // \p{N} takes one digit per word: 60000 words "9" -> 57 each.
  auto ids = t.encode(std::string(60000, '9'));
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids.value(), Ids(60000, 57));
}

TEST(RoundTrip, CutInsideCharacterDecodesToReplacement) {
  const Tokenizer t = byte_tokenizer();
  // U+1F600 is F0 9F 98 80; dropping the last byte leaves one maximal invalid subpart -> U+FFFD.
  auto d = t.decode(Ids{0xF0, 0x9F, 0x98, 'a'});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value(),
            "\xEF\xBF\xBD"
            "a");
}

}  // namespace
}  // namespace ferry::model
