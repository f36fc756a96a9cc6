// SPDX-License-Identifier: Apache-2.0
#include "train/stream/bf16_widen.h"

#include <cstring>

#include "core/dtype.h"

namespace ferry::train::stream {

void widen_bf16_in_place(float* dst, std::int64_t n) {
  const std::uint16_t* src = bf16_staging(dst, n);
  for (std::int64_t k = 0; k < n; ++k) {
    std::uint16_t h;
    std::memcpy(&h, src + k, sizeof(h));  // read before the write below may cover it
    const float f = bf16_to_f32(h);
    std::memcpy(dst + k, &f, sizeof(f));
  }
}

Status Bf16Landing::land(float* dst, const std::uint16_t* src, std::int64_t n,
                         mem::TransferEngine& te, mem::Stream& stream) const {
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(std::uint16_t);
  if (be_.device() == Device::kCpu) {
    FERRY_TRY(te.h2d(bf16_staging(dst, n), src, bytes, stream));
    FERRY_TRY(stream.synchronize());
    widen_bf16_in_place(dst, n);
    return {};
  }
  if (staging_ == nullptr || n > capacity_) {
    return internal_error("train: bf16 staging holds {} values, {} to land", capacity_, n);
  }
  FERRY_TRY(te.h2d(staging_, src, bytes, stream));
  const Device d = be_.device();
  return be_.convert({.out = TensorView::contiguous(dst, DType::kF32, d, {n}),
                      .in = ConstTensorView::contiguous(staging_, DType::kBF16, d, {n})},
                     stream);
}

}  // namespace ferry::train::stream
