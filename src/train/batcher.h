// SPDX-License-Identifier: Apache-2.0
// Micro-batches from tokenized examples. Each epoch visits every example once in an order drawn
// from (seed, epoch) alone, so the data position is fully described by a DataCursor {epoch,
// index} (what checkpoints store for exact resume).
// Packed mode: the B examples of a micro-batch lie back to back (cu_seqlens, positions restart at
// 0 per sequence; T = sum of lengths). Padded mode (--padding): every example occupies seq_len
// tokens, its tail filled with pad_id, target -100 — the same loss and gradients as packed (the
// padding comes after each sequence's real tokens and attention is causal), computed over B * S
// tokens: the anchors' convention, kept for comparability.
// Tests: tests/unit/train/batcher_test.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_compute.h"
#include "train/sft_data.h"

namespace ferry::train {

struct DataCursor {
  std::int64_t epoch = 0;
  std::int64_t index = 0;  // next position in the epoch's order
};

struct MicroBatch {
  std::vector<std::int32_t> ids;         // [T]
  std::vector<std::int32_t> positions;   // [T]
  std::vector<std::int32_t> cu_seqlens;  // [S + 1]
  std::vector<std::int32_t> targets;     // [T]
  std::int64_t useful_tokens = 0;        // real (non-pad) tokens
  std::int64_t padded_tokens = 0;        // B * seq_len
  std::int64_t counted = 0;              // targets != -100

  std::int64_t tokens() const { return static_cast<std::int64_t>(ids.size()); }
  model::PackedBatch view() const;  // views into this object's vectors
};

class Batcher {
 public:
  Batcher(const std::vector<TokenizedExample>* data, std::uint64_t seed, int batch_size,
          std::int64_t seq_len, bool padding, std::int32_t pad_id);

  // Fills `out` with the next batch_size examples from `cursor` and advances it (wrapping into
  // the next epoch). `out` keeps its capacity between calls (no steady-state allocation).
  void next(DataCursor& cursor, MicroBatch& out);

  // The example at `index` of `epoch`'s order.
  std::int64_t example_at(std::int64_t epoch, std::int64_t index);

  std::int64_t max_tokens() const { return std::int64_t(batch_size_) * seq_len_; }

 private:
  const std::vector<TokenizedExample>* data_;
  std::uint64_t seed_;
  int batch_size_;
  std::int64_t seq_len_;
  bool padding_;
  std::int32_t pad_id_;
  std::int64_t order_epoch_ = -1;
  std::vector<std::int64_t> order_;
};

}  // namespace ferry::train
