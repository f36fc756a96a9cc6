// SPDX-License-Identifier: Apache-2.0
#include "train/stream/host_arena.h"

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "model/model_binding.h"
#include "model/model_compute.h"
#include "model/param_spec.h"
#include "train/optim/optim_state.h"

namespace ferry::train::stream {

namespace {
constexpr std::size_t kPage = 4096;
}

Result<std::unique_ptr<HostArena>> HostArena::create(const TrainState& s, mem::MemTier tier) {
  const std::vector<model::ParamSpec> specs = model::param_specs(s.config);
  if (specs.size() != s.num_params()) {
    return internal_error("train: {} param specs for {} parameters", specs.size(), s.num_params());
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].numel() != s.master->named[i].second.numel()) {
      return internal_error("train: parameter {} has {} elements, its spec {}",
                            s.master->named[i].first, s.master->named[i].second.numel(),
                            specs[i].numel());
    }
  }
  std::vector<bool> q8(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) q8[i] = s.optim.params[i].q8();
  FERRY_ASSIGN_OR_RETURN(auto a, allocate(arena_layout(specs, s.geometry.layers, s.optim.mode,
                                                       s.bf16_weights(), s.bf16_grads, s.decay, q8),
                                          tier));
  FERRY_TRY(a->load_from(s));
  return a;
}

Result<std::unique_ptr<HostArena>> HostArena::create_initialized(
    const model::ModelConfig& config, const OptimMode& mode, mem::MemTier tier,
    const std::function<void(std::size_t, float*)>& init, bool bf16_compute, bool bf16_grads) {
  // Every parameter's states 8-bit in 8bit mode, weight decay by name (arena_layout_for).
  FERRY_ASSIGN_OR_RETURN(ArenaLayout layout,
                         arena_layout_for(config, mode, bf16_compute, bf16_grads));
  Timer alloc;
  FERRY_ASSIGN_OR_RETURN(auto a, allocate(std::move(layout), tier));
  const double allocate_s = alloc.elapsed_s();
  a->reinitialize(init);
  a->setup_times_.allocate_s = allocate_s;
  return a;
}

void HostArena::reinitialize(const std::function<void(std::size_t, float*)>& init) {
  // Zero everything but the weights, unit by unit in parallel (tens of GB at bench sizes).
  setup_times_ = {};
  Timer phase;
  const mem::ArenaPlan& plan = arena_.plan();
  ThreadPool::global().parallel_for(units_.size(), [&](std::size_t u0, std::size_t u1) {
    for (std::size_t u = u0; u < u1; ++u) {
      const Unit& unit = units_[u];
      std::vector<mem::SlotId> zero = {unit.m, unit.v, unit.grads};
      if (layout_.mode.master == MasterWeights::kBf16Kahan) zero.push_back(unit.master);
      if (layout_.units[u].blocks > 0) zero.insert(zero.end(), {unit.m_absmax, unit.v_absmax});
      for (mem::SlotId id : zero) std::memset(arena_.data(id), 0, plan.slot(id).size_bytes);
    }
  });
  setup_times_.zero_s = phase.elapsed_s();
  std::vector<float> tmp;
  for (const ParamLoc& p : layout_.params) {
    if (bf16_master()) {
      tmp.resize(static_cast<std::size_t>(p.n));
      phase.reset();
      init(static_cast<std::size_t>(p.index), tmp.data());
      setup_times_.init_s += phase.elapsed_s();
      phase.reset();
      // The rounding of billions of weights (a 3B bench arena) on every thread, not one.
      std::uint16_t* w = w16(p.unit) + p.offset;
      ThreadPool::global().parallel_for(
          static_cast<std::size_t>(p.n),
          [&](std::size_t k0, std::size_t k1) {
            for (std::size_t k = k0; k < k1; ++k) w[k] = f32_to_bf16(tmp[k]);
          },
          std::size_t{1} << 16);
      setup_times_.round_s += phase.elapsed_s();
    } else {
      float* m = master(p.unit) + p.offset;
      phase.reset();
      init(static_cast<std::size_t>(p.index), m);
      setup_times_.init_s += phase.elapsed_s();
      phase.reset();
      write_streaming_copy(p);
      setup_times_.round_s += phase.elapsed_s();
    }
  }
}

