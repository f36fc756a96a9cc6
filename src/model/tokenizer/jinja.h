// SPDX-License-Identifier: Apache-2.0
// A Jinja2 subset for Hugging Face chat templates (tokenizer_config.json "chat_template"), so
// `ferry serve` renders a model's own template as transformers' apply_chat_template does
// (jinja2 with trim_blocks and lstrip_blocks, loop controls, its raise_exception, tojson as
// json.dumps(ensure_ascii=False) and strftime_now).
//   Statements: {% for x in e %}/{% for a, b in e %} (loop.index/index0/revindex/revindex0/first/
//     last/length, {% else %}), {% if %}/{% elif %}/{% else %}, {% set x = e %},
//     {% set ns.x = e %}, {% break %}, {% continue %}, {% generation %} (rendered as its body),
//     comments, whitespace control (-), trim_blocks / lstrip_blocks.
//   Expressions: literals (str, int, float, true/false/none, lists, dicts), names, a.b, a[b],
//     slices a[i:j:k], calls, + - * / // % ** ~, chained comparisons, in / not in, and / or /
//     not, x if c else y; filters trim length count tojson string upper lower capitalize title
//     first last join default (d) items list reverse replace int float abs safe selectattr
//     rejectattr map(attribute=); tests defined undefined none string number integer float
//     boolean mapping iterable sequence true false odd even divisibleby equalto eq sameas; str
//     methods strip lstrip rstrip split startswith endswith upper lower replace find title
//     capitalize; dict methods items keys values get; globals raise_exception namespace range
//     strftime_now dict.
// Anything else (macros, call blocks, includes, unknown filters) fails to parse with an
// unimplemented Status naming it, so a template ferry cannot render is refused, never rendered
// wrongly. Rendering errors (raise_exception, a type error) are invalid_argument with the
// message. The reference for every feature is Python's jinja2 run the way transformers runs it
// (tools/fixtures/make_chat_template_fixtures.py -> tests/data/tokenizer/chat_templates.jsonl).
//   FERRY_ASSIGN_OR_RETURN(auto t, jinja::Template::parse(source));
//   FERRY_ASSIGN_OR_RETURN(std::string text, t.render({{"messages", msgs}, ...}));
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"
#include "model/tokenizer/jinja_value.h"

namespace ferry::model::jinja {

struct Node;  // the parsed template (jinja.cpp)

class Template {
 public:
  static Result<Template> parse(std::string_view source);
  // The variables the template sees (e.g. messages, add_generation_prompt, bos_token, eos_token).
  Result<std::string> render(const Dict& variables) const;

  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  ~Template();

 private:
  Template();
  std::shared_ptr<const Node> root_;
};

}  // namespace ferry::model::jinja
