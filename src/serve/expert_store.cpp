// SPDX-License-Identifier: Apache-2.0
#include "serve/expert_store.h"

#include <cstring>

#include "core/thread_pool.h"

namespace ferry::serve {

Result<std::unique_ptr<ExpertStore>> ExpertStore::allocate(const model::DecoderGeometry& geo,
                                                           DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return invalid_argument("serve: experts can be stored in f32 or bf16, not {}",
                            to_string(dtype));
  }
  std::unique_ptr<ExpertStore> s(new ExpertStore());
  s->dtype_ = dtype;
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
  return s;
}

Result<std::unique_ptr<ExpertStore>> ExpertStore::create(const model::DecoderGeometry& geo,
                                                         const model::ModelParams& params,
                                                         DType dtype) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<ExpertStore> s, allocate(geo, dtype));
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
      auto* dst = const_cast<std::byte*>(s->block(l, e));
      const std::size_t part = mat * dtype_size(dtype);
      int i = 0;
      for (const ConstTensorView* v : {&p.expert_gate[e], &p.expert_up[e], &p.expert_down[e]}) {
        if ((v->dtype != DType::kF32 && v->dtype != DType::kBF16) ||
            std::size_t(v->numel()) != mat || !v->is_contiguous()) {
          return invalid_argument(
              "serve: layer {} expert {}: expected contiguous f32 or bf16 [{} x {}], got {}", l, e,
              s->F_, s->C_, to_string(v->dtype));
        }
        // Same conversion as DeviceWeights' resident experts (core convert_elements), so every
        // mode reads the same bits.
        FERRY_CHECK(convert_elements(v->data, v->dtype, dst + part * i++, dtype, mat),
                    "serve: {} -> {} conversion", to_string(v->dtype), to_string(dtype));
      }
    }
  }
  return s;
}

Result<std::unique_ptr<ExpertStore>> ExpertStore::create_filled(const model::DecoderGeometry& geo,
                                                                DType dtype, const BlockFill& fill,
                                                                int threads) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<ExpertStore> s, allocate(geo, dtype));
  std::vector<std::pair<int, int>> blocks;  // (layer, expert), in store order
  for (int l = 0; l < geo.layers; ++l) {
    if (!geo.layer_is_moe[l]) continue;
    for (int e = 0; e < s->E_; ++e) blocks.emplace_back(l, e);
  }
  // Blocks are handed out one at a time (a few MB each), so the threads stay busy to the end.
  parallel_items(blocks.size(), threads, [&](std::size_t j) {
    const auto [l, e] = blocks[j];
    fill(l, e, const_cast<std::byte*>(s->block(l, e)));
  });
  return s;
}

const std::byte* ExpertStore::block(int layer, int expert) const {
  FERRY_CHECK(layer >= 0 && layer < static_cast<int>(layer_base_.size()) &&
                  layer_base_[layer] >= 0 && expert >= 0 && expert < E_,
              "serve: no expert {} in layer {}", expert, layer);
  return buffer_.data() + (layer_base_[layer] + expert) * std::int64_t(expert_bytes());
}

ExpertRef ExpertStore::ref_in(const void* block) const {
  const auto* b = static_cast<const std::byte*>(block);
  const std::size_t part = std::size_t(F_) * std::size_t(C_) * dtype_size(dtype_);
  return {b, b + part, b + 2 * part, dtype_};
}

}  // namespace ferry::serve
