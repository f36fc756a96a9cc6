// SPDX-License-Identifier: Apache-2.0
// Post-processors of tokenizer.json ("post_processor"), applied when encode is asked to add
// special tokens: TemplateProcessing (single-sequence template, e.g. Llama 3's
// "<|begin_of_text|> $A"), ByteLevel (offsets only: no change to ids) and Sequence of those.
// Pair templates are parsed but unused (ferry encodes single sequences). Other processors
// (BertProcessing, RobertaProcessing) are refused at load time.
// Thread-safety: immutable after from_json.
#pragma once

#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "model/tokenizer/bpe_model.h"

namespace ferry::model::tok {

class PostProcessor {
 public:
  // j: the "post_processor" value (null means none).
  static Result<PostProcessor> from_json(const Json& j);

  // Returns ids wrapped by every template in order.
  std::vector<TokenId> apply(const std::vector<TokenId>& ids) const;

 private:
  // One template: items are either the sequence (empty ids, is_sequence) or fixed special ids.
  struct Item {
    bool is_sequence = false;
    std::vector<TokenId> ids;
  };
  std::vector<std::vector<Item>> templates_;
};

}  // namespace ferry::model::tok
