// SPDX-License-Identifier: Apache-2.0
#include "train/stream/device_optimizer_tail.h"

#include <algorithm>
#include <array>
#include <deque>
#include <string>
#include <vector>

#include <fmt/format.h>

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

// Unit u's layout in a staging slot: each section's offset (bf16 gradients are widened per
// parameter into the shared widening buffer; f32 gradients are read where they landed).
struct Layout {
  std::array<std::size_t, kSections.size()> at{};
  std::size_t total = 0;
};

Layout layout(const ArenaLayout& arena, int u) {
  Layout l;
  std::size_t off = 0;
  for (std::size_t s = 0; s < kSections.size(); ++s) {
    l.at[s] = off;
    off += align_up(arena.section_bytes(u, kSections[s]));
  }
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

int DeviceOptimizerTail::resolve_units(const ArenaLayout& arena, int units, int first) {
  return units == kDeviceUpdateAllLayers ? arena.globals_unit() - first : units;
}

Status DeviceOptimizerTail::check(const HostArena& arena, int units_in, int slots, int first) {
  const int layers = arena.globals_unit() - first;
  const int units = resolve_units(arena, units_in, first);
  if (units < 0 || units > layers) {
    return invalid_argument(
        "train: --device-update-layers {} outside [0, {}] (the model's layers{}) or all", units_in,
        layers, first > 0 ? fmt::format(" not GPU-resident: {} are", first) : std::string());
  }
  if (units > 0 && (slots < 1 || slots > kMaxDeviceUpdateSlots)) {
    return invalid_argument("train: --device-update-slots {} outside [1, {}]", slots,
                            kMaxDeviceUpdateSlots);
  }
  if (arena.mode().master != MasterWeights::kF32) return {};
  for (int u = first; u < first + units; ++u) {
    for (int idx : arena.unit_params(u)) {
      if (!arena.params()[static_cast<std::size_t>(idx)].q8) {
        return unimplemented(
            "train: --device-update-layers {}: layer {} has parameters with fp32 master + fp32 "
            "states, which have no device kernel; use 8-bit states for every parameter or a "
            "bf16 master",
            units_in, u);
      }
    }
  }
  return {};
}

std::size_t DeviceOptimizerTail::slot_bytes(const ArenaLayout& arena, int units, int first) {
  const int end = std::min(first + resolve_units(arena, units, first), arena.globals_unit());
  std::size_t most = 0;
  for (int u = first; u < end; ++u) most = std::max(most, layout(arena, u).total);
  return most;
}

std::size_t DeviceOptimizerTail::widen_bytes(const ArenaLayout& arena, int units, int first) {
  if (!arena.bf16_grads) return 0;
  const int end = std::min(first + resolve_units(arena, units, first), arena.globals_unit());
  std::int64_t most = 0;
  for (int u = first; u < end; ++u) {
    for (int idx : arena.units[static_cast<std::size_t>(u)].params) {
      most = std::max(most, arena.params[static_cast<std::size_t>(idx)].n);
    }
  }
  return align_up(static_cast<std::size_t>(most) * sizeof(float));
}

std::size_t DeviceOptimizerTail::staging_bytes(const ArenaLayout& arena, int units, int slots,
                                               int first) {
  if (resolve_units(arena, units, first) <= 0 || slots <= 0) return 0;
  return static_cast<std::size_t>(slots) * slot_bytes(arena, units, first) +
         widen_bytes(arena, units, first);
}

Result<std::unique_ptr<DeviceOptimizerTail>> DeviceOptimizerTail::create(
    HostArena& arena, LayerOptimizer& opt, int units, int slots, kernels::Backend& backend,
    mem::TransferEngine& te, std::uint8_t* staging, std::size_t staging_size,
    mem::StreamSet& streams, std::function<Status(int)> before_unit,
    std::function<Status(int)> before_prestage, int first) {
  FERRY_TRY(check(arena, units, slots, first));
  units = resolve_units(arena, units, first);
  FERRY_CHECK(staging_size >= staging_bytes(arena.layout(), units, slots, first),
              "train: device optimizer staging of {} bytes, {} needed", staging_size,
              staging_bytes(arena.layout(), units, slots, first));
  std::unique_ptr<DeviceOptimizerTail> t(
      new DeviceOptimizerTail(arena, opt, units, backend, te, streams, std::move(before_unit)));
  t->first_ = first;
  const std::size_t per = slot_bytes(arena.layout(), units, first);
  const bool timing = backend.device() != Device::kCpu;
  t->slots_.resize(static_cast<std::size_t>(slots));
  for (int s = 0; s < slots; ++s) {
    Slot& sl = t->slots_[static_cast<std::size_t>(s)];
    sl.base = staging + static_cast<std::size_t>(s) * per;
    for (mem::Event* e : {&sl.up_start, &sl.up_done, &sl.kernels_start, &sl.kernels_done,
                          &sl.down_start, &sl.down_done}) {
      FERRY_ASSIGN_OR_RETURN(*e,
                             mem::Event::create(streams.device(), streams.device_index(), timing));
    }
  }
  if (arena.bf16_grads()) t->widen_ = staging + static_cast<std::size_t>(slots) * per;
  t->before_prestage_ = std::move(before_prestage);
  t->stats_.slots = slots;
  t->stats_.unit_updates.assign(static_cast<std::size_t>(arena.globals_unit()), 0);
  opt.share_layers(units, first);
  t->thread_ = std::thread([p = t.get()] { p->run(); });
  return t;
}

DeviceOptimizerTail::DeviceOptimizerTail(HostArena& arena, LayerOptimizer& opt, int units,
                                         kernels::Backend& backend, mem::TransferEngine& te,
                                         mem::StreamSet& streams,
                                         std::function<Status(int)> before_unit)
    : arena_(arena),
      opt_(opt),
      units_(units),
      be_(backend),
      te_(te),
      streams_(streams),
      before_unit_(std::move(before_unit)) {}

DeviceOptimizerTail::~DeviceOptimizerTail() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DeviceOptimizerTail::prestage() {
  {
    std::lock_guard lk(mu_);
    ++prestage_asked_;
    drop_ = false;  // the new staging supersedes whatever drop_prestaged() dropped
  }
  cv_.notify_all();
}

void DeviceOptimizerTail::drop_prestaged() {
  std::lock_guard lk(mu_);
  drop_ = true;
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
  cv_.wait(lk, [&] { return finished_ == submitted_ && prestage_done_ == prestage_asked_; });
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
  const int nslots = static_cast<int>(slots_.size());
  for (;;) {
    UpdateArgs a;
    std::uint64_t pre = 0;  // the prestage() count being handled (0: none)
    bool drop = false;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk,
               [&] { return stop_ || prestage_done_ < prestage_asked_ || submitted_ > finished_; });
      if (stop_) return;
      // A prestage() is handled before a later submit(): the executor's wait() (finish_step)
      // waits for it, so the copies are queued — on the emulated tier done — before the CPU
      // worker starts the next update (the arena is read while no one writes it).
      if (prestage_done_ < prestage_asked_) pre = prestage_asked_;
      drop = drop_;
      drop_ = false;
      a = args_;
    }
    if (pre > 0) {
      Status st = run_prestage();
      if (!st.ok()) {
        (void)streams_.synchronize();  // nothing of it still in flight
        for (Slot& sl : slots_) sl.staged = -1;
      }
      {
        std::lock_guard lk(mu_);
        if (!st.ok() && error_.ok()) error_ = std::move(st);
        prestage_done_ = pre;
      }
      cv_.notify_all();
      continue;
    }
    if (drop) {
      for (Slot& sl : slots_) sl.staged = -1;
    }
    int taken = 0;
    Timer t;
    std::deque<InFlight> flight;  // claimed, queued, not yet marked; oldest first
    std::vector<int> free_slots;
    for (int s = nslots - 1; s >= 0; --s) free_slots.push_back(s);
    // The unit is over (its work done, or failed with the tail's streams idle): counters, the
    // error before the mark (whoever the mark wakes can see it), the mark, the slot back.
    auto retire = [&](InFlight& f, const Status& st) {
      {
        std::lock_guard lk(mu_);
        stats_.params_updated += f.d.params_updated;
        stats_.h2d_bytes += f.d.h2d_bytes;
        stats_.d2h_bytes += f.d.d2h_bytes;
        stats_.prestage_hits += f.d.prestage_hits;
        if (st.ok()) {
          ++stats_.units_updated;
          ++stats_.unit_updates[static_cast<std::size_t>(f.unit)];
          stats_.unit_s += f.d.unit_s;
          stats_.unit_h2d_s += f.d.unit_h2d_s;
          stats_.unit_kernel_s += f.d.unit_kernel_s;
          stats_.unit_d2h_s += f.d.unit_d2h_s;
        } else if (error_.ok()) {
          error_ = st;
        }
      }
      // Marked done even on failure: the forward's wait_ready(u) must not hang; the step failed.
      opt_.mark_bottom_done(f.unit);
      free_slots.push_back(f.slot);
    };
    bool claiming = true;
    for (;;) {
      // Claims from the bottom while a slot is free, until the CPU worker is met, K were taken,
      // an error, or a stop.
      while (claiming && !free_slots.empty()) {
        {
          std::lock_guard lk(mu_);
          if (stop_ || !error_.ok()) break;
        }
        const int u = opt_.claim_bottom();
        if (u < 0) {
          claiming = false;
          break;
        }
        ++taken;
        InFlight f{.unit = u, .slot = pick_slot(u, free_slots)};
        Status st = before_unit_ ? before_unit_(u) : Status{};
        if (st.ok()) st = enqueue(f, a);
        if (st.ok()) {
          flight.push_back(std::move(f));
          continue;
        }
        // Part of the unit may be queued: nothing of it may write the arena once it is marked.
        (void)streams_.synchronize();
        retire(f, st);
        claiming = false;
      }
      if (flight.empty()) break;
      InFlight f = std::move(flight.front());
      flight.pop_front();
      const Status st = finish(f);
      if (!st.ok()) (void)streams_.synchronize();
      retire(f, st);
    }
    // Stagings of units the CPU worker took are stale now (it updated them in the arena).
    for (Slot& sl : slots_) sl.staged = -1;
    {
      std::lock_guard lk(mu_);
      ++stats_.steps;
      stats_.cpu_units += static_cast<std::uint64_t>(arena_.globals_unit() - first_ - taken);
      stats_.busy_s += t.elapsed_s();
      finished_ = submitted_;
    }
    cv_.notify_all();
  }
}

