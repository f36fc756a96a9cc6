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
  FERRY_ASSIGN_OR_RETURN(auto a, allocate(specs, s.geometry.layers, s.optim.mode, s.bf16_weights(),
                                          s.bf16_grads, s.decay, q8, tier));
  FERRY_TRY(a->load_from(s));
  return a;
}

Result<std::unique_ptr<HostArena>> HostArena::create_initialized(
    const model::ModelConfig& config, const OptimMode& mode, mem::MemTier tier,
    const std::function<void(std::size_t, float*)>& init, bool bf16_compute, bool bf16_grads) {
  const std::vector<model::ParamSpec> specs = model::param_specs(config);
  FERRY_ASSIGN_OR_RETURN(const model::DecoderGeometry geo, model::make_geometry(config));
  std::vector<bool> decay, q8;
  for (const model::ParamSpec& p : specs) {
    decay.push_back(decays(p.hf_name));
    q8.push_back(mode.states == OptimizerStates::k8Bit);
  }
  Timer alloc;
  FERRY_ASSIGN_OR_RETURN(
      auto a, allocate(specs, geo.layers, mode, bf16_compute, bf16_grads, decay, q8, tier));
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
      if (mode_.master == MasterWeights::kBf16Kahan) zero.push_back(unit.master);
      if (unit.blocks > 0) zero.insert(zero.end(), {unit.m_absmax, unit.v_absmax});
      for (mem::SlotId id : zero) std::memset(arena_.data(id), 0, plan.slot(id).size_bytes);
    }
  });
  setup_times_.zero_s = phase.elapsed_s();
  std::vector<float> tmp;
  for (const ParamLoc& p : params_) {
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

Result<std::unique_ptr<HostArena>> HostArena::allocate(const std::vector<model::ParamSpec>& specs,
                                                       int layers, const OptimMode& mode,
                                                       bool bf16_weights, bool bf16_grads,
                                                       const std::vector<bool>& decay,
                                                       const std::vector<bool>& q8,
                                                       mem::MemTier tier) {
  std::unique_ptr<HostArena> a(new HostArena(tier));
  a->mode_ = mode;
  a->bf16_weights_ = bf16_weights || mode.master != MasterWeights::kF32;
  a->bf16_grads_ = bf16_grads;
  const int L = layers;
  a->units_.resize(static_cast<std::size_t>(L) + 1);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const int u = specs[i].layer >= 0 ? specs[i].layer : L;
    Unit& unit = a->units_[u];
    ParamLoc p;
    p.index = static_cast<int>(i);
    p.unit = u;
    p.n = specs[i].numel();
    p.offset = unit.elements;
    p.block0 = unit.blocks;
    p.decay = decay[i];
    p.q8 = q8[i];
    p.gemm_weight = model::is_gemm_weight_role(specs[i].role);
    p.state_offset = unit.state_bytes;
    unit.elements += p.n;
    if (p.q8) unit.blocks += q8_blocks(p.n);
    // Each parameter's f32 states start 4-byte aligned (8-bit runs before them may be odd).
    unit.state_bytes += p.q8 ? p.n : 4 * p.n;
    if (!p.q8 && p.state_offset % 4 != 0) {
      const std::int64_t pad = 4 - p.state_offset % 4;
      p.state_offset += pad;
      unit.state_bytes += pad;
    }
    unit.params.push_back(p.index);
    a->elements_ += p.n;
    a->params_.push_back(p);
  }
  const bool bf16 = a->bf16_master();
  const bool w16 = a->bf16_weights();
  mem::ArenaPlan plan;
  for (int u = 0; u <= L; ++u) {
    Unit& unit = a->units_[u];
    const std::size_t f32 = static_cast<std::size_t>(unit.elements) * sizeof(float);
    const std::string pre = u < L ? "layer" + std::to_string(u) : std::string("globals");
    const std::size_t b16 = static_cast<std::size_t>(unit.elements) * sizeof(std::uint16_t);
    unit.weights = plan.add(pre + ".weights", w16 ? b16 : f32, kPage);
    if (!bf16) {
      unit.master = plan.add(pre + ".master", f32, kPage);
    } else if (a->mode_.master == MasterWeights::kBf16Kahan) {
      unit.master = plan.add(pre + ".kahan", b16, kPage);
    }
    const auto state = static_cast<std::size_t>(unit.state_bytes);
    unit.m = plan.add(pre + ".m", state, kPage);
    unit.v = plan.add(pre + ".v", state, kPage);
    if (unit.blocks > 0) {
      const std::size_t scales = static_cast<std::size_t>(unit.blocks) * sizeof(float);
      unit.m_absmax = plan.add(pre + ".m_absmax", scales, kPage);
      unit.v_absmax = plan.add(pre + ".v_absmax", scales, kPage);
    }
    unit.grads = plan.add(pre + ".grads", bf16_grads ? b16 : f32, kPage);
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
  if (bf16_weights_) {
    std::uint16_t* w = w16(p.unit) + p.offset;
    for (std::int64_t k = 0; k < p.n; ++k) w[k] = f32_to_bf16(m[k]);
  } else {
    std::memcpy(weights(p.unit) + p.offset, m, static_cast<std::size_t>(p.n) * sizeof(float));
  }
}

std::int64_t HostArena::max_layer_elements() const {
  std::int64_t m = 0;
  for (int u = 0; u + 1 < num_units(); ++u) m = std::max(m, units_[u].elements);
  return m;
}

HostArena::Bytes HostArena::section(int u, Section s) const {
  const Unit& unit = units_[static_cast<std::size_t>(u)];
  const auto n = static_cast<std::size_t>(unit.elements);
  const auto state = static_cast<std::size_t>(unit.state_bytes);
  const std::size_t scales = static_cast<std::size_t>(unit.blocks) * sizeof(float);
  auto at = [&](mem::SlotId id, std::size_t bytes) {
    return bytes == 0 ? Bytes{} : Bytes{arena_.as<std::uint8_t>(id), bytes};
  };
  switch (s) {
    case Section::kWeights:
      return at(unit.weights, unit_weight_bytes(u));
    case Section::kMaster:
      if (mode_.master == MasterWeights::kF32) return at(unit.master, n * sizeof(float));
      if (mode_.master == MasterWeights::kBf16Kahan) return at(unit.master, n * 2);
      return {};
    case Section::kM:
      return at(unit.m, state);
    case Section::kV:
      return at(unit.v, state);
    case Section::kMAbsmax:
      return at(unit.m_absmax, scales);
    case Section::kVAbsmax:
      return at(unit.v_absmax, scales);
    case Section::kGrads:
      return at(unit.grads, n * grad_size());
  }
  return {};
}

std::size_t HostArena::unit_weight_bytes(int u) const {
  return static_cast<std::size_t>(units_[u].elements) *
         (bf16_weights() ? sizeof(std::uint16_t) : sizeof(float));
}

Status HostArena::check_layout(const TrainState& s) const {
  if (s.optim.mode != mode_) {
    return invalid_argument("train: state mode {} differs from the arena's {}",
                            describe(s.optim.mode), describe(mode_));
  }
  if (s.bf16_grads != bf16_grads_) {
    return invalid_argument("train: the state keeps {} gradients, the arena {}",
                            s.bf16_grads ? "bf16" : "f32", bf16_grads_ ? "bf16" : "f32");
  }
  if (s.bf16_weights() != bf16_weights_) {
    return invalid_argument("train: the state computes with {} weights, the arena streams {}",
                            s.bf16_weights() ? "bf16" : "f32", bf16_weights_ ? "bf16" : "f32");
  }
  for (const ParamLoc& p : params_) {
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
  for (const ParamLoc& p : params_) {
    const std::size_t bytes = static_cast<std::size_t>(p.n) * sizeof(float);
    const ParamOptimState& st = s.optim.params[p.index];
    if (bf16_master()) {
      const std::size_t b16 = static_cast<std::size_t>(p.n) * sizeof(std::uint16_t);
      std::memcpy(w16(p.unit) + p.offset, st.w16.data(), b16);
      if (mode_.master == MasterWeights::kBf16Kahan) {
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
  for (const ParamLoc& p : params_) {
    const std::size_t bytes = static_cast<std::size_t>(p.n) * sizeof(float);
    ParamOptimState& st = s.optim.params[p.index];
    if (bf16_master()) {
      const std::size_t b16 = static_cast<std::size_t>(p.n) * sizeof(std::uint16_t);
      std::memcpy(st.w16.data(), w16(p.unit) + p.offset, b16);
      if (mode_.master == MasterWeights::kBf16Kahan) {
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
