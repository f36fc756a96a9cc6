// SPDX-License-Identifier: Apache-2.0
// Text normalizers from tokenizer.json ("normalizer"): none, NFC, NFD, NFKC, NFKD and Sequence of
// those. Unicode normalization comes from ICU (libicu-dev, Unicode 15 in bookworm's ICU 72), the
// same Unicode version HF's Rust crate uses for current tokenizers releases. Other HF normalizers
// (Lowercase, Replace, Prepend, BertNormalizer, ...) are refused at load time with an
// unimplemented Status rather than silently skipped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "core/result.h"

namespace ferry::model::tok {

enum class NormalForm : unsigned char { kNfc, kNfd, kNfkc, kNfkd };

class Normalizer {
 public:
  // j: the "normalizer" value (null means none).
  static Result<Normalizer> from_json(const Json& j);

  bool empty() const { return steps_.empty(); }
  // s must be valid UTF-8; the result is valid UTF-8.
  Result<std::string> apply(std::string_view s) const;

 private:
  std::vector<NormalForm> steps_;
};

}  // namespace ferry::model::tok
