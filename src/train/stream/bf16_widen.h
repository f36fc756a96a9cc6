// SPDX-License-Identifier: Apache-2.0
// bf16 streaming weights landing in an f32 device buffer. With a bf16 master the arena's weights
// are bf16 and that is what crosses the link (2 bytes/param); compute reads f32, so the copy is
// widened on the device side. Widening is exact (bf16 -> f32 appends zero bits), so compute sees
// the same values wherever it runs — the CPU executor's and the GPU executor's weights are equal.
//   - emulated tier (CPU compute): the bf16 bytes land in the upper half of the f32 buffer and the
//     host widens them in place, front to back. In place is safe sequentially: element k's f32
//     (bytes 4k..4k+3) only overwrites bf16 elements <= k, and element k is read before it is
//     written. No extra memory.
//   - GPU: a parallel kernel cannot widen in place (threads would overwrite bf16 values others
//     still read), so the bytes land in a bf16 staging buffer (planned in the device tier,
//     DevicePlan::stage16) and the backend's convert kernel widens them into the f32 buffer on the
//     copying stream, in stream order: the next copy into the staging buffer on the same stream
//     starts only after the previous widen has read it. Callers never use one staging buffer from
//     two streams at once (stream_executor.cpp: the globals land before the weight thread starts).
#pragma once

#include <cstdint>

#include "core/result.h"
#include "kernels/backend.h"
#include "mem/transfer_engine.h"

namespace ferry::train::stream {

// Where the bf16 copy of n elements lands inside an f32 buffer of n elements (emulated tier).
inline std::uint16_t* bf16_staging(float* dst, std::int64_t n) {
  return reinterpret_cast<std::uint16_t*>(dst) + n;
}

// Widens the n bf16 values at bf16_staging(dst, n) into dst[0..n).
void widen_bf16_in_place(float* dst, std::int64_t n);

class Bf16Landing {
 public:
  // staging: a device buffer of `capacity` bf16 values (GPU backends); ignored on the CPU.
  Bf16Landing(kernels::Backend& be, std::uint16_t* staging, std::int64_t capacity)
      : be_(be), staging_(staging), capacity_(capacity) {}

  // Copies n bf16 values from host `src` into dst[0..n) as f32, on `stream`. On the emulated tier
  // it returns with dst written; on a GPU both the copy and the widen are enqueued on `stream`.
  Status land(float* dst, const std::uint16_t* src, std::int64_t n, mem::TransferEngine& te,
              mem::Stream& stream) const;

 private:
  kernels::Backend& be_;
  std::uint16_t* staging_;
  std::int64_t capacity_;
};

}  // namespace ferry::train::stream
