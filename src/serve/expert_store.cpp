// SPDX-License-Identifier: Apache-2.0
#include "serve/expert_store.h"

#include <cstring>

namespace ferry::serve {

Result<std::unique_ptr<ExpertStore>> ExpertStore::create(const model::DecoderGeometry& geo,
                                                         const model::ModelParams& params) {
  std::unique_ptr<ExpertStore> s(new ExpertStore());
  s->C_ = geo.hidden;
  s->F_ = geo.expert_width;
  s->E_ = geo.experts;
  s->layer_base_.assign(geo.layers, -1);
  for (int l = 0; l < geo.layers; ++l) {
    if (geo.layer_is_moe[l]) s->layer_base_[l] = std::int64_t(s->moe_layers_++) * s->E_;
  }
  if (s->moe_layers_ == 0) return s;
  const std::size_t n = std::size_t(s->moe_layers_) * s->E_ * s->expert_bytes();
  FERRY_ASSIGN_OR_RETURN(s->buffer_, mem::Buffer::allocate(mem::MemTier::kPinnedHost, n, s->budget_,
                                                           {.what = "expert host store"}));
  const std::size_t mat = std::size_t(s->F_) * s->C_;
  for (int l = 0; l < geo.layers; ++l) {
    if (!geo.layer_is_moe[l]) continue;
    const auto& lt = params.layers.at(l);
    if (static_cast<int>(lt.expert_gate.size()) != s->E_) {
      return invalid_argument("serve: layer {} has {} experts bound, geometry says {}", l,
                              lt.expert_gate.size(), s->E_);
    }
    for (int e = 0; e < s->E_; ++e) {
      const model::LayerTensors<ConstTensorView>& p = lt;
      for (const ConstTensorView* v : {&p.expert_gate[e], &p.expert_up[e], &p.expert_down[e]}) {
        if (v->dtype != DType::kF32 || std::size_t(v->numel()) != mat || !v->is_contiguous()) {
          return invalid_argument("serve: layer {} expert {}: expected contiguous f32 [{} x {}]", l,
                                  e, s->F_, s->C_);
        }
      }
      auto* dst = const_cast<float*>(s->block(l, e));
      std::memcpy(dst, p.expert_gate[e].data, mat * sizeof(float));
      std::memcpy(dst + mat, p.expert_up[e].data, mat * sizeof(float));
      std::memcpy(dst + 2 * mat, p.expert_down[e].data, mat * sizeof(float));
    }
  }
  return s;
}

const float* ExpertStore::block(int layer, int expert) const {
  FERRY_CHECK(layer >= 0 && layer < static_cast<int>(layer_base_.size()) &&
                  layer_base_[layer] >= 0 && expert >= 0 && expert < E_,
              "serve: no expert {} in layer {}", expert, layer);
  return reinterpret_cast<const float*>(buffer_.data()) +
         (layer_base_[layer] + expert) * std::int64_t(expert_floats());
}

ExpertRef ExpertStore::ref_in(const float* block) const {
  const std::size_t mat = std::size_t(F_) * C_;
  return {block, block + mat, block + 2 * mat};
}

}  // namespace ferry::serve