int DeviceOptimizerTail::pick_slot(int u, std::vector<int>& free) {
  auto take = [&](std::size_t i) {
    const int s = free[i];
    free.erase(free.begin() + static_cast<std::ptrdiff_t>(i));
    return s;
  };
  for (std::size_t i = 0; i < free.size(); ++i) {
    if (slots_[static_cast<std::size_t>(free[i])].staged == u) return take(i);
  }
  // Without a staging of u: the lowest-numbered slot without a staging (the back of the stack).
  for (std::size_t i = free.size(); i-- > 0;) {
    if (slots_[static_cast<std::size_t>(free[i])].staged < 0) return take(i);
  }
  // Every free slot holds another unit's staging: the claims go up from the lowest layer and the
  // staged units are the lowest, so those units went to the CPU worker — dropped.
  const int s = take(free.size() - 1);
  slots_[static_cast<std::size_t>(s)].staged = -1;
  return s;
}

// Units 0, 1, ... (the tail's first claims) into slots 0, 1, ...: every section but the
// gradients, on the tail's h2d stream after the slot's last D2H (device order; the host synced it
// when that unit was marked). The unit's later upload (enqueue) follows on the same stream from
// the same thread, so its up_done event covers these copies too: the kernels never read a staged
// section before it landed.
Status DeviceOptimizerTail::run_prestage() {
  {
    std::lock_guard lk(mu_);
    if (!error_.ok()) return {};  // the tail claims nothing more
  }
  mem::Stream& up = streams_.h2d();
  const int n = std::min(static_cast<int>(slots_.size()), units_);
  for (int s = 0; s < n; ++s) {
    Slot& slot = slots_[static_cast<std::size_t>(s)];
    slot.staged = -1;
    const int u = first_ + s;
    if (before_prestage_) FERRY_TRY(before_prestage_(u));
    const Layout l = layout(arena_.layout(), u);
    FERRY_TRY(up.wait(slot.down_done));
    std::uint64_t bytes = 0;
    for (Section sec : kSections) {
      if (sec == Section::kGrads || !uploaded(sec)) continue;
      const HostArena::Bytes b = arena_.section(u, sec);
      if (b.size == 0) continue;
      FERRY_TRY(te_.h2d(slot.base + l.at[index_of(sec)], b.data, b.size, up));
      bytes += b.size;
    }
    slot.staged = u;
    std::lock_guard lk(mu_);
    ++stats_.prestaged_units;
    stats_.prestaged_bytes += bytes;
  }
  return {};
}

