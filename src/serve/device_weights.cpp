// SPDX-License-Identifier: Apache-2.0
#include "serve/device_weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "serve/dense_weights.h"

namespace ferry::serve {
namespace {
constexpr std::size_t kStageBytes = std::size_t(256) << 20;  // the host side of the upload
constexpr std::size_t kPieceAlign = 64;  // each piece's place in the staging buffer
}  // namespace

Result<std::unique_ptr<DeviceWeights>> DeviceWeights::create(
    const model::DecoderGeometry& geo, const model::ModelParams& host, bool with_experts,
    DType expert_dtype, DType dense_dtype, mem::TransferEngine& te, mem::Stream& stream,
    mem::MemoryBudget* shared, std::size_t stage_limit) {
  if (expert_dtype != DType::kF32 && expert_dtype != DType::kBF16) {
    return invalid_argument("serve: device experts in f32 or bf16, not {}",
                            to_string(expert_dtype));
  }
  if (dense_dtype != DType::kF32 && dense_dtype != DType::kBF16) {
    return invalid_argument("serve: device dense weights in f32 or bf16, not {}",
                            to_string(dense_dtype));
  }
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  w->params_ = host;
  // Every view to upload, once per distinct host address (tied embeddings share one), with the
  // dtype it gets on the device.
  std::vector<ConstTensorView*> views;
  std::map<const ConstTensorView*, DType> to;
  std::set<ConstTensorView*> linear;
  for_each_dense_linear(w->params_, [&](ConstTensorView& v) { linear.insert(&v); });
  auto add = [&](ConstTensorView& v, DType dt = DType::kF32) {
    if (v.data == nullptr) return;
    views.push_back(&v);
    to[&v] = linear.count(&v) != 0 ? dense_dtype : dt;
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
  // Converted on the host into a bounded pinned staging buffer, piece by piece in slot order, and
  // copied up whenever it is full (one copy per piece, one sync per fill), so the host never holds
  // a second copy of the model (resident Qwen3-30B-A3B: 58 GB of bf16 experts + 6 GB of f32
  // dense weights would double the host's peak). Same bytes in the arena as one whole-arena image.
  struct Source {
    const void* data;
    DType from, to;
    std::size_t numel, offset;  // offset: bytes from the arena's base
  };
  std::vector<Source> sources;
  std::set<const void*> listed;
  for (ConstTensorView* v : views) {
    if (!listed.insert(v->data).second) continue;  // tied embeddings: uploaded once
    sources.push_back({v->data, v->dtype, to.at(v), std::size_t(v->numel()),
                       plan.slot(slot_of.at(v->data)).offset_bytes});
  }
  if (!geo.rope.inv_freq.empty()) {
    sources.push_back({geo.rope.inv_freq.data(), DType::kF32, DType::kF32, geo.rope.inv_freq.size(),
                       plan.slot(rope).offset_bytes});
  }
  const std::size_t stage_bytes = std::max<std::size_t>(
      kPieceAlign, std::min(stage_limit > 0 ? stage_limit : kStageBytes, w->arena_.total_bytes()));
  mem::MemoryBudget stage_budget(mem::MemTier::kPinnedHost);
  FERRY_ASSIGN_OR_RETURN(mem::Buffer stage,
                         mem::Buffer::allocate(mem::MemTier::kPinnedHost, stage_bytes, stage_budget,
                                               {.what = "weight upload staging"}));
  std::size_t used = 0;
  auto flush = [&]() -> Status {
    if (used > 0) FERRY_TRY(stream.synchronize());
    used = 0;
    return ok_status();
  };
  for (const Source& s : sources) {
    const std::size_t in = dtype_size(s.from), out = dtype_size(s.to);
    for (std::size_t done = 0; done < s.numel;) {
      std::size_t at = (used + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
      if (at + out > stage_bytes) {
        FERRY_TRY(flush());
        at = 0;
      }
      const std::size_t n = std::min(s.numel - done, (stage_bytes - at) / out);
      std::byte* dst = stage.data() + at;
      if (!convert_elements(static_cast<const std::byte*>(s.data) + done * in, s.from, dst, s.to,
                            n)) {
        return invalid_argument("serve: cannot convert a {} parameter to {}", to_string(s.from),
                                to_string(s.to));
      }
      FERRY_TRY(te.h2d(w->arena_.base() + s.offset + done * out, dst, n * out, stream));
      used = at + n * out;
      done += n;
    }
  }
  FERRY_TRY(flush());
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
