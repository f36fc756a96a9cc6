// SPDX-License-Identifier: Apache-2.0
// Malformed or unsupported tokenizer.json -> a clear Status (code + message naming the problem),
// never a crash or an exception.
#include <gtest/gtest.h>

#include <functional>

#include "core/json.h"
#include "model/tokenizer/tokenizer.h"

namespace ferry::model {
namespace {

Json base() {
  return Json::parse(R"({
    "added_tokens": [{"id": 3, "content": "<s>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\s+|\\S+"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}
  })");
}

struct Case {
  const char* name;
  std::function<void(Json&)> edit;
  StatusCode code;
  const char* needle;  // must appear in the message
};

TEST(TokenizerMalformed, BaseLoads) {
  auto t = Tokenizer::from_json_text(base().dump());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  auto ids = t->encode("ab a<s>");
  ASSERT_TRUE(ids.ok());
  // "ab" -> 2; " " -> 'Ġ' not in vocab, dropped; "a" -> 0; "<s>" -> 3.
  EXPECT_EQ(ids.value(), (std::vector<TokenId>{2, 0, 3}));
}

TEST(TokenizerMalformed, NotJson) {
  for (const char* text : {"", "{", "not json", "[1, 2", "\xFF\xFE{}"}) {
    auto t = Tokenizer::from_json_text(text, "bad.json");
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_EQ(t.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(t.status().message().find("bad.json"), std::string::npos);
  }
  auto arr = Tokenizer::from_json_text("[]");
  EXPECT_EQ(arr.status().code(), StatusCode::kCorrupt);
}

TEST(TokenizerMalformed, MissingFile) {
  auto t = Tokenizer::from_file("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(t.ok());
}

TEST(TokenizerMalformed, EachDefectGivesItsError) {
  const std::vector<Case> cases = {
      {"missing model", [](Json& j) { j.erase("model"); }, StatusCode::kCorrupt, "model"},
      {"model not object", [](Json& j) { j["model"] = 3; }, StatusCode::kCorrupt, "model"},
      {"unknown model type", [](Json& j) { j["model"]["type"] = "WordPiece"; },
       StatusCode::kUnimplemented, "WordPiece"},
      {"model type not string", [](Json& j) { j["model"]["type"] = 1; }, StatusCode::kCorrupt,
       "model.type"},
      {"no vocab", [](Json& j) { j["model"].erase("vocab"); }, StatusCode::kCorrupt, "vocab"},
      {"vocab id not int", [](Json& j) { j["model"]["vocab"]["a"] = "x"; }, StatusCode::kCorrupt,
       "vocab[\"a\"]"},
      {"vocab id negative", [](Json& j) { j["model"]["vocab"]["a"] = -5; }, StatusCode::kCorrupt,
       "vocab[\"a\"]"},
      {"vocab id huge", [](Json& j) { j["model"]["vocab"]["a"] = 2000000000; },
       StatusCode::kCorrupt, "maximum"},
      {"duplicate vocab id", [](Json& j) { j["model"]["vocab"]["b"] = 0; }, StatusCode::kCorrupt,
       "both"},
      {"no merges", [](Json& j) { j["model"].erase("merges"); }, StatusCode::kCorrupt, "merges"},
      {"merge unknown token", [](Json& j) { j["model"]["merges"].push_back("a z"); },
       StatusCode::kCorrupt, "\"z\""},
      {"merge result unknown", [](Json& j) { j["model"]["merges"].push_back("b a"); },
       StatusCode::kCorrupt, "\"ba\""},
      {"merge one part", [](Json& j) { j["model"]["merges"].push_back("ab"); },
       StatusCode::kCorrupt, "merges[1]"},
      {"merge bad pair", [](Json& j) { j["model"]["merges"].push_back(Json::array({"a"})); },
       StatusCode::kCorrupt, "merges[1]"},
      {"merge number", [](Json& j) { j["model"]["merges"].push_back(7); }, StatusCode::kCorrupt,
       "merges[1]"},
      {"byte_fallback", [](Json& j) { j["model"]["byte_fallback"] = true; },
       StatusCode::kUnimplemented, "byte_fallback"},
      {"unk not in vocab", [](Json& j) { j["model"]["unk_token"] = "<unk>"; }, StatusCode::kCorrupt,
       "unk_token"},
      {"added_tokens not array", [](Json& j) { j["added_tokens"] = 1; }, StatusCode::kCorrupt,
       "added_tokens"},
      {"added token no id", [](Json& j) { j["added_tokens"][0].erase("id"); }, StatusCode::kCorrupt,
       "added_tokens[0].id"},
      {"added token bad id", [](Json& j) { j["added_tokens"][0]["id"] = "3"; },
       StatusCode::kCorrupt, "added_tokens[0].id"},
      {"added token no content", [](Json& j) { j["added_tokens"][0].erase("content"); },
       StatusCode::kCorrupt, "added_tokens[0].content"},
      {"added token bad flag", [](Json& j) { j["added_tokens"][0]["lstrip"] = "yes"; },
       StatusCode::kCorrupt, "lstrip"},
      {"added token id clash",
       [](Json& j) { j["added_tokens"].push_back(Json::parse(R"({"id": 3, "content": "</s>"})")); },
       StatusCode::kCorrupt, "added_tokens id 3"},
      {"bad regex",
       [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a"; },
       StatusCode::kInvalidArgument, "bad regex"},
      {"split without pattern",
       [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0].erase("pattern"); },
       StatusCode::kCorrupt, "pattern"},
      {"split bad behavior",
       [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; },
       StatusCode::kCorrupt, "Sideways"},
      {"unknown pre_tokenizer",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       StatusCode::kUnimplemented, "Metaspace"},
      {"pre_tokenizer no type", [](Json& j) { j["pre_tokenizer"] = Json::object(); },
       StatusCode::kCorrupt, "pre_tokenizer"},
      {"unknown normalizer",
       [](Json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       StatusCode::kUnimplemented, "Lowercase"},
      {"unknown decoder",
       [](Json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       StatusCode::kUnimplemented, "decoder"},
      {"unknown post_processor",
       [](Json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       StatusCode::kUnimplemented, "BertProcessing"},
      {"template unknown special",
       [](Json& j) {
         j["post_processor"] = Json::parse(
             R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<x>"}}],
                 "special_tokens": {}})");
       },
       StatusCode::kCorrupt, "<x>"},
  };
  for (const Case& c : cases) {
    Json j = base();
    c.edit(j);
    auto t = Tokenizer::from_json_text(j.dump(), "case.json");
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_EQ(t.status().code(), c.code) << c.name << ": " << t.status().to_string();
    EXPECT_NE(t.status().message().find(c.needle), std::string::npos)
        << c.name << ": " << t.status().to_string();
    EXPECT_EQ(t.status().message().rfind("tokenizer: case.json: ", 0), 0u)
        << c.name << ": " << t.status().to_string();
  }
}

}  // namespace
}  // namespace ferry::model
