// SPDX-License-Identifier: Apache-2.0
// ferry's Jinja subset (model/tokenizer/jinja.h) against Python's jinja2 run as transformers runs
// chat templates: tests/data/tokenizer/chat_templates.jsonl, made by
// tools/fixtures/make_chat_template_fixtures.py (templates in the shapes of real chat templates:
// role headers, [INST] alternation checks, a default system message with tools and tojson,
// reasoning-content splitting, whitespace control, and one case per expression feature).
// Every case must render to exactly jinja2's text, or fail where jinja2 raised, with its message.
#include <fstream>

#include <gtest/gtest.h>

#include "model/tokenizer/jinja.h"

namespace ferry::model::jinja {
namespace {

std::vector<nlohmann::ordered_json> load_cases() {
  std::ifstream in(std::string(FERRY_TEST_DATA_DIR) + "/tokenizer/chat_templates.jsonl");
  std::vector<nlohmann::ordered_json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::ordered_json::parse(line));
  }
  return out;
}

TEST(Jinja, RendersAsJinja2DoesOnEveryFixtureCase) {
  const auto cases = load_cases();
  ASSERT_GE(cases.size(), 25u);
  int errors = 0;
  for (const auto& c : cases) {
    const std::string name = c["name"].get<std::string>();
    auto t = Template::parse(c["template"].get<std::string>());
    ASSERT_TRUE(t.ok()) << name << ": " << t.status().to_string();
    Dict vars;
    for (const auto& [k, v] : c["vars"].items()) vars.emplace_back(k, value_from_json(v));
    Result<std::string> got = t->render(vars);
    if (c.contains("error")) {
      ++errors;
      ASSERT_FALSE(got.ok()) << name << " rendered: " << *got;
      EXPECT_NE(got.status().message().find(c["error"].get<std::string>()), std::string::npos)
          << name << ": " << got.status().message();
      continue;
    }
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().to_string();
    EXPECT_EQ(*got, c["expected"].get<std::string>()) << name;
  }
  EXPECT_EQ(errors, 3);
}

TEST(Jinja, UnsupportedConstructsAreRefusedNotRendered) {
  for (const char* src :
       {"{% macro m() %}x{% endmacro %}", "{% include 'x' %}", "{% set x %}block{% endset %}",
        "{% for x in y recursive %}{% endfor %}", "{% raw %}{{ x }}{% endraw %}"}) {
    auto t = Template::parse(src);
    ASSERT_FALSE(t.ok()) << src;
    EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented)
        << src << ": " << t.status().to_string();
  }
  for (const char* src : {"{{ x ", "{% if x %}no end", "{% for %}{% endfor %}", "{{ 'open }}",
                          "{% endfor %}", "{{ a b }}"}) {
    auto t = Template::parse(src);
    ASSERT_FALSE(t.ok()) << src;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument)
        << src << ": " << t.status().to_string();
  }
  // Render-time errors are Statuses too: an unknown filter, a type error.
  for (const char* src : {"{{ 1 | nosuchfilter }}", "{{ 1 + 'a' }}", "{{ 'a' < 1 }}"}) {
    auto t = Template::parse(src);
    ASSERT_TRUE(t.ok()) << src;
    EXPECT_EQ(t->render({}).status().code(), StatusCode::kInvalidArgument) << src;
  }
}

}  // namespace
}  // namespace ferry::model::jinja
