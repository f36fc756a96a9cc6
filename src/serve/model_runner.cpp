// SPDX-License-Identifier: Apache-2.0
#include "serve/model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "serve/dense_weights.h"
#include "serve/expert_ffn.h"
#include "serve/paged_attention.h"

namespace ferry::serve {
namespace {

mem::Stream& host() { return mem::Stream::host(); }

TensorView f32(std::vector<float>& b, std::initializer_list<std::int64_t> dims) {
  return TensorView::contiguous(b.data(), DType::kF32, Device::kCpu, dims);
}
TensorView i32(std::vector<std::int32_t>& b, std::initializer_list<std::int64_t> dims) {
  return TensorView::contiguous(b.data(), DType::kI32, Device::kCpu, dims);
}

}  // namespace

void StepBatch::clear() {
  ids.clear();
  positions.clear();
  seq_of.clear();
  tables.clear();
  requests.clear();
  logit_rows.clear();
}

void weights_for_ids(const float* probs, std::span<const std::int32_t> ids, bool renormalize,
                     float* weights) {
  float sum = 0.0f;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    weights[k] = probs[ids[k]];
    sum += probs[ids[k]];
  }
  if (renormalize) {
    for (std::size_t k = 0; k < ids.size(); ++k) weights[k] /= sum;
  }
}

Status apply_routing_hook(RoutingHook& hook, const StepBatch& b, int l,
                          const model::DecoderGeometry& geo, std::int32_t* ids, const float* probs,
                          float* weights, std::int32_t* before) {
  const std::int64_t T = b.tokens(), E = geo.experts, K = geo.top_k;
  for (std::int64_t t = 0; t < T; ++t) {
    std::int32_t* row = ids + t * K;
    std::copy(row, row + K, before);
    const RouteKey key{b.requests[b.seq_of[t]], b.positions[t], l};
    FERRY_TRY(hook.on_route(key, std::span<std::int32_t>(row, std::size_t(K))));
    if (std::equal(row, row + K, before)) continue;
    for (std::int64_t i = 0; i < K; ++i) {
      if (row[i] < 0 || row[i] >= E) {
        return invalid_argument("serve: forced expert {} outside [0, {})", row[i], E);
      }
      for (std::int64_t j = 0; j < i; ++j) {
        if (row[i] == row[j]) {
          return invalid_argument("serve: forced routing repeats expert {} (layer {})", row[i], l);
        }
      }
    }
    weights_for_ids(probs + t * E, std::span<const std::int32_t>(row, std::size_t(K)),
                    geo.renormalize_topk, weights + t * K);
  }
  return ok_status();
}

std::int64_t routed_experts_bound(const std::int32_t* forced, std::int64_t T, int K,
                                  std::vector<unsigned char>& seen) {
  std::int64_t bound = 0;
  for (std::int64_t i = 0; i < T * K; ++i) {
    const std::int32_t e = forced[i];
    if (e < 0) {
      ++bound;  // a router-chosen row: each of its K slots may be a new expert
    } else if (seen[std::size_t(e)] == 0) {
      seen[std::size_t(e)] = 1;
      ++bound;
    }
  }
  for (std::int64_t i = 0; i < T * K; ++i) {
    if (forced[i] >= 0) seen[std::size_t(forced[i])] = 0;
  }
  return bound;
}

Status fill_forced_routing(RoutingHook& hook, const StepBatch& b, const model::DecoderGeometry& geo,
                           std::int32_t* forced) {
  const std::int64_t T = b.tokens(), E = geo.experts, K = geo.top_k;
  std::int64_t m = 0;
  for (int l = 0; l < geo.layers; ++l) {
    if (!geo.layer_is_moe[std::size_t(l)]) continue;
    for (std::int64_t t = 0; t < T; ++t) {
      std::int32_t* row = forced + (m * T + t) * K;
      const RouteKey key{b.requests[std::size_t(b.seq_of[std::size_t(t)])],
                         b.positions[std::size_t(t)], l};
      FERRY_ASSIGN_OR_RETURN(const bool is_forced,
                             hook.forced_route(key, std::span<std::int32_t>(row, std::size_t(K))));
      if (!is_forced) {
        std::fill(row, row + K, -1);
        continue;
      }
      for (std::int64_t i = 0; i < K; ++i) {
        if (row[i] < 0 || row[i] >= E) {
          return invalid_argument("serve: forced expert {} outside [0, {})", row[i], E);
        }
        for (std::int64_t j = 0; j < i; ++j) {
          if (row[i] == row[j]) {
            return invalid_argument("serve: forced routing repeats expert {} (layer {})", row[i],
                                    l);
          }
        }
      }
    }
    ++m;
  }
  return ok_status();
}

