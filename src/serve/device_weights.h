// SPDX-License-Identifier: Apache-2.0
// DeviceWeights: the CUDA engine's copy of a model's parameters in GPU memory — one Arena on
// MemTier::kDevice charged to the engine's device budget (label "dense weights", or "weights"
// with experts) — and the ModelParams of device views the runner computes with.
// Routed experts are uploaded only when asked (resident mode); the other modes read them from
// the pager's slots, the static staging area or the host store. Tied embeddings are uploaded once.
// Every parameter is converted on the host first — the dense linear weights (dense_weights.h
// for_each_dense_linear) to `dense_dtype` (f32 or bf16, EngineConfig::dense_dtype), norms and
// biases to f32 (the engine computes in f32), routed experts to `expert_dtype` (f32 or bf16,
// PagerConfig::expert_dtype, the same conversion as the ExpertStore so resident reads the other
// modes' bits) — through a bounded pinned staging buffer
// (256 MiB, copied up on `stream` each time it fills, so the host holds no second copy of the
// model), synchronized before create() returns (startup only). Also holds the rope inverse
// frequencies the CUDA rope kernel reads.
#pragma once

#include <cstdint>
#include <memory>

#include "core/result.h"
#include "mem/arena.h"
#include "mem/budget.h"
#include "mem/stream.h"
#include "mem/transfer_engine.h"
#include "model/model_compute.h"
#include "serve/budget_charge.h"

namespace ferry::serve {

class DeviceWeights {
 public:
  // host: the model's views (any dtype convertible to f32, host memory). shared: the engine's
  // device budget (may be null). resource_exhausted when the budget cannot hold them.
  // stage_bytes: the host staging buffer (0: 256 MiB; tests pass a few KiB to split tensors).
  static Result<std::unique_ptr<DeviceWeights>> create(
      const model::DecoderGeometry& geo, const model::ModelParams& host, bool with_experts,
      DType expert_dtype, DType dense_dtype, mem::TransferEngine& te, mem::Stream& stream,
      mem::MemoryBudget* shared, std::size_t stage_bytes = 0);
  const model::ModelParams& params() const { return params_; }
  const float* inv_freq() const { return inv_freq_; }  // [rope.inv_freq.size()] device
  std::size_t bytes() const { return arena_.total_bytes(); }

 private:
  DeviceWeights() = default;
  mem::MemoryBudget budget_{mem::MemTier::kDevice};
  BudgetCharge charge_;
  mem::Arena arena_;
  model::ModelParams params_;
  const float* inv_freq_ = nullptr;
};

}  // namespace ferry::serve
