// SPDX-License-Identifier: Apache-2.0
#include "train/optim/optim_state.h"

#include "kernels/cpu/q8_code.h"

namespace ferry::train {

std::int64_t q8_blocks(std::int64_t n) {
  return (n + kernels::cpu::q8::kBlock - 1) / kernels::cpu::q8::kBlock;
}

HybridOptimState HybridOptimState::create(const OptimMode& mode, std::uint64_t sr_seed,
                                          model::GradStorage& master, const std::vector<bool>& q8) {
  HybridOptimState h;
  h.mode = mode;
  h.sr_seed = sr_seed;
  h.params.resize(master.named.size());
  for (std::size_t i = 0; i < master.named.size(); ++i) {
    const TensorView& w = master.named[i].second;
    const auto n = static_cast<std::size_t>(w.numel());
    ParamOptimState& p = h.params[i];
    if (mode.master != MasterWeights::kF32) {
      float* f = w.as<float>();
      p.w16.resize(n);
      for (std::size_t k = 0; k < n; ++k) {
        p.w16[k] = f32_to_bf16(f[k]);
        f[k] = bf16_to_f32(p.w16[k]);
      }
      if (mode.master == MasterWeights::kBf16Kahan) p.comp16.assign(n, 0);
    }
    if (mode.states == OptimizerStates::k8Bit && (q8.empty() || q8[i])) {
      const auto blocks = static_cast<std::size_t>(q8_blocks(w.numel()));
      p.m8.assign(n, 0);
      p.v8.assign(n, 0);
      p.m_absmax.assign(blocks, 0.0f);
      p.v_absmax.assign(blocks, 0.0f);
    }
  }
  return h;
}

bool HybridOptimState::any_f32_states() const {
  for (const ParamOptimState& p : params) {
    if (!p.q8()) return true;
  }
  return false;
}

void HybridOptimState::refresh_compute_view(model::GradStorage& master) const {
  if (mode.master == MasterWeights::kF32) return;
  for (std::size_t i = 0; i < params.size(); ++i) {
    float* f = master.named[i].second.as<float>();
    const std::vector<std::uint16_t>& w = params[i].w16;
    for (std::size_t k = 0; k < w.size(); ++k) f[k] = bf16_to_f32(w[k]);
  }
}

}  // namespace ferry::train
