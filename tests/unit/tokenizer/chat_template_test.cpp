// SPDX-License-Identifier: Apache-2.0
// ChatML rendering (exact strings from the template definition), detection of the ChatML Jinja
// source in its common spellings, refusal of other templates, reading tokenizer_config.json.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "model/tokenizer/chat_template.h"

namespace ferry::model {
namespace {

TEST(ChatTemplate, RendersChatMl) {
  const std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "Hi\nthere"}};
  EXPECT_EQ(render_chatml(m, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n");
  EXPECT_EQ(render_chatml(m, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n"
            "<|im_start|>assistant\n");
  // No system message is invented.
  EXPECT_EQ(render_chatml(std::vector<ChatMessage>{{"user", ""}}, false),
            "<|im_start|>user\n<|im_end|>\n");
}

TEST(ChatTemplate, DetectsChatMlSpellings) {
  EXPECT_TRUE(detect_chat_template(kChatMlJinja).ok());
  // Whitespace, double quotes and Jinja trim markers do not change the template.
  const std::string spaced =
      "{%- for message in messages -%}\n  {{ \"<|im_start|>\" + message['role'] + \"\\n\" + "
      "message['content'] + \"<|im_end|>\" + \"\\n\" }}\n{%- endfor %}\n"
      "{% if add_generation_prompt %}\n{{ \"<|im_start|>assistant\\n\" }}\n{% endif %}";
  EXPECT_TRUE(detect_chat_template(spaced).ok());
}

TEST(ChatTemplate, RefusesOtherTemplates) {
  // Qwen2.5 style: injects a default system prompt; rendering it as plain ChatML would be wrong.
  const std::string qwen25 =
      "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
      "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are "
      "Qwen.<|im_end|>\\n' }}{%- endif %}";
  const auto r = detect_chat_template(qwen25);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("ChatML"), std::string::npos);
  EXPECT_FALSE(detect_chat_template("").ok());
}

std::string write_temp(const std::string& name, const std::string& body) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << body;
  return path;
}

TEST(ChatTemplate, ReadsTokenizerConfig) {
  auto s = read_chat_template(write_temp("tc_string.json", R"({"chat_template": "abc"})"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s.value(), "abc");
  auto l = read_chat_template(write_temp(
      "tc_list.json",
      R"({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]})"));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l.value(), "d");
  EXPECT_EQ(read_chat_template(write_temp("tc_none.json", R"({"eos_token": "x"})")).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(
      read_chat_template(write_temp("tc_bad.json", R"({"chat_template": 3})")).status().code(),
      StatusCode::kCorrupt);
  EXPECT_EQ(read_chat_template(write_temp("tc_notjson.json", "{")).status().code(),
            StatusCode::kCorrupt);
}

}  // namespace
}  // namespace ferry::model
