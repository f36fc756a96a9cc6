// SPDX-License-Identifier: Apache-2.0
// Agreement with the reference implementation: tests/data/tokenizer/<name>/ holds tokenizers
// trained with Hugging Face `tokenizers` and the ids/tokens/decodes it produced for edge-case
// texts, plus transformers' apply_chat_template output (tools/fixtures/make_tokenizer_fixtures.py).
// A missing fixture directory is a test FAILURE, not a skip: the fixtures are part of the repo.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/json.h"
#include "model/tokenizer/chat_renderer.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/jinja.h"
#include "model/tokenizer/tokenizer.h"

namespace ferry::model {
namespace {

std::string fixture_dir(const std::string& name) {
  return std::string(FERRY_TEST_DATA_DIR) + "/tokenizer/" + name;
}

std::vector<Json> read_jsonl(const std::string& path) {
  std::vector<Json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    rows.push_back(Json::parse(line));
  }
  return rows;
}

class HfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixture, IdsTokensAndDecodesMatchReference) {
  const std::string dir = fixture_dir(GetParam());
  ASSERT_TRUE(std::filesystem::exists(dir + "/tokenizer.json"))
      << dir << "/tokenizer.json is missing: run tools/fixtures/make_tokenizer_fixtures.py";
  auto loaded = Tokenizer::from_file(dir + "/tokenizer.json");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const Tokenizer& tok = loaded.value();
  const auto rows = read_jsonl(dir + "/cases.jsonl");
  ASSERT_GE(rows.size(), 20u) << dir << "/cases.jsonl";
  for (const Json& row : rows) {
    const std::string text = row["text"].get<std::string>();
    const bool add = row["add_special_tokens"].get<bool>();
    const auto want = row["ids"].get<std::vector<TokenId>>();
    auto got = tok.encode(text, {.add_special_tokens = add});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(got.value(), want) << "text=" << Json(text).dump() << " add_special=" << add;
    if (row.contains("tokens")) {
      const auto tokens = row["tokens"].get<std::vector<std::string>>();
      ASSERT_EQ(tokens.size(), want.size());
      for (std::size_t i = 0; i < want.size(); ++i) {
        // HF reports an lstrip/rstrip added token as the span it matched (" <mask> "); every
        // other token is its vocabulary string.
        const std::string_view vocab = tok.id_to_token(want[i]);
        if (tokens[i] != vocab) {
          EXPECT_NE(tokens[i].find(vocab), std::string::npos) << tokens[i];
          EXPECT_NE(tokens[i].find(' '), std::string::npos) << tokens[i];
        }
      }
    }
    if (row.contains("decoded")) {
      auto d = tok.decode(want);
      ASSERT_TRUE(d.ok());
      EXPECT_EQ(d.value(), row["decoded"].get<std::string>()) << Json(text).dump();
    }
    if (row.contains("decoded_skip_special")) {
      auto d = tok.decode(want, {.skip_special_tokens = true});
      ASSERT_TRUE(d.ok());
      EXPECT_EQ(d.value(), row["decoded_skip_special"].get<std::string>()) << Json(text).dump();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, HfFixture, ::testing::Values("qwen2", "llama3"));

TEST(HfFixtureChat, ChatMlMatchesApplyChatTemplate) {
  const std::string dir = fixture_dir("qwen2");
  ASSERT_TRUE(std::filesystem::exists(dir + "/chat_cases.jsonl"))
      << dir << "/chat_cases.jsonl is missing: run tools/fixtures/make_tokenizer_fixtures.py";
  auto tmpl = read_chat_template(dir + "/tokenizer_config.json");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  auto kind = detect_chat_template(tmpl.value());
  ASSERT_TRUE(kind.ok()) << kind.status().to_string();
  auto loaded = Tokenizer::from_file(dir + "/tokenizer.json");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const auto rows = read_jsonl(dir + "/chat_cases.jsonl");
  ASSERT_GE(rows.size(), 3u);
  for (const Json& row : rows) {
    std::vector<ChatMessage> messages;
    for (const Json& m : row["messages"]) {
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    const std::string text =
        render_chat(kind.value(), messages, row["add_generation_prompt"].get<bool>());
    EXPECT_EQ(text, row["text"].get<std::string>());
    auto ids = loaded->encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(ids.value(), row["ids"].get<std::vector<TokenId>>()) << Json(text).dump();
  }
}

// The same transformers renderings through the Jinja subset (jinja.h) instead of the native
// ChatML path: the template source itself, evaluated.
TEST(HfFixtureChat, JinjaRenderingOfTheTemplateMatchesApplyChatTemplate) {
  const std::string dir = fixture_dir("qwen2");
  auto tmpl = read_chat_template(dir + "/tokenizer_config.json");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  auto t = jinja::Template::parse(*tmpl);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  for (const Json& row : read_jsonl(dir + "/chat_cases.jsonl")) {
    jinja::List messages;
    for (const Json& m : row["messages"]) {
      messages.push_back(
          jinja::Value::dict({{"role", jinja::Value(m["role"].get<std::string>())},
                              {"content", jinja::Value(m["content"].get<std::string>())}}));
    }
    auto text = t->render(
        {{"messages", jinja::Value::list(std::move(messages))},
         {"add_generation_prompt", jinja::Value(row["add_generation_prompt"].get<bool>())}});
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    EXPECT_EQ(*text, row["text"].get<std::string>());
  }
}

// ChatRenderer (chat_renderer.h): ChatML natively, other templates through Jinja with the
// config's special tokens, refusals and template errors as Statuses.
TEST(ChatRenderer, PicksThePathAndPassesTheSpecialTokens) {
  const std::vector<ChatMessage> msgs = {{"user", "hi"}};
  auto chatml = ChatRenderer::from_source(kChatMlJinja, "<s>", "</s>");
  ASSERT_TRUE(chatml.ok());
  EXPECT_EQ(chatml->kind(), "chatml");
  EXPECT_EQ(*chatml->render(msgs, true), render_chatml(msgs, true));
  auto other = ChatRenderer::from_source(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor "
      "%}",
      "<s>", "</s>");
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  EXPECT_EQ(other->kind(), "jinja");
  EXPECT_EQ(*other->render(msgs, false), "<s>user: hi</s>");
  auto raising = ChatRenderer::from_source("{{ raise_exception('no system role') }}", "", "");
  ASSERT_TRUE(raising.ok());
  const auto r = raising->render(msgs, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("no system role"), std::string::npos);
  auto unsupported = ChatRenderer::from_source("{% macro x() %}{% endmacro %}", "", "");
  ASSERT_FALSE(unsupported.ok());
  EXPECT_EQ(unsupported.status().code(), StatusCode::kUnimplemented);
  // tokenizer_config.json: special tokens as strings or {"content": ...}.
  const std::string path = ::testing::TempDir() + "/ferry_chat_renderer_config.json";
  {
    std::ofstream f(path);
    f << R"({"bos_token": {"content": "<B>", "lstrip": false}, "eos_token": "<E>",
             "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"})";
  }
  auto from_config = ChatRenderer::from_tokenizer_config(path);
  ASSERT_TRUE(from_config.ok()) << from_config.status().to_string();
  EXPECT_EQ(*from_config->render(msgs, false), "<B>hi<E>");
  std::remove(path.c_str());
}

// The model folder's end tokens: generation_config.json's eos_token_id (an id or a list) and
// tokenizer_config.json's eos_token as the tokenizer's id, each once; none without the files.
TEST(ChatRenderer, ModelEndTokensComeFromBothConfigFiles) {
  auto tok = Tokenizer::from_file(fixture_dir("qwen2") + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const TokenId im_end = tok->token_to_id("<|im_end|>");
  ASSERT_GE(im_end, 0);
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "ferry_model_end_tokens";
  std::filesystem::create_directories(dir);
  EXPECT_TRUE(model_end_token_ids(dir.string(), *tok).empty());
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [5, 7]})";
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": {"content": "<|im_end|>"}})";
  EXPECT_EQ(model_end_token_ids(dir.string(), *tok), (std::vector<TokenId>{5, 7, im_end}));
  std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": " << im_end << "}";
  EXPECT_EQ(model_end_token_ids(dir.string(), *tok), (std::vector<TokenId>{im_end}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry::model
