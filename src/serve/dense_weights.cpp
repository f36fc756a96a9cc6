// SPDX-License-Identifier: Apache-2.0
#include "serve/dense_weights.h"

#include <algorithm>
#include <map>
#include <set>

namespace ferry::serve {

std::size_t dense_weight_bytes(const model::ModelParams& p, DType dense_dtype) {
  model::ModelParams copy = p;
  std::set<const void*> linear;
  for_each_dense_linear(copy, [&](ConstTensorView& v) {
    if (v.data != nullptr) linear.insert(v.data);
  });
  std::set<const void*> seen;
  std::size_t bytes = 0;
  auto add = [&](const ConstTensorView& v) {
    if (v.data == nullptr || !seen.insert(v.data).second) return;
    const DType dt = linear.count(v.data) != 0 ? dense_dtype : DType::kF32;
    bytes += std::size_t(v.numel()) * dtype_size(dt);
  };
  add(p.embed);
  add(p.final_norm);
  add(p.lm_head);
  for (const auto& l : p.layers) {
    for (const ConstTensorView* v :
         {&l.attn_norm, &l.q, &l.k, &l.v, &l.o, &l.q_bias, &l.k_bias, &l.v_bias, &l.o_bias,
          &l.q_norm, &l.k_norm, &l.mlp_norm, &l.gate, &l.up, &l.down, &l.router}) {
      add(*v);
    }
  }
  return bytes;
}

std::int64_t max_dense_linear_numel(const model::ModelParams& p, bool without_lm_head) {
  model::ModelParams copy = p;
  copy.embed = ConstTensorView{};
  if (without_lm_head) copy.lm_head = ConstTensorView{};
  std::int64_t mx = 0;
  for_each_dense_linear(copy, [&](ConstTensorView& v) {
    if (v.data != nullptr) mx = std::max(mx, v.numel());
  });
  return mx;
}

Result<std::unique_ptr<HostDenseWeights>> HostDenseWeights::create(const model::ModelParams& host,
                                                                   DType dense_dtype) {
  if (dense_dtype != DType::kBF16) {
    return invalid_argument("serve: host dense weights are a bf16 copy, not {}",
                            to_string(dense_dtype));
  }
  std::unique_ptr<HostDenseWeights> w(new HostDenseWeights());
  w->params_ = host;
  // Each distinct tensor once (tied embeddings share one), in listing order.
  std::map<const void*, std::size_t> offset_of;
  std::vector<ConstTensorView*> views;
  std::size_t total = 0;
  Status bad = ok_status();
  for_each_dense_linear(w->params_, [&](ConstTensorView& v) {
    if (v.data == nullptr) return;
    if (!v.is_contiguous()) bad = invalid_argument("serve: a non-contiguous dense weight view");
    views.push_back(&v);
    if (offset_of.emplace(v.data, total).second) {
      // 64-byte aligned pieces (the data vector itself is new'd: 16-byte aligned at least).
      total += (std::size_t(v.numel()) * dtype_size(dense_dtype) + 63) / 64 * 64;
    }
  });
  FERRY_TRY(bad);
  w->data_.resize(total);
  std::set<const void*> done;
  for (ConstTensorView* v : views) {
    std::byte* dst = w->data_.data() + offset_of.at(v->data);
    if (done.insert(v->data).second &&
        !convert_elements(v->data, v->dtype, dst, dense_dtype, std::size_t(v->numel()))) {
      return invalid_argument("serve: cannot convert a {} dense weight to {}", to_string(v->dtype),
                              to_string(dense_dtype));
    }
  }
  // Repointed after every conversion: tied views share a source address until then.
  for (ConstTensorView* v : views) {
    v->data = w->data_.data() + offset_of.at(v->data);
    v->dtype = dense_dtype;
  }
  return w;
}

}  // namespace ferry::serve
