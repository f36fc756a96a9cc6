// SPDX-License-Identifier: Apache-2.0
#include "serve/device_weights.h"

#include <cstring>
#include <map>
#include <vector>

namespace ferry::serve {

Result<std::unique_ptr<DeviceWeights>> DeviceWeights::create(
    const model::DecoderGeometry& geo, const model::ModelParams& host, bool with_experts,
    DType expert_dtype, mem::TransferEngine& te, mem::Stream& stream, mem::MemoryBudget* shared) {
  if (expert_dtype != DType::kF32 && expert_dtype != DType::kBF16) {
    return invalid_argument("serve: device experts in f32 or bf16, not {}",
                            to_string(expert_dtype));
  }
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  w->params_ = host;
  // Every view to upload, once per distinct host address (tied embeddings share one), with the
  // dtype it gets on the device.
  std::vector<ConstTensorView*> views;
  std::map<const ConstTensorView*, DType> to;
  auto add = [&](ConstTensorView& v, DType dt = DType::kF32) {
    if (v.data == nullptr) return;
    views.push_back(&v);
    to[&v] = dt;
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
          add(v, expert_dtype);
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
                                      std::size_t(v->numel()) * dtype_size(to.at(v))));
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
    if (!convert_elements(v->data, v->dtype, dst, to.at(v), std::size_t(v->numel()))) {
      return invalid_argument("serve: cannot convert a {} parameter to {}", to_string(v->dtype),
                              to_string(to.at(v)));
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
    v->dtype = to.at(v);
    v->device = Device::kCuda;
  }
  w->inv_freq_ = w->arena_.as<float>(rope);
  return w;
}

}  // namespace ferry::serve
