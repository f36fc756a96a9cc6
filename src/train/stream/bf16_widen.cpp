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

}  // namespace ferry::train::stream