void apply_forced_rows(const std::int32_t* forced, std::int64_t T, int K, std::int64_t E,
                       bool renormalize, const float* probs, std::int32_t* ids, float* weights) {
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int32_t* f = forced + t * K;
    std::int32_t* row = ids + t * K;
    if (f[0] < 0 || std::equal(f, f + K, row)) continue;
    std::copy(f, f + K, row);
    weights_for_ids(probs + t * E, std::span<const std::int32_t>(row, std::size_t(K)), renormalize,
                    weights + t * K);
  }
}

void ModelRunner::index_moe_layers() {
  moe_index_.assign(std::size_t(geo_.layers), -1);
  moe_layers_ = 0;
  for (int l = 0; l < geo_.layers; ++l) {
    if (geo_.layer_is_moe[std::size_t(l)]) moe_index_[std::size_t(l)] = moe_layers_++;
  }
}

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(const model::DecoderGeometry& geo,
                                                         const model::ModelParams& params,
                                                         KvCache& kv, ExpertExecutor& experts,
                                                         std::int64_t max_tokens,
                                                         kernels::Backend& backend) {
  if (max_tokens <= 0) return invalid_argument("serve: max_tokens must be positive");
  if (backend.device() != Device::kCpu) {
    return unimplemented("serve: ModelRunner::create is the CPU runner (got {}; see create_cuda)",
                         backend.name());
  }
  if (static_cast<int>(params.layers.size()) != geo.layers) {
    return invalid_argument("serve: {} layer parameter sets for {} layers", params.layers.size(),
                            geo.layers);
  }
  std::unique_ptr<ModelRunner> r(new ModelRunner(geo, params, kv, experts, max_tokens, backend));
  const std::int64_t T = max_tokens, C = geo.hidden, HD = std::int64_t(geo.heads) * geo.head_dim,
                     GD = std::int64_t(geo.kv_heads) * geo.head_dim;
  for (auto* b : {&r->x_, &r->h_, &r->tmp_, &r->rows_x_, &r->rows_h_}) b->resize(T * C);
  r->rstd_.resize(T);
  r->rows_rstd_.resize(T);
  r->q_.resize(T * HD);
  r->attn_.resize(T * HD);
  r->k_.resize(T * GD);
  r->v_.resize(T * GD);
  if (geo.qk_norm != model::QkNorm::kNone) {
    r->q_pre_.resize(T * HD);
    r->k_pre_.resize(T * GD);
    r->qk_rstd_.resize(T * std::max(geo.heads, geo.kv_heads));
  }
  bool any_dense = false, any_moe = false;
  for (bool m : geo.layer_is_moe) (m ? any_moe : any_dense) = true;
  if (any_dense) {
    for (auto* b : {&r->gate_, &r->up_, &r->act_}) b->resize(T * geo.mlp_width);
  }
  if (any_moe) {
    const std::int64_t E = geo.experts, K = geo.top_k;
    r->router_logits_.resize(T * E);
    r->probs_.resize(T * E);
    r->weights_.resize(T * K);
    r->ids_.resize(T * K);
    r->before_.resize(K);
    r->identity_.resize(T * K);
    for (std::int64_t i = 0; i < T * K; ++i) r->identity_[i] = static_cast<std::int32_t>(i);
    r->eout_.resize(T * K * C);
  }
  r->index_moe_layers();
  r->forced_.resize(std::size_t(r->moe_layers_) * std::size_t(T * geo.top_k));
  // bf16 dense weights (EngineConfig::dense_dtype): each GEMM widens its weight here first, so
  // BLAS runs the f32 GEMM on the widened weight (the embedding is widened row by row).
  model::ModelParams probe = params;
  bool bf16 = false;
  for_each_dense_linear(probe, [&](ConstTensorView& v) {
    if (v.data != nullptr && v.dtype == DType::kBF16) bf16 = true;
  });
  if (bf16) r->widen_.resize(std::size_t(max_dense_linear_numel(params, false)));
  return r;
}

