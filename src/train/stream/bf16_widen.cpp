// SPDX-License-Identifier: Apache-2.0
#include "train/stream/bf16_widen.h"

#include <algorithm>
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

std::int64_t bf16_view_f32_elements(const std::vector<bool>& gemm_weight,
                                    const std::vector<std::int64_t>& numel) {
  std::int64_t offset = 0, f32 = 0;
  for (std::size_t k = 0; k < numel.size(); ++k) {
    if (!bf16_view_param(gemm_weight[k], offset)) f32 += numel[k];
    offset += numel[k];
  }
  return f32;
}

Bf16ViewLanding::Bf16ViewLanding(kernels::Backend& be, const HostArena& arena) : be_(be) {
  const int L = arena.globals_unit();
  f32_offset_.assign(arena.params().size(), -1);
  runs_.resize(static_cast<std::size_t>(L));
  std::vector<std::int64_t> used(static_cast<std::size_t>(L), 0);
  for (std::size_t k = 0; k < arena.params().size(); ++k) {
    const ParamLoc& p = arena.params()[k];
    if (p.unit == L || bf16_view_param(p.gemm_weight, p.offset)) continue;
    std::int64_t& to = used[static_cast<std::size_t>(p.unit)];
    f32_offset_[k] = to;
    std::vector<Run>& runs = runs_[static_cast<std::size_t>(p.unit)];
    if (!runs.empty() && runs.back().from + runs.back().n == p.offset) {
      runs.back().n += p.n;  // the previous parameter of this layer, contiguous in both
    } else {
      runs.push_back({.from = p.offset, .to = to, .n = p.n});
    }
    to += p.n;
  }
  for (std::int64_t n : used) max_f32_ = std::max(max_f32_, n);
}

std::int64_t Bf16ViewLanding::widened_elements(int layer) const {
  std::int64_t n = 0;
  for (const Run& r : runs_[static_cast<std::size_t>(layer)]) n += r.n;
  return n;
}

Status Bf16ViewLanding::land(float* slot, std::uint16_t* twin, int layer, const std::uint16_t* src,
                             std::int64_t n, mem::TransferEngine& te, mem::Stream& stream) const {
  FERRY_TRY(te.h2d(twin, src, static_cast<std::size_t>(n) * sizeof(std::uint16_t), stream));
  return widen(slot, twin, layer, stream);
}

Status Bf16ViewLanding::widen(float* slot, const std::uint16_t* twin, int layer,
                              mem::Stream& stream) const {
  const Device d = be_.device();
  for (const Run& r : runs_[static_cast<std::size_t>(layer)]) {
    FERRY_TRY(
        be_.convert({.out = TensorView::contiguous(slot + r.to, DType::kF32, d, {r.n}),
                     .in = ConstTensorView::contiguous(twin + r.from, DType::kBF16, d, {r.n})},
                    stream));
  }
  return {};
}

}  // namespace ferry::train::stream
