// SPDX-License-Identifier: Apache-2.0
// The built-in tokenizer loads through model::Tokenizer; ChatML rendering trains exactly the
// response tokens + <|im_end|>; JSONL errors name file:line; overlong examples are handled.
#include "train/sft_data.h"

#include <gtest/gtest.h>

#include <fstream>

#include "test_util.h"
#include "train/builtin_model.h"

namespace ferry::train {
namespace {

model::Tokenizer builtin_tok() {
  auto t = model::Tokenizer::from_json_text(builtin_tokenizer_json(), "builtin");
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

TEST(BuiltinTokenizer, BytesAndSpecialTokens) {
  const model::Tokenizer tok = builtin_tok();
  EXPECT_EQ(tok.vocab_size(), static_cast<std::size_t>(kBuiltinVocab));
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), kBuiltinImStart);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), kBuiltinImEnd);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), kBuiltinEndOfText);
  const std::string text = "Hi 7\n\xc3\xa9";  // every byte is its own token
  auto ids = tok.encode(text);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), text.size());
  for (std::size_t i = 0; i < text.size(); ++i) EXPECT_EQ((*ids)[i], (unsigned char)text[i]);
  EXPECT_EQ(*tok.decode(*ids), text);
}

// ids[t+1] for every trained target, in order.
std::vector<std::int32_t> trained_ids(const TokenizedExample& t) {
  std::vector<std::int32_t> out;
  for (std::size_t i = 0; i < t.targets.size(); ++i) {
    if (t.targets[i] != kIgnoreTarget) {
      EXPECT_EQ(t.targets[i], t.ids[i + 1]);
      out.push_back(t.targets[i]);
    }
  }
  return out;
}

TEST(SftData, ChatMlMasksExactlyThePrompt) {
  const model::Tokenizer tok = builtin_tok();
  SftExample ex;
  ex.messages = {{"system", "Be brief."}, {"user", "What is 2+3?"}, {"assistant", "5"}};
  auto t = tokenize_example(tok, ex);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // The ids spell the ChatML rendering (without the trailing newline).
  std::string want = model::render_chatml(ex.messages, false);
  want.pop_back();
  EXPECT_EQ(*tok.decode(t->ids), want);
  // Trained: exactly "5" and <|im_end|>, the last two tokens.
  EXPECT_EQ(trained_ids(*t), (std::vector<std::int32_t>{'5', kBuiltinImEnd}));
  EXPECT_EQ(t->prompt_len, static_cast<std::int64_t>(t->ids.size()) - 2);
  // The prompt is what generation would be fed.
  const std::vector<model::ChatMessage> prompt(ex.messages.begin(), ex.messages.end() - 1);
  EXPECT_EQ(*tok.decode(std::span(t->ids.data(), t->prompt_len)),
            model::render_chatml(prompt, true));
  EXPECT_EQ(t->answer, "5");
}

TEST(SftData, EveryAssistantTurnIsTrained) {
  const model::Tokenizer tok = builtin_tok();
  SftExample ex;
  ex.messages = {{"user", "a"}, {"assistant", "bc"}, {"user", "d"}, {"assistant", "e"}};
  auto t = tokenize_example(tok, ex);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(trained_ids(*t),
            (std::vector<std::int32_t>{'b', 'c', kBuiltinImEnd, 'e', kBuiltinImEnd}));
}

TEST(SftData, MalformedLinesNameFileAndLine) {
  const std::string dir = testing::temp_dir("sft");
  const std::string path = dir + "/d.jsonl";
  std::ofstream(path) << "{\"prompt\": \"p\", \"response\": \"r\"}\n"
                      << "{not json\n"
                      << "{\"prompt\": \"p\"}\n"
                      << "\n"
                      << "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n"
                      << "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, "
                         "{\"role\": \"assistant\", \"content\": \"y\"}]}\n";
  DataReport r;
  auto ex = read_sft_jsonl(path, false, &r);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  EXPECT_EQ(ex->size(), 2u);
  EXPECT_EQ(r.lines, 5);
  EXPECT_EQ(r.malformed, 3);
  ASSERT_EQ(r.first_errors.size(), 3u);
  EXPECT_NE(r.first_errors[0].find(path + ":2: not valid JSON"), std::string::npos);
  EXPECT_NE(r.first_errors[1].find(path + ":3: missing \"response\""), std::string::npos);
  EXPECT_NE(r.first_errors[2].find(path + ":5: no assistant message"), std::string::npos);
  DataReport r2;
  auto strict = read_sft_jsonl(path, true, &r2);
  ASSERT_FALSE(strict.ok());
  EXPECT_EQ(strict.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(strict.status().message().find(path + ":2:"), std::string::npos);
}

TEST(SftData, OverlongTruncatedOrSkipped) {
  const model::Tokenizer tok = builtin_tok();
  std::vector<SftExample> exs(2);
  exs[0].messages = {{"user", "q"}, {"assistant", "long answer"}};
  exs[1].messages = {{"user", "q"}, {"assistant", "ok"}};
  auto full = tokenize_example(tok, exs[0]);
  ASSERT_TRUE(full.ok());
  const std::int64_t limit = full->prompt_len + 3;  // keeps "lon" of the first answer
  DataReport r;
  auto t = tokenize_dataset(tok, exs, limit, OverlongPolicy::kTruncate, &r);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(r.truncated, 1);
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].ids.size(), static_cast<std::size_t>(limit));
  EXPECT_EQ(trained_ids((*t)[0]), (std::vector<std::int32_t>{'l', 'o', 'n'}));
  DataReport r2;
  auto s = tokenize_dataset(tok, exs, limit, OverlongPolicy::kSkip, &r2);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(r2.skipped, 1);
  EXPECT_EQ(s->size(), 1u);
}

}  // namespace
}  // namespace ferry::train
