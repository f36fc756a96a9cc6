// SPDX-License-Identifier: Apache-2.0
#include "train/stream/device_optimizer_tail.h"

#include <array>
#include <vector>

#include "core/dtype.h"
#include "core/timer.h"
#include "kernels/cpu/hybrid_adamw.h"
#include "kernels/cpu/q8_code.h"
#include "mem/budget.h"

namespace ferry::train::stream {

namespace kc = kernels::cpu;
using Section = HostArena::Section;

namespace {

constexpr std::size_t kAlign = 256;
constexpr std::array<Section, 7> kSections = {
    Section::kWeights, Section::kMaster,  Section::kM,    Section::kV,
    Section::kMAbsmax, Section::kVAbsmax, Section::kGrads};

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Unit u's staging layout: each section's offset, then the f32 gradients (bf16 gradients are
// widened into them; f32 gradients are read where they landed).
struct Layout {
  std::array<std::size_t, kSections.size()> at{};
  std::size_t grad32 = 0;
  std::size_t total = 0;
};

Layout layout(const HostArena& arena, int u) {
  Layout l;
  std::size_t off = 0;
  for (std::size_t s = 0; s < kSections.size(); ++s) {
    l.at[s] = off;
    off += align_up(arena.section(u, kSections[s]).size);
  }
  l.grad32 = off;
  if (arena.bf16_grads()) off += align_up(static_cast<std::size_t>(arena.unit_elements(u)) * 4);
  l.total = off;
  return l;
}

std::size_t index_of(Section s) {
  for (std::size_t i = 0; i < kSections.size(); ++i) {
    if (kSections[i] == s) return i;
  }
  return 0;
}

}  // namespace

Status DeviceOptimizerTail::check(const HostArena& arena, int units) {
  const int layers = arena.globals_unit();
  if (units < 0 || units > layers) {
    return invalid_argument("train: --device-update-layers {} outside [0, {}] (the model's layers)",
                            units, layers);
  }
  if (arena.mode().master != MasterWeights::kF32) return {};
  for (int u = 0; u < units; ++u) {
    for (int idx : arena.unit_params(u)) {
      if (!arena.params()[static_cast<std::size_t>(idx)].q8) {
        return unimplemented(
            "train: --device-update-layers {}: layer {} has parameters with fp32 master + fp32 "
            "states, which have no device kernel; use 8-bit states for every parameter or a "
            "bf16 master",
            units, u);
      }
    }
  }
  return {};
}

std::size_t DeviceOptimizerTail::staging_bytes(const HostArena& arena, int units) {
  std::size_t most = 0;
  for (int u = 0; u < units && u < arena.globals_unit(); ++u) {
    most = std::max(most, layout(arena, u).total);
  }
  return most;
}

DeviceOptimizerTail::DeviceOptimizerTail(HostArena& arena, LayerOptimizer& opt, int units,
                                         kernels::Backend& backend, mem::TransferEngine& te,
                                         std::uint8_t* staging, std::size_t staging_size,
                                         mem::Stream& stream,
                                         std::function<Status(int)> before_unit)
    : arena_(arena),
      opt_(opt),
      units_(units),
      be_(backend),
      te_(te),
      staging_(staging),
      staging_size_(staging_size),
      stream_(stream),
      before_unit_(std::move(before_unit)) {
  FERRY_CHECK(staging_size_ >= staging_bytes(arena_, units_),
              "train: device optimizer staging of {} bytes, {} needed", staging_size_,
              staging_bytes(arena_, units_));
  stats_.unit_updates.assign(static_cast<std::size_t>(arena_.globals_unit()), 0);
  opt_.share_layers(units_);
  thread_ = std::thread([this] { run(); });
}

DeviceOptimizerTail::~DeviceOptimizerTail() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DeviceOptimizerTail::submit(const UpdateArgs& a) {
  {
    std::lock_guard lk(mu_);
    FERRY_CHECK(finished_ == submitted_, "train: device tail submitted before the last finished");
    args_ = a;
    ++submitted_;
  }
  cv_.notify_all();
}

Status DeviceOptimizerTail::wait() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return finished_ == submitted_; });
  return error_;
}

Status DeviceOptimizerTail::error() const {
  std::lock_guard lk(mu_);
  return error_;
}

DeviceTailStats DeviceOptimizerTail::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void DeviceOptimizerTail::run() {
  for (;;) {
    UpdateArgs a;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || submitted_ > finished_; });
      if (stop_) return;
      a = args_;
    }
    int taken = 0;
    Timer t;
    // Claims from the bottom until the CPU worker is met, K were taken, an error, or a stop.
    for (;;) {
      {
        std::lock_guard lk(mu_);
        if (stop_ || !error_.ok()) break;
      }
      const int u = opt_.claim_bottom();
      if (u < 0) break;
      DeviceTailStats d;  // this unit's counters, merged under the lock
      Status st = before_unit_ ? before_unit_(u) : Status{};
      if (st.ok()) st = run_unit(u, a, d);
      ++taken;
      {
        std::lock_guard lk(mu_);
        stats_.params_updated += d.params_updated;
        stats_.h2d_bytes += d.h2d_bytes;
        stats_.d2h_bytes += d.d2h_bytes;
        if (st.ok()) {
          ++stats_.units_updated;
          ++stats_.unit_updates[static_cast<std::size_t>(u)];
        } else if (error_.ok()) {
          error_ = st;  // before the unit is marked: whoever it wakes can see the error
        }
      }
      // Marked done even on failure: the forward's wait_ready(u) must not hang; the step failed.
      opt_.mark_bottom_done(u);
    }
    {
      std::lock_guard lk(mu_);
      ++stats_.steps;
      stats_.cpu_units += static_cast<std::uint64_t>(arena_.globals_unit() - taken);
      stats_.busy_s += t.elapsed_s();
      finished_ = submitted_;
    }
    cv_.notify_all();
  }
}