Status ModelRunner::gemm(const kernels::GemmArgs& g) {
  const bool bf16 = g.b.dtype == DType::kBF16;  // a bf16 dense weight (dense_dtype)
  if (bf16 && (g.trans_a || !g.trans_b || g.b.ndim != 2 || !g.b.is_contiguous())) {
    return unimplemented("serve: a bf16 weight is read as a contiguous b in a @ b^T");
  }
  if (!batch_invariant_ && !bf16) return be_.gemm(g, host());
  if (!batch_invariant_) {
    // The f32 GEMM on the weight widened exactly: BLAS sees the f32 engine's operands.
    const std::int64_t n = g.b.numel();
    FERRY_CHECK(std::size_t(n) <= widen_.size(), "serve: a {}-element bf16 weight, {} planned", n,
                widen_.size());
    FERRY_CHECK(
        convert_elements(g.b.data, DType::kBF16, widen_.data(), DType::kF32, std::size_t(n)),
        "serve: bf16 widening failed");
    kernels::GemmArgs w = g;
    w.b = ConstTensorView::contiguous(widen_.data(), DType::kF32, Device::kCpu,
                                      {g.b.shape[0], g.b.shape[1]});
    return be_.gemm(w, host());
  }
  // out[t, n] = dot_fixed(a[t, :], b[n, :]) (+ bias[n]): each row's bits are a function of that
  // row alone, whatever else the step holds. A bf16 b runs dot_fixed's bf16 twin (the same order
  // on the widened weights: a product's operands commute exactly).
  const bool f32 = g.out.dtype == DType::kF32 && g.a.dtype == DType::kF32 &&
                   (g.b.dtype == DType::kF32 || bf16) &&
                   (g.bias.data == nullptr || g.bias.dtype == DType::kF32);
  if (!f32 || g.trans_a || !g.trans_b || g.alpha != 1.0f || g.beta != 0.0f ||
      !g.out.is_contiguous() || !g.a.is_contiguous() || !g.b.is_contiguous()) {
    return unimplemented(
        "serve: batch-invariant gemm needs f32 (or a bf16 b), contiguous, a @ b^T");
  }
  const std::int64_t M = g.a.shape[0], K = g.a.shape[1], N = g.b.shape[0];
  FERRY_CHECK(g.b.shape[1] == K && g.out.shape[0] == M && g.out.shape[1] == N,
              "serve: batch-invariant gemm shapes disagree");
  const auto* a = static_cast<const float*>(g.a.data);
  const auto* bias = static_cast<const float*>(g.bias.data);
  auto* out = static_cast<float*>(g.out.data);
  ThreadPool::global().parallel_for(
      std::size_t(M) * std::size_t(N), [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i) {
          const std::int64_t t = std::int64_t(i) / N, n = std::int64_t(i) % N;
          const float d =
              bf16 ? dot_fixed(static_cast<const std::uint16_t*>(g.b.data) + n * K, a + t * K, K)
                   : dot_fixed(a + t * K, static_cast<const float*>(g.b.data) + n * K, K);
          out[i] = bias != nullptr ? d + bias[n] : d;
        }
      });
  return ok_status();
}

Status ModelRunner::embed(const StepBatch& b) {
  const std::int64_t T = b.tokens(), C = geo_.hidden;
  const ConstTensorView& table = params_.embed;
  if (table.dtype != DType::kBF16) {
    return be_.embedding(
        {.out = f32(x_, {T, C}),
         .table = table,
         .ids = ConstTensorView::contiguous(b.ids.data(), DType::kI32, Device::kCpu, {T})},
        host());
  }
  // A bf16 table: its rows widened exactly, i.e. the f32 gather of the widened table.
  const std::int64_t V = table.shape[0];
  FERRY_CHECK(table.ndim == 2 && table.shape[1] == C && table.is_contiguous(),
              "serve: bf16 embedding table is not a contiguous [V, C]");
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int32_t id = b.ids[std::size_t(t)];
    if (id < 0 || id >= V) {
      return invalid_argument("serve: token {} has id {}, outside the vocabulary [0, {})", t, id,
                              V);
    }
    FERRY_CHECK(convert_elements(static_cast<const std::uint16_t*>(table.data) + id * C,
                                 DType::kBF16, x_.data() + t * C, DType::kF32, std::size_t(C)),
                "serve: bf16 widening failed");
  }
  return ok_status();
}

