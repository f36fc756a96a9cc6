// SPDX-License-Identifier: Apache-2.0
#include "train/stream/arena_layout.h"

#include "model/model_binding.h"
#include "train/optim/optim_state.h"
#include "train/train_state.h"

namespace ferry::train::stream {

std::size_t ArenaLayout::section_bytes(int u, ArenaSection s) const {
  const Unit& unit = units[static_cast<std::size_t>(u)];
  const auto n = static_cast<std::size_t>(unit.elements);
  switch (s) {
    case ArenaSection::kWeights:
      return n * (bf16_weights ? sizeof(std::uint16_t) : sizeof(float));
    case ArenaSection::kMaster:
      if (mode.master == MasterWeights::kF32) return n * sizeof(float);
      if (mode.master == MasterWeights::kBf16Kahan) return n * sizeof(std::uint16_t);
      return 0;
    case ArenaSection::kM:
    case ArenaSection::kV:
      return static_cast<std::size_t>(unit.state_bytes);
    case ArenaSection::kMAbsmax:
    case ArenaSection::kVAbsmax:
      return static_cast<std::size_t>(unit.blocks) * sizeof(float);
    case ArenaSection::kGrads:
      return n * grad_size();
  }
  return 0;
}

ArenaLayout arena_layout(const std::vector<model::ParamSpec>& specs, int layers,
                         const OptimMode& mode, bool bf16_compute, bool bf16_grads,
                         const std::vector<bool>& decay, const std::vector<bool>& q8) {
  ArenaLayout a;
  a.mode = mode;
  a.bf16_weights = bf16_compute || mode.master != MasterWeights::kF32;
  a.bf16_grads = bf16_grads;
  a.units.resize(static_cast<std::size_t>(layers) + 1);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const int u = specs[i].layer >= 0 ? specs[i].layer : layers;
    ArenaLayout::Unit& unit = a.units[static_cast<std::size_t>(u)];
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
    a.elements += p.n;
    a.params.push_back(p);
  }
  return a;
}

Result<ArenaLayout> arena_layout_for(const model::ModelConfig& config, const OptimMode& mode,
                                     bool bf16_compute, bool bf16_grads) {
  const std::vector<model::ParamSpec> specs = model::param_specs(config);
  FERRY_ASSIGN_OR_RETURN(const model::DecoderGeometry geo, model::make_geometry(config));
  std::vector<bool> decay, q8;
  for (const model::ParamSpec& p : specs) {
    decay.push_back(decays(p.hf_name));
    q8.push_back(mode.states == OptimizerStates::k8Bit);
  }
  return arena_layout(specs, geo.layers, mode, bf16_compute, bf16_grads, decay, q8);
}

}  // namespace ferry::train::stream
