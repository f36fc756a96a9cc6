// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: a chat template (the Jinja subset, model/tokenizer/jinja.h) from arbitrary
// bytes, rendered with a small conversation when it parses. Parse and render must return a Status
// for anything malformed, never crash, hang or overflow the stack (nesting, loops and output are
// bounded).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/tokenizer/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ferry::model::jinja;
  const std::string_view src(reinterpret_cast<const char*>(data), size);
  auto t = Template::parse(src);
  if (!t.ok()) return 0;
  const List msgs = {Value::dict({{"role", Value("system")}, {"content", Value("be brief")}}),
                     Value::dict({{"role", Value("user")}, {"content", Value("hi")}})};
  (void)t->render({{"messages", Value::list(msgs)},
                   {"add_generation_prompt", Value(true)},
                   {"bos_token", Value("<s>")},
                   {"eos_token", Value("</s>")}});
  return 0;
}