Status DeviceOptimizerTail::run_unit(int u, const UpdateArgs& a, DeviceTailStats& st) {
  mem::Stream& stream = stream_;
  const Layout l = layout(arena_, u);
  const OptimMode& mode = arena_.mode();
  const bool bf16 = arena_.bf16_master();
  const Device dev = be_.device();
  auto staged = [&](Section s) { return staging_ + l.at[index_of(s)]; };
  // Up: everything the kernels read. The weights only with a bf16 master (they are the master,
  // updated in place); an fp32 master's streaming copy is rewritten whole from the master.
  for (Section s : kSections) {
    if (s == Section::kWeights && !bf16) continue;
    const HostArena::Bytes b = arena_.section(u, s);
    if (b.size == 0) continue;
    FERRY_TRY(te_.h2d(staged(s), b.data, b.size, stream));
    st.h2d_bytes += b.size;
  }
  const std::int64_t n = arena_.unit_elements(u);
  float* g32 = reinterpret_cast<float*>(staged(Section::kGrads));
  if (arena_.bf16_grads()) {
    // Widened exactly (bf16 -> f32), the values update_range widens on the CPU.
    g32 = reinterpret_cast<float*>(staging_ + l.grad32);
    if (dev == Device::kCpu) {
      // The emulated tier: the copies above already landed (host streams); widened here, as
      // the CPU backend's convert would use the global pool, which is the compute thread's.
      const auto* g16 = reinterpret_cast<const std::uint16_t*>(staged(Section::kGrads));
      for (std::int64_t e = 0; e < n; ++e) g32[e] = bf16_to_f32(g16[e]);
    } else {
      FERRY_TRY(be_.convert(
          {.out = TensorView::contiguous(g32, DType::kF32, dev, {n}),
           .in = ConstTensorView::contiguous(staged(Section::kGrads), DType::kBF16, dev, {n})},
          stream));
    }
  }
  const kc::MasterKind mk = mode.master == MasterWeights::kF32         ? kc::MasterKind::kF32
                            : mode.master == MasterWeights::kBf16Kahan ? kc::MasterKind::kBf16Kahan
                                                                       : kc::MasterKind::kBf16Sr;
  auto* w16 = reinterpret_cast<std::uint16_t*>(staged(Section::kWeights));
  auto* master = reinterpret_cast<float*>(staged(Section::kMaster));
  auto* comp16 = reinterpret_cast<std::uint16_t*>(staged(Section::kMaster));
  std::uint8_t* m = staged(Section::kM);
  std::uint8_t* v = staged(Section::kV);
  auto* m_absmax = reinterpret_cast<float*>(staged(Section::kMAbsmax));
  auto* v_absmax = reinterpret_cast<float*>(staged(Section::kVAbsmax));
  // Per parameter, LayerOptimizer::update_range's arguments over the whole parameter.
  for (int idx : arena_.unit_params(u)) {
    const ParamLoc& p = arena_.params()[static_cast<std::size_t>(idx)];
    kernels::HybridAdamWArgs h;
    h.device = dev;
    h.master = mk;
    h.states = p.q8 ? kc::StateKind::kQ8 : kc::StateKind::kF32;
    h.k = kc::make_adamw_constants(a.lr, a.beta1, a.beta2, a.eps, p.decay ? a.weight_decay : 0.0f,
                                   a.grad_scale, a.step);
    kc::HybridAdamWSpan& s = h.span;
    s.n = p.n;
    s.grad = g32 + p.offset;
    if (bf16) {
      s.p16 = w16 + p.offset;
      if (mk == kc::MasterKind::kBf16Kahan) s.comp16 = comp16 + p.offset;
    } else {
      s.p32 = master + p.offset;
      s.p16 = arena_.bf16_weights() ? w16 + p.offset : nullptr;
    }
    if (p.q8) {
      s.m8 = m + p.state_offset;
      s.v8 = v + p.state_offset;
      s.m_absmax = m_absmax + p.block0;
      s.v_absmax = v_absmax + p.block0;
    } else {
      s.m32 = reinterpret_cast<float*>(m + p.state_offset);
      s.v32 = reinterpret_cast<float*>(v + p.state_offset);
    }
    s.index0 = 0;
    s.sr_key = kc::sr_key(a.sr_seed, a.step, static_cast<std::uint64_t>(p.index));
    FERRY_TRY(be_.hybrid_adamw(h, stream));
    ++st.params_updated;
  }
  // Back: every section the kernels wrote. An f32 streaming copy is the master's bytes.
  for (Section s : kSections) {
    if (s == Section::kGrads) continue;
    const HostArena::Bytes b = arena_.section(u, s);
    if (b.size == 0) continue;
    const std::uint8_t* src =
        s == Section::kWeights && !arena_.bf16_weights() ? staged(Section::kMaster) : staged(s);
    FERRY_TRY(te_.d2h(b.data, src, b.size, stream));
    st.d2h_bytes += b.size;
  }
  return stream.synchronize();
}

}  // namespace ferry::train::stream
