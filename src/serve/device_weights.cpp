// SPDX-License-Identifier: Apache-2.0
#include "serve/device_weights.h"

#include <cstring>
#include <map>
#include <vector>

namespace ferry::serve {

Result<std::unique_ptr<DeviceWeights>> DeviceWeights::create(
    const model::DecoderGeometry& geo, const model::ModelParams& host, bool with_experts,
    mem::TransferEngine& te, mem::Stream& stream, mem::MemoryBudget* shared) {
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  w->params_ = host;
  // Every view to upload, once per distinct host address (tied embeddings share one).
  std::vector<ConstTensorView*> views;
  auto add = [&](ConstTensorView& v) {
    if (v.data != nullptr) views.push_back(&v);
  };
  add(w->params_.embed);
  add(w->params_.final_norm);
  add(w->params_.lm_head);
  for (auto& l : w->params_.layers) {
    for (ConstTensorView* v :
         {&l.attn_norm, &l.q, &l.k, &l.v, &l.o, &l.q_bias, &l.k_bias, &l.v_bias, &l.o_bias,
          &l.q_norm, &l.k_norm, &l.mlp_norm, &l.gate, &l.up, &l.down, &l.router}) {
      add(*v);
    }
    for (auto* list : {&l.expert_gate, &l.expert_up, &l.expert_down}) {
      for (ConstTensorView& v : *list) {
        if (with_experts) {
          add(v);
        } else {
          v = ConstTensorView{};  // read from slots / staging / the host store instead
        }
      }
    }
  }
  mem::ArenaPlan plan;
  std::map<const void*, mem::SlotId> slot_of;
  for (ConstTensorView* v : views) {
    if (slot_of.count(v->data) != 0) continue;
    if (!v->is_contiguous()) return invalid_argument("serve: a non-contiguous parameter view");
    slot_of.emplace(v->data, plan.add(fmt::format("param{}", slot_of.size()),
                                      std::size_t(v->numel()) * sizeof(float)));
  }
  const mem::SlotId rope =
      plan.add("rope inv_freq", std::max<std::size_t>(1, geo.rope.inv_freq.size()) * sizeof(float));
  const std::string_view what = with_experts ? "weights" : "dense weights";
  FERRY_ASSIGN_OR_RETURN(w->charge_, BudgetCharge::take(shared, plan.allocation_bytes(), what));
  FERRY_ASSIGN_OR_RETURN(w->arena_,
                         mem::make_arena(plan, mem::MemTier::kDevice, w->budget_, {.what = what}));
  // Staged on the host in the arena's layout (slot offsets from its base), then one copy.
  std::vector<std::byte> staging(w->arena_.total_bytes());
  for (ConstTensorView* v : views) {
    std::byte* dst = staging.data() + plan.slot(slot_of.at(v->data)).offset_bytes;
    if (!convert_elements(v->data, v->dtype, dst, DType::kF32, std::size_t(v->numel()))) {
      return invalid_argument("serve: cannot convert a {} parameter to f32", to_string(v->dtype));
    }
  }
  if (!geo.rope.inv_freq.empty()) {
    std::memcpy(staging.data() + plan.slot(rope).offset_bytes, geo.rope.inv_freq.data(),
                geo.rope.inv_freq.size() * sizeof(float));
  }
  FERRY_TRY(te.h2d(w->arena_.base(), staging.data(), staging.size(), stream));
  FERRY_TRY(stream.synchronize());
  std::map<const void*, const void*> device_of;
  for (const auto& [src, id] : slot_of) device_of.emplace(src, w->arena_.data(id));
  for (ConstTensorView* v : views) {
    v->data = device_of.at(v->data);
    v->dtype = DType::kF32;
    v->device = Device::kCuda;
  }
  w->inv_freq_ = w->arena_.as<float>(rope);
  return w;
}

}  // namespace ferry::serve