Result<std::unique_ptr<HostArena>> HostArena::allocate(ArenaLayout layout, mem::MemTier tier) {
  std::unique_ptr<HostArena> a(new HostArena(tier));
  a->layout_ = std::move(layout);
  const int L = a->layout_.globals_unit();
  a->units_.resize(static_cast<std::size_t>(L) + 1);
  // Every section's size is the layout's (ArenaLayout::section_bytes), each on its own page.
  using S = ArenaSection;
  const ArenaLayout& lay = a->layout_;
  mem::ArenaPlan plan;
  for (int u = 0; u <= L; ++u) {
    Unit& unit = a->units_[u];
    const std::string pre = u < L ? "layer" + std::to_string(u) : std::string("globals");
    unit.weights = plan.add(pre + ".weights", lay.section_bytes(u, S::kWeights), kPage);
    if (const std::size_t master = lay.section_bytes(u, S::kMaster); master > 0) {
      unit.master = plan.add(pre + (lay.bf16_master() ? ".kahan" : ".master"), master, kPage);
    }
    unit.m = plan.add(pre + ".m", lay.section_bytes(u, S::kM), kPage);
    unit.v = plan.add(pre + ".v", lay.section_bytes(u, S::kV), kPage);
    if (lay.units[static_cast<std::size_t>(u)].blocks > 0) {
      unit.m_absmax = plan.add(pre + ".m_absmax", lay.section_bytes(u, S::kMAbsmax), kPage);
      unit.v_absmax = plan.add(pre + ".v_absmax", lay.section_bytes(u, S::kVAbsmax), kPage);
    }
    unit.grads = plan.add(pre + ".grads", lay.section_bytes(u, S::kGrads), kPage);
  }
  const mem::LargeArenaPinning pin = mem::large_arena_pinned_mode();
  Result<mem::Arena> arena = mem::make_arena(plan, tier, a->budget_,
                                             {.pinned_mode = pin.mode, .what = "train host arena"});
  if (!arena.ok() && !pin.explicit_choice && pin.mode != mem::PinnedMode::kHostAlloc) {
    // The default (register) failed, e.g. where the driver refuses to register this much; the
    // older path may still pin it. FERRY_PINNED_MODE set by the user gets no second try.
    log::get("train")->warn("host arena: {}; trying cudaHostAlloc instead",
                            arena.status().message());
    arena =
        mem::make_arena(plan, tier, a->budget_,
                        {.pinned_mode = mem::PinnedMode::kHostAlloc, .what = "train host arena"});
  }
  if (!arena.ok()) return arena.status();
  a->arena_ = std::move(arena).value();
  return a;
}

void HostArena::write_streaming_copy(const ParamLoc& p) const {
  const float* m = master(p.unit) + p.offset;
  if (bf16_weights()) {
    std::uint16_t* w = w16(p.unit) + p.offset;
    for (std::int64_t k = 0; k < p.n; ++k) w[k] = f32_to_bf16(m[k]);
  } else {
    std::memcpy(weights(p.unit) + p.offset, m, static_cast<std::size_t>(p.n) * sizeof(float));
  }
}

std::int64_t HostArena::max_layer_elements() const {
  std::int64_t m = 0;
  for (int u = 0; u + 1 < num_units(); ++u) m = std::max(m, unit_elements(u));
  return m;
}

HostArena::Bytes HostArena::section(int u, Section s) const {
  const std::size_t bytes = layout_.section_bytes(u, s);
  if (bytes == 0) return {};  // absent: no master with bf16-sr, no scales without 8-bit states
  const Unit& unit = units_[static_cast<std::size_t>(u)];
  mem::SlotId id = unit.weights;
  switch (s) {
    case Section::kWeights:
      id = unit.weights;
      break;
    case Section::kMaster:
      id = unit.master;
      break;
    case Section::kM:
      id = unit.m;
      break;
    case Section::kV:
      id = unit.v;
      break;
    case Section::kMAbsmax:
      id = unit.m_absmax;
      break;
    case Section::kVAbsmax:
      id = unit.v_absmax;
      break;
    case Section::kGrads:
      id = unit.grads;
      break;
  }
  return Bytes{arena_.as<std::uint8_t>(id), bytes};
}

std::size_t HostArena::unit_weight_bytes(int u) const {
  return layout_.section_bytes(u, Section::kWeights);
}

