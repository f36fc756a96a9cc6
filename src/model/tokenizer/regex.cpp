// SPDX-License-Identifier: Apache-2.0
// PCRE2 wrapper (see regex.h). PCRE2 is linked privately by ferry_model; its headers stay here.
#include "model/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace ferry::model::tok {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// One JIT stack per thread, grown to 8 MiB at most (whitespace runs of several MB need more than
// the 32 KiB default for some patterns).
struct JitStack {
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  JitStack() {
    if (stack != nullptr && context != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~JitStack() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return "unknown pcre2 error";
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

Result<Regex> Regex::compile(std::string_view pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // \C (one code unit) could cut a UTF-8 character in two; tokenizer patterns never need it.
  const uint32_t options =
      PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C | (literal ? PCRE2_LITERAL : 0u);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &err, &err_offset, nullptr);
  if (code == nullptr) {
    return invalid_argument("tokenizer: bad regex at offset {}: {} (pattern \"{}\")", err_offset,
                            pcre2_message(err), pattern);
  }
  Regex r;
  r.code_ = std::make_shared<Code>();
  r.code_->code = code;
  r.pattern_ = std::string(pattern);
  r.jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

Status Regex::find_all(std::string_view s, std::vector<Span>& out) const {
  thread_local JitStack jit_stack;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  if (md == nullptr) return resource_exhausted("tokenizer: cannot allocate regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  std::size_t pos = 0;
  Status status;
  while (pos <= s.size()) {
    const int rc =
        pcre2_match(code_->code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, jit_stack.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = internal_error("tokenizer: regex match failed at byte {} of {}: {}", pos, s.size(),
                              pcre2_message(rc));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.push_back({b, e});
      pos = e;
      continue;
    }
    // Empty match: step over one code point.
    if (b >= s.size()) break;
    pos = b + 1;
    while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
  }
  pcre2_match_data_free(md);
  return status;
}

}  // namespace ferry::model::tok
