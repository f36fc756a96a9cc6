// SPDX-License-Identifier: Apache-2.0
#include "train/batcher.h"

#include <numeric>

#include "core/check.h"
#include "train/rng.h"

namespace ferry::train {

model::PackedBatch MicroBatch::view() const {
  const std::int64_t T = tokens();
  const std::int64_t S1 = static_cast<std::int64_t>(cu_seqlens.size());
  return model::PackedBatch{
      .ids = ConstTensorView::contiguous(ids.data(), DType::kI32, Device::kCpu, {T}),
      .positions = ConstTensorView::contiguous(positions.data(), DType::kI32, Device::kCpu, {T}),
      .cu_seqlens = ConstTensorView::contiguous(cu_seqlens.data(), DType::kI32, Device::kCpu, {S1}),
      .targets = ConstTensorView::contiguous(targets.data(), DType::kI32, Device::kCpu, {T})};
}

Batcher::Batcher(const std::vector<TokenizedExample>* data, std::uint64_t seed, int batch_size,
                 std::int64_t seq_len, bool padding, std::int32_t pad_id)
    : data_(data),
      seed_(seed),
      batch_size_(batch_size),
      seq_len_(seq_len),
      padding_(padding),
      pad_id_(pad_id) {
  FERRY_CHECK(data_ != nullptr && !data_->empty() && batch_size_ > 0 && seq_len_ > 0,
              "batcher: bad arguments");
}

std::int64_t Batcher::example_at(std::int64_t epoch, std::int64_t index) {
  if (order_epoch_ != epoch) {
    const std::int64_t n = static_cast<std::int64_t>(data_->size());
    order_.resize(static_cast<std::size_t>(n));
    std::iota(order_.begin(), order_.end(), 0);
    Rng rng(mix_seed(seed_, 0xDA7A0000ull + static_cast<std::uint64_t>(epoch)));
    for (std::int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates
      const auto j = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(i + 1)));
      std::swap(order_[i], order_[j]);
    }
    order_epoch_ = epoch;
  }
  return order_[static_cast<std::size_t>(index)];
}

void Batcher::next(DataCursor& cursor, MicroBatch& out) {
  out.ids.clear();
  out.positions.clear();
  out.targets.clear();
  out.cu_seqlens.assign(1, 0);
  out.useful_tokens = 0;
  out.counted = 0;
  out.padded_tokens = std::int64_t(batch_size_) * seq_len_;
  const std::int64_t n = static_cast<std::int64_t>(data_->size());
  for (int b = 0; b < batch_size_; ++b) {
    if (cursor.index >= n) {
      ++cursor.epoch;
      cursor.index = 0;
    }
    const TokenizedExample& ex =
        (*data_)[static_cast<std::size_t>(example_at(cursor.epoch, cursor.index))];
    ++cursor.index;
    const std::int64_t len = static_cast<std::int64_t>(ex.ids.size());
    FERRY_CHECK(len <= seq_len_, "batcher: example of {} tokens > seq_len {}", len, seq_len_);
    const std::int64_t slot = padding_ ? seq_len_ : len;
    for (std::int64_t t = 0; t < slot; ++t) {
      const bool real = t < len;
      out.ids.push_back(real ? ex.ids[t] : pad_id_);
      out.positions.push_back(static_cast<std::int32_t>(t));
      out.targets.push_back(real ? ex.targets[t] : kIgnoreTarget);
      out.counted += real && ex.targets[t] != kIgnoreTarget;
    }
    out.useful_tokens += len;
    out.cu_seqlens.push_back(static_cast<std::int32_t>(out.ids.size()));
  }
}

}  // namespace ferry::train
