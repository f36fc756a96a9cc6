// SPDX-License-Identifier: Apache-2.0
// The dense (non-expert) weights in the engine's dense dtype (EngineConfig::dense_dtype,
// docs/serve.md "bf16 dense weights"):
//   for_each_dense_linear  the one list of the views stored in that dtype: the embedding table,
//                          the lm_head and every layer's q, k, v, o, dense gate/up/down and router
//                          (norms, biases and routed experts keep their own dtype);
//   dense_weight_bytes     what the dense weights take in that dtype (each distinct tensor once:
//                          tied embeddings count once) — what the bench's sizing charges;
//   HostDenseWeights       the CPU engine's bf16 copy of those views (the CUDA engine's is
//                          DeviceWeights).
// Why bf16 storage keeps the f32 bits: widening bf16 -> f32 is exact, and every reader of a bf16
// view (the runners' GEMMs and embedding) computes exactly what the f32 path computes on the
// widened weight, so the engine's outputs are the f32 engine's on the weights rounded to bf16
// (round to nearest even, core convert_elements). Tested in tests/unit/serve/dense_dtype_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/result.h"
#include "model/model_compute.h"

namespace ferry::serve {

// Calls f(view) for every dense linear weight of `p` (present or not: f sees empty views too).
template <typename View, typename F>
void for_each_dense_linear(model::ModelTensors<View>& p, F&& f) {
  f(p.embed);
  f(p.lm_head);
  for (auto& l : p.layers) {
    for (View* v : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.router}) f(*v);
  }
}

// Bytes of every non-expert parameter of `p` with the dense linear weights in `dense_dtype` and
// the rest (norms, biases) in f32, each distinct tensor once; no alignment padding.
std::size_t dense_weight_bytes(const model::ModelParams& p, DType dense_dtype);

// The largest element count among p's multiplied dense linear weights (0 if none): the embedding
// table is gathered, never multiplied, so it is left out (a tied lm_head is not); without_lm_head
// leaves the lm_head out too. What a runner's f32 widening workspace must hold.
std::int64_t max_dense_linear_numel(const model::ModelParams& p, bool without_lm_head);

// The CPU engine's dense weights in bf16: the model's dense linear views converted once (round to
// nearest even) into one host buffer owned here; params() is the model's views with those
// replaced (everything else — norms, biases, experts — still points at the model's memory, which
// must outlive this). Host memory, not charged to the device budget: the CPU engine reads its
// dense weights in host memory either way (docs/serve.md "Budgets").
class HostDenseWeights {
 public:
  // invalid_argument for a dtype other than bf16 or a non-contiguous view.
  static Result<std::unique_ptr<HostDenseWeights>> create(const model::ModelParams& host,
                                                          DType dense_dtype);
  const model::ModelParams& params() const { return params_; }
  std::size_t bytes() const { return data_.size(); }

 private:
  HostDenseWeights() = default;
  std::vector<std::byte> data_;
  model::ModelParams params_;
};

}  // namespace ferry::serve