Status DeviceOptimizerTail::enqueue(InFlight& f, const UpdateArgs& a) {
  const int u = f.unit;
  Slot& slot = slots_[static_cast<std::size_t>(f.slot)];
  mem::Stream& up = streams_.h2d();
  mem::Stream& cs = streams_.compute();
  mem::Stream& down = streams_.d2h();
  const Layout l = layout(arena_.layout(), u);
  const Device dev = be_.device();
  const bool emulated = dev == Device::kCpu;  // host streams: each call below runs at once
  DeviceTailStats& st = f.d;
  auto staged = [&](Section s) { return slot.base + l.at[index_of(s)]; };
  Timer unit_t, phase;
  // Up: everything the kernels read, once the slot's previous unit has left (its D2H). The
  // weights only with a bf16 master (they are the master, updated in place); an fp32 master's
  // streaming copy is rewritten whole from the master. A unit pre-staged in this slot (pick_slot
  // gave it its own) sends only its gradients: the rest went up earlier on this stream.
  const bool prestaged = slot.staged == u;
  slot.staged = -1;  // consumed
  if (prestaged) ++st.prestage_hits;
  FERRY_TRY(up.wait(slot.down_done));
  FERRY_TRY(slot.up_start.record(up));
  for (Section s : kSections) {
    if (!uploaded(s)) continue;
    const HostArena::Bytes b = arena_.section(u, s);
    if (b.size == 0) continue;
    st.h2d_bytes += b.size;
    if (prestaged && s != Section::kGrads) continue;
    FERRY_TRY(te_.h2d(staged(s), b.data, b.size, up));
  }
  FERRY_TRY(slot.up_done.record(up));
  if (emulated) st.unit_h2d_s = phase.elapsed_s();
  phase.reset();
  // The kernels, on the compute stream once the sections landed.
  FERRY_TRY(cs.wait(slot.up_done));
  FERRY_TRY(slot.kernels_start.record(cs));
  UnitSections at{.weights = staged(Section::kWeights),
                  .master = staged(Section::kMaster),
                  .m = staged(Section::kM),
                  .v = staged(Section::kV),
                  .m_absmax = staged(Section::kMAbsmax),
                  .v_absmax = staged(Section::kVAbsmax)};
  std::uint8_t* grads = staged(Section::kGrads);
  auto grads_of = [&](const ParamLoc& p) -> Result<const float*> {
    if (!arena_.bf16_grads()) return reinterpret_cast<const float*>(grads) + p.offset;
    // Widened exactly (bf16 -> f32), the values update_range widens on the CPU, into the one
    // widening buffer: the previous parameter's kernel read it before, in compute-stream order.
    const auto* g16 = reinterpret_cast<const std::uint16_t*>(grads) + p.offset;
    auto* w = reinterpret_cast<float*>(widen_);
    if (emulated) {
      // The copies above already landed; the CPU backend's convert would use the global pool,
      // which is the compute thread's.
      for (std::int64_t e = 0; e < p.n; ++e) w[e] = bf16_to_f32(g16[e]);
    } else {
      FERRY_TRY(be_.convert({.out = TensorView::contiguous(w, DType::kF32, dev, {p.n}),
                             .in = ConstTensorView::contiguous(g16, DType::kBF16, dev, {p.n})},
                            cs));
    }
    return static_cast<const float*>(w);
  };
  FERRY_TRY(update_unit(arena_, be_, u, at, grads_of, a, cs, &st.params_updated));
  FERRY_TRY(slot.kernels_done.record(cs));
  if (emulated) st.unit_kernel_s = phase.elapsed_s();
  phase.reset();
  // Back, on the d2h stream once the kernels ran: every section the kernels wrote. An f32
  // streaming copy is the master's bytes.
  FERRY_TRY(down.wait(slot.kernels_done));
  FERRY_TRY(slot.down_start.record(down));
  for (Section s : kSections) {
    if (s == Section::kGrads) continue;
    const HostArena::Bytes b = arena_.section(u, s);
    if (b.size == 0) continue;
    const std::uint8_t* src =
        s == Section::kWeights && !arena_.bf16_weights() ? staged(Section::kMaster) : staged(s);
    FERRY_TRY(te_.d2h(b.data, src, b.size, down));
    st.d2h_bytes += b.size;
  }
  FERRY_TRY(slot.down_done.record(down));
  if (emulated) {
    st.unit_d2h_s = phase.elapsed_s();
    st.unit_s = unit_t.elapsed_s();
  }
  return {};
}