Status ModelRunner::attention(int l, const StepBatch& b) {
  const auto& p = params_.layers[l];
  const std::int64_t T = b.tokens(), C = geo_.hidden, H = geo_.heads, G = geo_.kv_heads,
                     D = geo_.head_dim;
  const ConstTensorView h = f32(h_, {T, C});
  const bool normed = geo_.qk_norm != model::QkNorm::kNone;
  FERRY_TRY(gemm({.out = normed ? f32(q_pre_, {T, H * D}) : f32(q_, {T, H * D}),
                  .a = h,
                  .b = p.q,
                  .bias = p.q_bias,
                  .trans_b = true}));
  FERRY_TRY(gemm({.out = normed ? f32(k_pre_, {T, G * D}) : f32(k_, {T, G * D}),
                  .a = h,
                  .b = p.k,
                  .bias = p.k_bias,
                  .trans_b = true}));
  FERRY_TRY(
      gemm({.out = f32(v_, {T, G * D}), .a = h, .b = p.v, .bias = p.v_bias, .trans_b = true}));
  if (geo_.qk_norm == model::QkNorm::kPerHead) {
    FERRY_TRY(be_.rms_norm({.out = f32(q_, {T * H, D}),
                            .rstd = f32(qk_rstd_, {T * H}),
                            .in = f32(q_pre_, {T * H, D}),
                            .weight = p.q_norm,
                            .eps = geo_.rms_eps},
                           host()));
    FERRY_TRY(be_.rms_norm({.out = f32(k_, {T * G, D}),
                            .rstd = f32(qk_rstd_, {T * G}),
                            .in = f32(k_pre_, {T * G, D}),
                            .weight = p.k_norm,
                            .eps = geo_.rms_eps},
                           host()));
  } else if (geo_.qk_norm == model::QkNorm::kFullWidth) {
    FERRY_TRY(be_.rms_norm({.out = f32(q_, {T, H * D}),
                            .rstd = f32(qk_rstd_, {T}),
                            .in = f32(q_pre_, {T, H * D}),
                            .weight = p.q_norm,
                            .eps = geo_.rms_eps},
                           host()));
    FERRY_TRY(be_.rms_norm({.out = f32(k_, {T, G * D}),
                            .rstd = f32(qk_rstd_, {T}),
                            .in = f32(k_pre_, {T, G * D}),
                            .weight = p.k_norm,
                            .eps = geo_.rms_eps},
                           host()));
  }
  const ConstTensorView positions =
      ConstTensorView::contiguous(b.positions.data(), DType::kI32, Device::kCpu, {T});
  const ConstTensorView inv_freq =
      ConstTensorView::contiguous(geo_.rope.inv_freq.data(), DType::kF32, Device::kCpu,
                                  {static_cast<std::int64_t>(geo_.rope.inv_freq.size())});
  FERRY_TRY(be_.rope({.x = f32(q_, {T, H, D}),
                      .positions = positions,
                      .inv_freq = inv_freq,
                      .attention_scaling = geo_.rope.attention_scaling},
                     host()));
  FERRY_TRY(be_.rope({.x = f32(k_, {T, G, D}),
                      .positions = positions,
                      .inv_freq = inv_freq,
                      .attention_scaling = geo_.rope.attention_scaling},
                     host()));
  // The step's keys and values join the cache before anyone reads it.
  for (std::int64_t t = 0; t < T; ++t) {
    const BlockTable& table = *b.tables[b.seq_of[t]];
    kv_.write_rows(l, table, b.positions[t], k_.data() + t * G * D, v_.data() + t * G * D);
  }
  FERRY_TRY(paged_attention(kv_, {.out = attn_.data(),
                                  .q = q_.data(),
                                  .seq_of = b.seq_of.data(),
                                  .pos = b.positions.data(),
                                  .tables = b.tables,
                                  .T = T,
                                  .layer = l,
                                  .H = geo_.heads,
                                  .G = geo_.kv_heads,
                                  .D = geo_.head_dim,
                                  .scale = 1.0f / std::sqrt(static_cast<float>(D))}));
  FERRY_TRY(gemm({.out = f32(tmp_, {T, C}),
                  .a = f32(attn_, {T, H * D}),
                  .b = p.o,
                  .bias = p.o_bias,
                  .trans_b = true}));
  return be_.add({.out = f32(x_, {T, C}), .a = f32(x_, {T, C}), .b = f32(tmp_, {T, C})}, host());
}

Status ModelRunner::mlp(int l, std::int64_t T) {
  const auto& p = params_.layers[l];
  const std::int64_t C = geo_.hidden, F = geo_.mlp_width;
  const ConstTensorView h = f32(h_, {T, C});
  FERRY_TRY(gemm({.out = f32(gate_, {T, F}), .a = h, .b = p.gate, .trans_b = true}));
  FERRY_TRY(gemm({.out = f32(up_, {T, F}), .a = h, .b = p.up, .trans_b = true}));
  FERRY_TRY(be_.swiglu(
      {.out = f32(act_, {T, F}), .gate = f32(gate_, {T, F}), .up = f32(up_, {T, F})}, host()));
  return gemm({.out = f32(tmp_, {T, C}), .a = f32(act_, {T, F}), .b = p.down, .trans_b = true});
}

