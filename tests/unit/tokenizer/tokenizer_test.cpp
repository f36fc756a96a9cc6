// SPDX-License-Identifier: Apache-2.0
// Tokenizer end to end on small handcrafted tokenizer.json files whose ids are derived by hand in
// the comments (merge ranks are the merges' positions; the lowest rank merges first).
#include <gtest/gtest.h>

#include "core/json.h"
#include "model/tokenizer/tokenizer.h"

namespace ferry::model {
namespace {

// Byte-level symbols used below: "Ġ" is U+0120 (the GPT-2 symbol for ' ').
// vocab:  h0 e1 l2 o3 Ġ4 w5 r6 d7 he8 ll9 hell10 hello11 Ġw12 or13 Ġwor14 lo15
// merges (rank: pair): 0 "h e", 1 "l l", 2 "he ll", 3 "hell o", 4 "Ġ w", 5 "o r", 6 "Ġw or"
// added: <|end|> id 20 (special), "ferry" id 21 (not special, normalized)
Json hello_json() {
  return Json::parse(R"({
    "version": "1.0",
    "added_tokens": [
      {"id": 20, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false,
       "normalized": false, "special": true},
      {"id": 21, "content": "ferry", "special": false, "normalized": true}
    ],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                      "use_regex": true},
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<|end|>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [],
      "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [20], "tokens": ["<|end|>"]}}},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
      "byte_fallback": false, "ignore_merges": false,
      "vocab": {"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "r": 6, "d": 7, "he": 8,
                "ll": 9, "hell": 10, "hello": 11, "Ġw": 12, "or": 13, "Ġwor": 14, "lo": 15},
      "merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or"]}
  })");
}

Tokenizer load(const Json& j) {
  auto t = Tokenizer::from_json_text(j.dump(), "test.json");
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

using Ids = std::vector<TokenId>;

Ids encode(const Tokenizer& t, std::string_view s, bool add_special = false) {
  auto r = t.encode(s, {.add_special_tokens = add_special});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : Ids{};
}

TEST(Tokenizer, MergesByRank) {
  const Tokenizer t = load(hello_json());
  // "hello" -> h e l l o; (h,e) rank 0 -> he; (l,l) rank 1 -> ll; (he,ll) 2 -> hell; 3 -> hello.
  // " world" -> Ġ w o r l d; (Ġ,w) 4 -> Ġw; (o,r) 5 -> or; (Ġw,or) 6 -> Ġwor; l, d stay.
  EXPECT_EQ(encode(t, "hello world"), (Ids{11, 14, 2, 7}));
  // "lo" has a vocab entry but no merge reaches it: l(2) o(3).
  EXPECT_EQ(encode(t, "lo"), (Ids{2, 3}));
  // Symbols missing from the vocab are dropped when there is no unk_token: "hex" -> he.
  EXPECT_EQ(encode(t, "hex"), (Ids{8}));
  EXPECT_EQ(encode(t, ""), Ids{});
}

TEST(Tokenizer, IgnoreMergesTakesWholeWordFromVocab) {
  Json j = hello_json();
  j["model"]["ignore_merges"] = true;
  const Tokenizer t = load(j);
  EXPECT_EQ(encode(t, "lo"), (Ids{15}));     // whole word "lo" is in the vocab
  EXPECT_EQ(encode(t, "hello"), (Ids{11}));  // same either way
  EXPECT_EQ(encode(t, "hell"), (Ids{10}));
}

TEST(Tokenizer, MergesAsPairsEqualMergesAsStrings) {
  Json j = hello_json();
  Json pairs = Json::array();
  for (const auto& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    const auto sp = s.find(' ');
    pairs.push_back(Json::array({s.substr(0, sp), s.substr(sp + 1)}));
  }
  j["model"]["merges"] = pairs;
  const Tokenizer t = load(j);
  EXPECT_EQ(encode(t, "hello world"), (Ids{11, 14, 2, 7}));
}

TEST(Tokenizer, AddedTokensSplitBeforePreTokenizer) {
  const Tokenizer t = load(hello_json());
  // "hello" | <|end|> | " world" (the space stays with world).
  EXPECT_EQ(encode(t, "hello<|end|> world"), (Ids{11, 20, 14, 2, 7}));
  // Non-special added token "ferry" is matched inside text too: "hello" "ferry" "hello".
  EXPECT_EQ(encode(t, "helloferryhello"), (Ids{11, 21, 11}));
  // Incomplete special token text is ordinary text. GPT-2 split: "<|" (punctuation) and "end";
  // '<', '|' and 'n' are not in the vocab and are dropped, leaving e(1) d(7).
  EXPECT_EQ(encode(t, "<|end"), (Ids{1, 7}));
}

TEST(Tokenizer, TemplateAddsSpecialTokens) {
  const Tokenizer t = load(hello_json());
  EXPECT_EQ(encode(t, "hello", /*add_special=*/true), (Ids{20, 11}));
  EXPECT_EQ(encode(t, "", /*add_special=*/true), (Ids{20}));
}

TEST(Tokenizer, DecodeAndSkipSpecial) {
  const Tokenizer t = load(hello_json());
  const Ids ids = {20, 11, 14, 2, 7, 21};
  auto d = t.decode(ids);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value(), "<|end|>hello worldferry");
  auto s = t.decode(ids, {.skip_special_tokens = true});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s.value(), "hello worldferry");  // "ferry" is not special
  EXPECT_EQ(t.decode(Ids{99}).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(t.decode(Ids{-1}).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(t.id_to_token(12), "\xC4\xA0w");
  EXPECT_EQ(t.token_to_id("<|end|>"), 20);
  EXPECT_TRUE(t.is_special(20));
  EXPECT_FALSE(t.is_special(21));
  EXPECT_EQ(t.vocab_size(), 22u);
}

TEST(Tokenizer, RejectsInvalidUtf8Input) {
  const Tokenizer t = load(hello_json());
  const auto r = t.encode("ok\xC3(");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("UTF-8"), std::string::npos);
}

TEST(Tokenizer, NfcNormalizerComposesBeforeMatching) {
  // Vocabulary with the composed é (C3 A9 -> byte symbols "Ã" "©") and a merge for it.
  Json j = hello_json();
  j["model"]["vocab"]["\xC3\x83"] = 30;  // byte 0xC3 maps to itself: U+00C3
  j["model"]["vocab"]["\xC2\xA9"] = 31;  // byte 0xA9 maps to itself: U+00A9
  j["model"]["vocab"]["\xC3\x83\xC2\xA9"] = 32;
  j["model"]["merges"].push_back("\xC3\x83 \xC2\xA9");
  const Tokenizer t = load(j);
  // "e" + U+0301 (decomposed) -> NFC -> U+00E9 (C3 A9) -> one merge -> 32.
  EXPECT_EQ(encode(t, "e\xCC\x81"), (Ids{32}));
  EXPECT_EQ(encode(t, "\xC3\xA9"), (Ids{32}));
}

}  // namespace
}  // namespace ferry::model