Status DeviceOptimizerTail::update_unit(
    const HostArena& arena, kernels::Backend& backend, int u, const UnitSections& at,
    const std::function<Result<const float*>(const ParamLoc& p)>& grads, const UpdateArgs& a,
    mem::Stream& stream, std::uint64_t* params_updated) {
  const OptimMode& mode = arena.mode();
  const bool bf16 = arena.bf16_master();
  const kc::MasterKind mk = mode.master == MasterWeights::kF32         ? kc::MasterKind::kF32
                            : mode.master == MasterWeights::kBf16Kahan ? kc::MasterKind::kBf16Kahan
                                                                       : kc::MasterKind::kBf16Sr;
  auto* w16 = reinterpret_cast<std::uint16_t*>(at.weights);
  auto* master = reinterpret_cast<float*>(at.master);
  auto* comp16 = reinterpret_cast<std::uint16_t*>(at.master);
  auto* m_absmax = reinterpret_cast<float*>(at.m_absmax);
  auto* v_absmax = reinterpret_cast<float*>(at.v_absmax);
  // Per parameter, LayerOptimizer::update_range's arguments over the whole parameter.
  for (int idx : arena.unit_params(u)) {
    const ParamLoc& p = arena.params()[static_cast<std::size_t>(idx)];
    FERRY_ASSIGN_OR_RETURN(const float* g32, grads(p));
    kernels::HybridAdamWArgs h;
    h.device = backend.device();
    h.master = mk;
    h.states = p.q8 ? kc::StateKind::kQ8 : kc::StateKind::kF32;
    h.k = kc::make_adamw_constants(a.lr, a.beta1, a.beta2, a.eps, p.decay ? a.weight_decay : 0.0f,
                                   a.grad_scale, a.step);
    kc::HybridAdamWSpan& s = h.span;
    s.n = p.n;
    s.grad = g32;
    if (bf16) {
      s.p16 = w16 + p.offset;
      if (mk == kc::MasterKind::kBf16Kahan) s.comp16 = comp16 + p.offset;
    } else {
      s.p32 = master + p.offset;
      s.p16 = arena.bf16_weights() ? w16 + p.offset : nullptr;
    }
    if (p.q8) {
      s.m8 = at.m + p.state_offset;
      s.v8 = at.v + p.state_offset;
      s.m_absmax = m_absmax + p.block0;
      s.v_absmax = v_absmax + p.block0;
    } else {
      s.m32 = reinterpret_cast<float*>(at.m + p.state_offset);
      s.v32 = reinterpret_cast<float*>(at.v + p.state_offset);
    }
    s.index0 = 0;
    s.sr_key = kc::sr_key(a.sr_seed, a.step, static_cast<std::uint64_t>(p.index));
    FERRY_TRY(backend.hybrid_adamw(h, stream));
    ++*params_updated;
  }
  return {};
}

Status DeviceOptimizerTail::finish(InFlight& f) {
  const Slot& slot = slots_[static_cast<std::size_t>(f.slot)];
  FERRY_TRY(slot.down_done.synchronize());
  if (be_.device() == Device::kCpu) return {};
  // Every event of the unit completed (down_done follows all of them through the waits).
  auto ms = [](const mem::Event& from, const mem::Event& to) -> Result<double> {
    FERRY_ASSIGN_OR_RETURN(const float v, mem::Event::elapsed_ms(from, to));
    return static_cast<double>(v) * 1e-3;
  };
  FERRY_ASSIGN_OR_RETURN(f.d.unit_s, ms(slot.up_start, slot.down_done));
  FERRY_ASSIGN_OR_RETURN(f.d.unit_h2d_s, ms(slot.up_start, slot.up_done));
  FERRY_ASSIGN_OR_RETURN(f.d.unit_kernel_s, ms(slot.kernels_start, slot.kernels_done));
  FERRY_ASSIGN_OR_RETURN(f.d.unit_d2h_s, ms(slot.down_start, slot.down_done));
  return {};
}

}  // namespace ferry::train::stream
