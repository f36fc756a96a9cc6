// SPDX-License-Identifier: Apache-2.0
#include "train/stream/resident_layers.h"

#include <algorithm>

#include "core/check.h"
#include "train/stream/device_optimizer_tail.h"

namespace ferry::train::stream {

namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

int ResidentLayers::resolve(const ArenaLayout& arena, int k) {
  return k == kResidentAllLayers ? arena.globals_unit() : k;
}

Status ResidentLayers::check(const HostArena& arena, int k_in) {
  const int L = arena.globals_unit();
  const int k = resolve(arena, k_in);
  if (k < 0 || k > L) {
    return invalid_argument(
        "train: --resident-layers {} outside [0, {}] (the model's layers), all "
        "or auto",
        k_in, L);
  }
  if (arena.mode().master != MasterWeights::kF32) return {};
  for (int u = 0; u < k; ++u) {
    for (int idx : arena.unit_params(u)) {
      if (!arena.params()[static_cast<std::size_t>(idx)].q8) {
        return unimplemented(
            "train: --resident-layers {}: layer {} has parameters with fp32 master + fp32 states, "
            "which have no device kernel; use 8-bit states for every parameter or a bf16 master",
            k_in, u);
      }
    }
  }
  return {};
}

ResidentLayers::Layout ResidentLayers::layout(const ArenaLayout& arena, int u, bool views) {
  using S = ArenaSection;
  Layout l;
  const ArenaLayout::Unit& unit = arena.units[static_cast<std::size_t>(u)];
  const auto n = static_cast<std::size_t>(unit.elements);
  l.size[kW16] = arena.bf16_weights ? arena.section_bytes(u, S::kWeights) : 0;
  l.size[kMaster] = arena.section_bytes(u, S::kMaster);
  l.size[kM] = arena.section_bytes(u, S::kM);
  l.size[kV] = arena.section_bytes(u, S::kV);
  l.size[kMAbs] = arena.section_bytes(u, S::kMAbsmax);
  l.size[kVAbs] = arena.section_bytes(u, S::kVAbsmax);
  l.size[kG32] = n * sizeof(float);
  if (arena.bf16_weights) {
    std::int64_t f32 = static_cast<std::int64_t>(n);
    if (views) {
      std::vector<bool> gemm;
      std::vector<std::int64_t> numel;
      for (int idx : unit.params) {
        gemm.push_back(arena.params[static_cast<std::size_t>(idx)].gemm_weight);
        numel.push_back(arena.params[static_cast<std::size_t>(idx)].n);
      }
      f32 = bf16_view_f32_elements(gemm, numel);
    }
    l.size[kW32] = static_cast<std::size_t>(f32) * sizeof(float);
  }
  std::size_t off = 0;
  for (int p = 0; p < kPieces; ++p) {
    l.at[p] = off;
    off += align_up(l.size[p]);
  }
  l.total = off;
  return l;
}

std::size_t ResidentLayers::layer_bytes(const ArenaLayout& arena, int u, bool views) {
  return layout(arena, u, views).total;
}

std::size_t ResidentLayers::scratch_bytes(const ArenaLayout& arena, int k) {
  if (!arena.bf16_grads) return 0;
  k = std::min(resolve(arena, k), arena.globals_unit());
  std::int64_t most = 0;
  for (int u = 0; u < k; ++u)
    most = std::max(most, arena.units[static_cast<std::size_t>(u)].elements);
  return align_up(static_cast<std::size_t>(most) * sizeof(std::uint16_t));
}

std::size_t ResidentLayers::bytes(const ArenaLayout& arena, int k, bool views) {
  k = std::min(resolve(arena, k), arena.globals_unit());
  std::size_t total = 0;
  for (int u = 0; u < k; ++u) total += layer_bytes(arena, u, views);
  return total + scratch_bytes(arena, k);
}

Result<std::unique_ptr<ResidentLayers>> ResidentLayers::create(const HostArena& arena, int k,
                                                               kernels::Backend& backend,
                                                               std::uint8_t* base, std::size_t size,
                                                               const Bf16ViewLanding* views) {
  FERRY_TRY(check(arena, k));
  k = resolve(arena, k);
  const bool v = views != nullptr;
  FERRY_CHECK(size >= bytes(arena.layout(), k, v), "train: resident layers in {} bytes, {} needed",
              size, bytes(arena.layout(), k, v));
  std::unique_ptr<ResidentLayers> r(new ResidentLayers(arena, backend, views));
  r->k_ = k;
  r->stats_.layers = k;
  std::size_t off = 0;
  for (int u = 0; u < k; ++u) {
    r->layouts_.push_back(layout(arena.layout(), u, v));
    r->base_.push_back(base + off);
    off += r->layouts_.back().total;
  }
  if (arena.bf16_grads() && k > 0) r->g16_ = reinterpret_cast<std::uint16_t*>(base + off);
  return r;
}

const float* ResidentLayers::weights_f32(int u) const {
  return reinterpret_cast<const float*>(arena_.bf16_weights() ? piece(u, kW32) : piece(u, kMaster));
}

const std::uint16_t* ResidentLayers::weights16(int u) const {
  return reinterpret_cast<const std::uint16_t*>(piece(u, kW16));
}

float* ResidentLayers::grads(int u) const { return reinterpret_cast<float*>(piece(u, kG32)); }

std::uint16_t* ResidentLayers::grads16() const { return g16_; }

Status ResidentLayers::widen(int u, mem::Stream& stream) {
  if (!arena_.bf16_weights()) return {};
  auto* w32 = reinterpret_cast<float*>(piece(u, kW32));
  const auto* w16 = reinterpret_cast<const std::uint16_t*>(piece(u, kW16));
  if (views_ != nullptr) return views_->widen(w32, w16, u, stream);
  const std::int64_t n = arena_.unit_elements(u);
  const Device d = be_.device();
  return be_.convert({.out = TensorView::contiguous(w32, DType::kF32, d, {n}),
                      .in = ConstTensorView::contiguous(w16, DType::kBF16, d, {n})},
                     stream);
}

Status ResidentLayers::upload(mem::TransferEngine& te, mem::Stream& stream) {
  using S = HostArena::Section;
  for (int u = 0; u < k_; ++u) {
    const std::pair<Piece, S> pieces[] = {{kW16, S::kWeights},  {kMaster, S::kMaster},
                                          {kM, S::kM},          {kV, S::kV},
                                          {kMAbs, S::kMAbsmax}, {kVAbs, S::kVAbsmax}};
    for (const auto& [p, s] : pieces) {
      const std::size_t n = layouts_[static_cast<std::size_t>(u)].size[p];
      if (n == 0) continue;
      const HostArena::Bytes b = arena_.section(u, s);
      FERRY_CHECK(b.size == n, "train: resident layer {} piece {}: {} bytes, the arena {}", u,
                  static_cast<int>(p), n, b.size);
      FERRY_TRY(te.h2d(piece(u, p), b.data, n, stream));
      stats_.h2d_bytes += n;
    }
    FERRY_TRY(widen(u, stream));
  }
  return stream.synchronize();
}

Status ResidentLayers::download(mem::TransferEngine& te, mem::Stream& stream) {
  using S = HostArena::Section;
  for (int u = 0; u < k_; ++u) {
    // The streaming weights: w16, or an f32 master's f32 copy (the master's bytes).
    const HostArena::Bytes w = arena_.section(u, S::kWeights);
    const Piece wp = arena_.bf16_weights() ? kW16 : kMaster;
    FERRY_TRY(te.d2h(w.data, piece(u, wp), w.size, stream));
    stats_.d2h_bytes += w.size;
    const std::pair<Piece, S> pieces[] = {{kMaster, S::kMaster},
                                          {kM, S::kM},
                                          {kV, S::kV},
                                          {kMAbs, S::kMAbsmax},
                                          {kVAbs, S::kVAbsmax}};
    for (const auto& [p, s] : pieces) {
      const std::size_t n = layouts_[static_cast<std::size_t>(u)].size[p];
      if (n == 0) continue;
      FERRY_TRY(te.d2h(arena_.section(u, s).data, piece(u, p), n, stream));
      stats_.d2h_bytes += n;
    }
  }
  ++stats_.downloads;
  return stream.synchronize();
}

Status ResidentLayers::update(const UpdateArgs& a, mem::Stream& stream) {
  for (int u = 0; u < k_; ++u) {
    const DeviceOptimizerTail::UnitSections at{.weights = piece(u, kW16),
                                               .master = piece(u, kMaster),
                                               .m = piece(u, kM),
                                               .v = piece(u, kV),
                                               .m_absmax = piece(u, kMAbs),
                                               .v_absmax = piece(u, kVAbs)};
    const float* g = grads(u);
    // bf16 gradients: g32 already holds their widening (rounded back after every micro-batch).
    auto grads_of = [&](const ParamLoc& p) -> Result<const float*> { return g + p.offset; };
    FERRY_TRY(DeviceOptimizerTail::update_unit(arena_, be_, u, at, grads_of, a, stream,
                                               &stats_.params_updated));
    FERRY_TRY(widen(u, stream));
    ++stats_.updates;
  }
  return {};
}

}  // namespace ferry::train::stream
