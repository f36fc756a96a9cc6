// SPDX-License-Identifier: Apache-2.0
// Unicode normalization through ICU's Normalizer2 UTF-8 API (see normalizer.h). A quick
// isNormalizedUTF8 check skips the copy for text that is already in the target form (most text).
#include "model/tokenizer/normalizer.h"

#include <cstdint>

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

namespace ferry::model::tok {
namespace {

Status add_steps(const Json& j, std::vector<NormalForm>& steps, int depth) {
  if (depth > 8) return corrupt("tokenizer: normalizer Sequence nested too deeply");
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return corrupt("tokenizer: normalizer must be an object with a string \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "NFC") {
    steps.push_back(NormalForm::kNfc);
  } else if (type == "NFD") {
    steps.push_back(NormalForm::kNfd);
  } else if (type == "NFKC") {
    steps.push_back(NormalForm::kNfkc);
  } else if (type == "NFKD") {
    steps.push_back(NormalForm::kNfkd);
  } else if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array()) {
      return corrupt("tokenizer: normalizer Sequence needs a \"normalizers\" array");
    }
    for (const Json& n : j["normalizers"]) FERRY_TRY(add_steps(n, steps, depth + 1));
  } else {
    return unimplemented(
        "tokenizer: normalizer type \"{}\" is not supported (NFC, NFD, NFKC, "
        "NFKD, Sequence)",
        type);
  }
  return ok_status();
}

const icu::Normalizer2* instance(NormalForm f, UErrorCode& ec) {
  switch (f) {
    case NormalForm::kNfc:
      return icu::Normalizer2::getNFCInstance(ec);
    case NormalForm::kNfd:
      return icu::Normalizer2::getNFDInstance(ec);
    case NormalForm::kNfkc:
      return icu::Normalizer2::getNFKCInstance(ec);
    case NormalForm::kNfkd:
      return icu::Normalizer2::getNFKDInstance(ec);
  }
  return nullptr;
}

}  // namespace

Result<Normalizer> Normalizer::from_json(const Json& j) {
  Normalizer n;
  if (j.is_null()) return n;
  FERRY_TRY(add_steps(j, n.steps_, 0));
  return n;
}

Result<std::string> Normalizer::apply(std::string_view s) const {
  if (s.size() > 0x7fffffffu) return invalid_argument("tokenizer: cannot normalize 2 GiB or more");
  std::string cur(s);
  for (const NormalForm f : steps_) {
    UErrorCode ec = U_ZERO_ERROR;
    const icu::Normalizer2* norm = instance(f, ec);
    if (U_FAILURE(ec) || norm == nullptr) {
      return internal_error("tokenizer: ICU normalizer unavailable: {}", u_errorName(ec));
    }
    const icu::StringPiece piece(cur.data(), static_cast<int32_t>(cur.size()));
    if (norm->isNormalizedUTF8(piece, ec) && U_SUCCESS(ec)) continue;
    ec = U_ZERO_ERROR;
    std::string out;
    out.reserve(cur.size() + cur.size() / 8);
    icu::StringByteSink<std::string> sink(&out);
    norm->normalizeUTF8(0, piece, sink, nullptr, ec);
    if (U_FAILURE(ec))
      return internal_error("tokenizer: ICU normalization failed: {}", u_errorName(ec));
    cur = std::move(out);
  }
  return cur;
}

}  // namespace ferry::model::tok