Status ModelRunner::moe(int l, const StepBatch& b) {
  const auto& p = params_.layers[l];
  const std::int64_t T = b.tokens(), C = geo_.hidden, E = geo_.experts, K = geo_.top_k;
  FERRY_TRY(gemm(
      {.out = f32(router_logits_, {T, E}), .a = f32(h_, {T, C}), .b = p.router, .trans_b = true}));
  FERRY_TRY(be_.router({.weights = f32(weights_, {T, K}),
                        .ids = i32(ids_, {T, K}),
                        .probs = f32(probs_, {T, E}),
                        .logits = f32(router_logits_, {T, E}),
                        .top_k = geo_.top_k,
                        .renormalize = geo_.renormalize_topk},
                       host()));
  if (hook_ != nullptr && hook_->forces_ahead()) {
    // The step's forced routing was asked for before the layers ran (forward()).
    apply_forced_rows(forced_.data() + std::int64_t(moe_index_[std::size_t(l)]) * T * K, T,
                      geo_.top_k, E, geo_.renormalize_topk, probs_.data(), ids_.data(),
                      weights_.data());
  } else if (hook_ != nullptr) {
    FERRY_TRY(apply_routing_hook(*hook_, b, l, geo_, ids_.data(), probs_.data(), weights_.data(),
                                 before_.data()));
  }
  FERRY_TRY(experts_.run(l, h_.data(), ids_.data(), T, eout_.data()));
  return be_.moe_combine({.out = f32(tmp_, {T, C}),
                          .expert_out = f32(eout_, {T * K, C}),
                          .weights = f32(weights_, {T, K}),
                          .slot_of = i32(identity_, {T, K})},
                         host());
}

Status ModelRunner::forward(const StepBatch& b, float* logits) {
  const std::int64_t T = b.tokens(), C = geo_.hidden;
  if (T <= 0 || T > max_tokens_) {
    return invalid_argument("serve: step of {} tokens outside [1, {}]", T, max_tokens_);
  }
  FERRY_CHECK(b.positions.size() == b.ids.size() && b.seq_of.size() == b.ids.size(),
              "serve: step batch fields disagree");
  if (hook_ != nullptr && hook_->forces_ahead()) {
    FERRY_TRY(fill_forced_routing(*hook_, b, geo_, forced_.data()));
  }
  FERRY_TRY(embed(b));
  for (int l = 0; l < geo_.layers; ++l) {
    const auto& p = params_.layers[l];
    FERRY_TRY(be_.rms_norm({.out = f32(h_, {T, C}),
                            .rstd = f32(rstd_, {T}),
                            .in = f32(x_, {T, C}),
                            .weight = p.attn_norm,
                            .eps = geo_.rms_eps},
                           host()));
    FERRY_TRY(attention(l, b));
    FERRY_TRY(be_.rms_norm({.out = f32(h_, {T, C}),
                            .rstd = f32(rstd_, {T}),
                            .in = f32(x_, {T, C}),
                            .weight = p.mlp_norm,
                            .eps = geo_.rms_eps},
                           host()));
    FERRY_TRY(geo_.layer_is_moe[l] ? moe(l, b) : mlp(l, T));
    FERRY_TRY(
        be_.add({.out = f32(x_, {T, C}), .a = f32(x_, {T, C}), .b = f32(tmp_, {T, C})}, host()));
  }
  const std::int64_t R = static_cast<std::int64_t>(b.logit_rows.size());
  if (R == 0) return ok_status();
  for (std::int64_t r = 0; r < R; ++r) {
    const std::int32_t t = b.logit_rows[r];
    FERRY_CHECK(t >= 0 && t < T, "serve: logit row {} outside the step", t);
    std::memcpy(rows_x_.data() + r * C, x_.data() + t * C, sizeof(float) * C);
  }
  FERRY_TRY(be_.rms_norm({.out = f32(rows_h_, {R, C}),
                          .rstd = f32(rows_rstd_, {R}),
                          .in = f32(rows_x_, {R, C}),
                          .weight = params_.final_norm,
                          .eps = geo_.rms_eps},
                         host()));
  return gemm({.out = TensorView::contiguous(logits, DType::kF32, Device::kCpu, {R, geo_.vocab}),
               .a = f32(rows_h_, {R, C}),
               .b = params_.lm_head,
               .trans_b = true});
}

}  // namespace ferry::serve