Status HostArena::check_layout(const TrainState& s) const {
  if (s.optim.mode != layout_.mode) {
    return invalid_argument("train: state mode {} differs from the arena's {}",
                            describe(s.optim.mode), describe(layout_.mode));
  }
  if (s.bf16_grads != bf16_grads()) {
    return invalid_argument("train: the state keeps {} gradients, the arena {}",
                            s.bf16_grads ? "bf16" : "f32", bf16_grads() ? "bf16" : "f32");
  }
  if (s.bf16_weights() != bf16_weights()) {
    return invalid_argument("train: the state computes with {} weights, the arena streams {}",
                            s.bf16_weights() ? "bf16" : "f32", bf16_weights() ? "bf16" : "f32");
  }
  for (const ParamLoc& p : layout_.params) {
    if (s.optim.params[p.index].q8() != p.q8) {
      return invalid_argument("train: parameter {} has {} states in the state, {} in the arena",
                              s.master->named[p.index].first, p.q8 ? "fp32" : "8-bit",
                              p.q8 ? "8-bit" : "fp32");
    }
  }
  return {};
}

Status HostArena::load_from(const TrainState& s) {
  FERRY_TRY(check_layout(s));
  for (const ParamLoc& p : layout_.params) {
    const std::size_t bytes = static_cast<std::size_t>(p.n) * sizeof(float);
    const ParamOptimState& st = s.optim.params[p.index];
    if (bf16_master()) {
      const std::size_t b16 = static_cast<std::size_t>(p.n) * sizeof(std::uint16_t);
      std::memcpy(w16(p.unit) + p.offset, st.w16.data(), b16);
      if (layout_.mode.master == MasterWeights::kBf16Kahan) {
        std::memcpy(comp16(p.unit) + p.offset, st.comp16.data(), b16);
      }
    } else {
      const float* w = s.master->named[p.index].second.as<float>();
      std::memcpy(master(p.unit) + p.offset, w, bytes);
      write_streaming_copy(p);
    }
    std::memset(grad_bytes(p.unit) + p.offset * grad_size(), 0,
                static_cast<std::size_t>(p.n) * grad_size());
    if (p.q8) {
      std::memcpy(m8(p), st.m8.data(), static_cast<std::size_t>(p.n));
      std::memcpy(v8(p), st.v8.data(), static_cast<std::size_t>(p.n));
      std::memcpy(m_absmax(p), st.m_absmax.data(), st.m_absmax.size() * sizeof(float));
      std::memcpy(v_absmax(p), st.v_absmax.data(), st.v_absmax.size() * sizeof(float));
    } else {
      std::memcpy(m32(p), s.m->named[p.index].second.as<float>(), bytes);
      std::memcpy(v32(p), s.v->named[p.index].second.as<float>(), bytes);
    }
  }
  return {};
}

Status HostArena::store_to(TrainState& s) const {
  FERRY_TRY(check_layout(s));
  for (const ParamLoc& p : layout_.params) {
    const std::size_t bytes = static_cast<std::size_t>(p.n) * sizeof(float);
    ParamOptimState& st = s.optim.params[p.index];
    if (bf16_master()) {
      const std::size_t b16 = static_cast<std::size_t>(p.n) * sizeof(std::uint16_t);
      std::memcpy(st.w16.data(), w16(p.unit) + p.offset, b16);
      if (layout_.mode.master == MasterWeights::kBf16Kahan) {
        std::memcpy(st.comp16.data(), comp16(p.unit) + p.offset, b16);
      }
    } else {
      std::memcpy(s.master->named[p.index].second.data, master(p.unit) + p.offset, bytes);
    }
    if (p.q8) {
      std::memcpy(st.m8.data(), m8(p), static_cast<std::size_t>(p.n));
      std::memcpy(st.v8.data(), v8(p), static_cast<std::size_t>(p.n));
      std::memcpy(st.m_absmax.data(), m_absmax(p), st.m_absmax.size() * sizeof(float));
      std::memcpy(st.v_absmax.data(), v_absmax(p), st.v_absmax.size() * sizeof(float));
    } else {
      std::memcpy(s.m->named[p.index].second.data, m32(p), bytes);
      std::memcpy(s.v->named[p.index].second.data, v32(p), bytes);
    }
  }
  // TrainState's f32 master is the compute view of the bf16 weights (eval, export read it), or
  // its compute copy is the master's bf16 rounding.
  s.optim.refresh_compute_view(*s.master);
  s.refresh_compute();
  return {};
}

}  // namespace ferry::train::stream
