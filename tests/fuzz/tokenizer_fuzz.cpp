// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the tokenizer. The first input byte picks the mode:
//   even: the rest is a tokenizer.json; loading must return a Status or a working tokenizer
//         (which then encodes and decodes a fixed text).
//   odd:  the rest is text for a fixed byte-level tokenizer (NFC, Qwen2 split, merges, added
//         tokens): encode must fail cleanly on invalid UTF-8 and otherwise satisfy
//         decode(encode(x)) == normalize(x); the same bytes read as int32 ids must decode or fail
//         cleanly.
// Seeds: tests/fuzz/corpus/tokenizer/.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/tokenizer.h"

namespace {

using ferry::Json;
using ferry::model::TokenId;
using ferry::model::Tokenizer;

Tokenizer make_fixed() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[ferry::model::tok::byte_to_unicode_utf8(static_cast<unsigned char>(b))] = b;
  }
  const char* merges[][2] = {{"Ġ", "Ġ"}, {"t", "h"}, {"th", "e"}, {"Ġ", "the"},
                             {"1", "2"}, {"Ã", "©"}, {"i", "n"},  {"in", "g"}};
  Json m = Json::array();
  TokenId next = 256;
  for (const auto& pair : merges) {
    m.push_back(Json::array({pair[0], pair[1]}));
    const std::string merged = std::string(pair[0]) + pair[1];
    if (!vocab.contains(merged)) vocab[merged] = next++;
  }
  Json j = {
      {"added_tokens",
       Json::array(
           {{{"id", 1000}, {"content", "<|im_start|>"}, {"special", true}},
            {{"id", 1001}, {"content", "<|im_end|>"}, {"special", true}},
            {{"id", 1002}, {"content", "boat"}, {"special", false}, {"normalized", true}}})},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         Json::array(
             {{{"type", "Split"},
               {"pattern",
                {{"Regex",
                  R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
               {"behavior", "Isolated"}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
  auto t = Tokenizer::from_json_text(j.dump(), "fuzz fixed tokenizer");
  if (!t.ok()) __builtin_trap();
  return std::move(t).value();
}

void exercise(const Tokenizer& tok, std::string_view text) {
  auto ids = tok.encode(text, {.add_special_tokens = true});
  if (!ids.ok()) return;
  (void)tok.decode(ids.value(), {.skip_special_tokens = true});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) == 0) {
    auto t = Tokenizer::from_json_text(rest, "fuzz input");
    if (t.ok())
      exercise(t.value(), "Hello, world! 12345 <|im_start|> caf\xC3\xA9 \xF0\x9F\x98\x80");
    return 0;
  }
  static const Tokenizer fixed = make_fixed();
  auto ids = fixed.encode(rest);
  if (ids.ok()) {
    auto back = fixed.decode(ids.value());
    auto want = fixed.normalize(rest);
    if (!back.ok() || !want.ok() || back.value() != want.value()) __builtin_trap();
  }
  std::vector<TokenId> raw(rest.size() / sizeof(TokenId));
  if (!raw.empty()) std::memcpy(raw.data(), rest.data(), raw.size() * sizeof(TokenId));
  (void)fixed.decode(raw);
  return 0;
}
