// SPDX-License-Identifier: Apache-2.0
// The CUDA runner (ModelRunner::create_cuda): the CPU runner's step, top to bottom, on a CUDA
// backend. Differences from model_runner.cpp, all about where bytes live:
//   - activations: one kDevice arena planned for max_tokens (below), charged to the engine's
//     device budget; the step's host inputs (ids, positions, sequence of each token, block tables)
//     go up in one copy from a pinned buffer;
//   - K/V rows are scattered into the cache and attention reads it through the block tables with
//     the serve kernels (kernels/cuda/serve_kernels.h), both on the device;
//   - experts run through ExpertExecutor::run_device;
//   - only the sampled rows' logits come back (one D2H + one sync per step);
//   - a routing hook that forces_ahead() (trace replay) is asked for the whole step before it
//     runs: its ids go up in one copy and forced_routing applies them after each MoE layer's
//     router on the device (no host round trip); another hook still costs one per MoE layer.
// Decode steps as CUDA graphs (EngineConfig::cuda_graphs): a step with no host wait inside
// (graph_eligible: resident or static experts and no access observer, or paged with device-side
// slot resolution (device_resolver.h: resolve, miss copies and the logs' read-back are in the
// step; the pager replays the logs after the sync); no per-layer hook) whose
// tokens are each its sequence's one decode token is enqueued by enqueue_step() — the whole step,
// step-input copies to logits read-back — which is what mem::Graph captures. Per step shape
// (GraphKey: T, the table stride, forced routing or not, the KV layout, the logits rows) the first
// step runs eagerly (cuBLASLt tunes its GEMMs there), the second is captured and launched, later
// ones replay it: one graph launch instead of ~20 launches per layer. Everything a replay reads
// that changes between steps lives at fixed addresses (the pinned step inputs and forced ids,
// copied up by the graph's own memcpy nodes; positions and block tables reach the kernels through
// device memory; the table stride is the pool's capacity), so a replay computes exactly what the
// eager step would: the same kernels on the same arguments, the same bits (tests/gpu/
// serve_gpu_test.cpp ServeGraphsCuda.*). A replay calls nothing on the host, so the copies and
// expert work the capture counted are added per replay (LinkEngine::count_replayed,
// ExpertExecutor::count_replayed).
// The pinned step buffers are reused every step: the previous step ended with that sync.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "mem/graph.h"
#include "serve/dense_weights.h"
#include "serve/device_ops.h"
#include "serve/link_engine.h"
#include "serve/model_runner.h"

namespace ferry::serve {
namespace {

class CudaModelRunner final : public ModelRunner {
 public:
  CudaModelRunner(const model::DecoderGeometry& geo, const model::ModelParams& params, KvCache& kv,
                  ExpertExecutor& experts, std::int64_t max_tokens, kernels::Backend& backend,
                  const float* d_inv_freq, mem::Stream& stream, mem::TransferEngine& te)
      : ModelRunner(geo, params, kv, experts, max_tokens, backend),
        st_(stream),
        te_(te),
        inv_freq_(d_inv_freq),
        link_(dynamic_cast<LinkEngine*>(&te)) {
    const char* v = std::getenv("FERRY_DEBUG_SYNC");
    debug_sync_ = v != nullptr && v[0] != '\0' && v[0] != '0';
    fuse_qkv_ = device::decode_fusion_enabled(device::DecodeFusion::kQkv);
    fuse_add_norm_ = device::decode_fusion_enabled(device::DecodeFusion::kAddNorm);
    fuse_qk_norm_rope_ = device::decode_fusion_enabled(device::DecodeFusion::kQkNormRope);
    fuse_qk_norm_rope_kv_ = device::decode_fusion_enabled(device::DecodeFusion::kQkNormRopeKv);
  }
  Status init(mem::MemoryBudget* shared, std::int64_t max_logit_rows);
  Status forward(const StepBatch& b, float* logits) override;

 private:
  // A decode-step graph: the step's shape (what its kernels and copies bake in) and what one
  // replay moves (counted on replay, since a replay calls nothing on the host).
  struct GraphKey {
    std::int64_t T = 0, stride = 0;
    bool forced = false;
    bool device_resolve = false;  // paged: slots resolved on the device (device_resolver.h)
    const std::byte* kv_base = nullptr;
    std::int64_t kv_layer_stride = 0;
    std::vector<std::int32_t> logit_rows;
    bool operator==(const GraphKey&) const = default;
  };
  struct StepGraph {
    GraphKey key;
    mem::Graph graph;  // empty: seen once (warm-up), not captured yet
    std::uint64_t h2d = 0, d2h = 0, d2d = 0;
    ExecutorCounters experts;
  };
  static constexpr std::size_t kMaxGraphs = 8;
  bool graph_eligible(const StepBatch& b, bool device_resolve) const;
  // Enqueues the whole step on st_ (forced routing and step inputs up, the layers, the logits
  // rows down to h_logits_; with device_resolve the slot resolution logs down too) without
  // waiting on the device: what a graph captures.
  Status enqueue_step(const StepBatch& b, std::int64_t stride, bool forced, bool device_resolve);
  Status run_graph(const StepBatch& b, std::int64_t stride, bool forced, bool device_resolve);

 private:
  struct Slots {
    mem::SlotId x, h, tmp, rstd, q_pre, k_pre, q, k, v, attn, qk_rstd, gate, up, act;
    mem::SlotId router_logits, probs, weights, ids, identity, eout, eact, forced;
    mem::SlotId step, rows_x, rows_h, rows_rstd, logits;
    mem::SlotId widen;  // bf16 dense weights: one weight widened to f32 (widen_floats_)
  };
  TensorView f32(mem::SlotId s, std::initializer_list<std::int64_t> dims) const {
    return TensorView::contiguous(arena_.as<float>(s), DType::kF32, Device::kCuda, dims);
  }
  TensorView i32(std::int32_t* p, std::initializer_list<std::int64_t> dims) const {
    return TensorView::contiguous(p, DType::kI32, Device::kCuda, dims);
  }
  std::int32_t* step_i32() const { return arena_.as<std::int32_t>(s_.step); }
  Status attention(int l, std::int64_t T, const kernels::cuda::PagedStep& step);
  Status mlp(int l, std::int64_t T);
  Status moe(int l, const StepBatch& b);
  // A linear layer: the backend's GEMM, or for a bf16 weight (EngineConfig::dense_dtype) the f32
  // path's bits on the widened weight: the small-m kernel's bf16 twin where the backend would take
  // the small-m kernel, else the weight widened into the workspace and the backend's f32 GEMM.
  Status dense_gemm(const kernels::GemmArgs& g, mem::Stream& stream);
  // Linear layers on the same input rows (q/k/v; a dense MLP's gate/up): one fused small-m launch
  // (decode fusion kQkv) when each would take the small-m kernel on its own, else dense_gemm each.
  // The same bits either way (decode_fusion.h).
  Status dense_gemms(std::initializer_list<kernels::GemmArgs> gs, mem::Stream& stream);
  // x = x + tmp, then h = rms_norm(x) with `norm` when given (the next norm of the layer stack),
  // as one launch under decode fusion kAddNorm; the same bits as the add and the norm.
  Status residual_add(std::int64_t T, const ConstTensorView* norm);
  Status embed(std::int64_t T, const std::int32_t* d_ids);  // x = the rows (bf16 widened)

  mem::Stream& st_;
  mem::TransferEngine& te_;
  const float* inv_freq_;
  mem::MemoryBudget budget_{mem::MemTier::kDevice};
  BudgetCharge charge_;
  mem::Arena arena_;
  Slots s_;
  mem::MemoryBudget host_budget_{mem::MemTier::kPinnedHost};
  mem::Buffer h_step_, h_logits_, h_route_, h_forced_;
  // Per step with forced routing: each MoE layer's distinct-expert bound (by layer) and its
  // scratch (routed_experts_bound, which leaves it zeroed); sized at creation.
  std::vector<std::int64_t> expert_bound_;
  std::vector<unsigned char> route_seen_;
  std::int64_t table_capacity_ = 0;  // ints of the step's block-table region
  std::int64_t widen_floats_ = 0;    // the widening workspace's capacity (0: none)
  std::vector<std::int32_t> before_;
  LinkEngine* link_ = nullptr;  // te_ as the engine's LinkEngine (graph replays count copies)
  bool debug_sync_ = false;     // FERRY_DEBUG_SYNC: launches synchronize, which a capture cannot
  // Decode fusions (kernels/cuda/decode_fusion.h; read once per process): timing only, the same
  // bits on or off.
  bool fuse_qkv_ = false, fuse_add_norm_ = false, fuse_qk_norm_rope_ = false;
  bool fuse_qk_norm_rope_kv_ = false;  // kQkNormRopeKv: that launch writes the KV cache too
  std::vector<StepGraph> graphs_;      // least recently used first
};

Status CudaModelRunner::init(mem::MemoryBudget* shared, std::int64_t max_logit_rows) {
  const std::int64_t T = max_tokens_, C = geo_.hidden,
                     HD = std::int64_t(geo_.heads) * geo_.head_dim,
                     GD = std::int64_t(geo_.kv_heads) * geo_.head_dim, V = geo_.vocab;
  const std::int64_t E = geo_.experts, K = geo_.top_k;
  bool any_dense = false, any_moe = false;
  for (bool m : geo_.layer_is_moe) (m ? any_moe : any_dense) = true;
  index_moe_layers();
  // A step has at most T sequences, each table at most the pool's capacity.
  table_capacity_ = T * std::int64_t(kv_.capacity_blocks());
  const auto f = [](std::int64_t n) { return std::size_t(std::max<std::int64_t>(n, 1)) * 4; };
  mem::ArenaPlan plan;
  s_.x = plan.add("x", f(T * C));
  s_.h = plan.add("h", f(T * C));
  s_.tmp = plan.add("tmp", f(T * C));
  s_.rstd = plan.add("rstd", f(T));
  s_.q = plan.add("q", f(T * HD));
  s_.k = plan.add("k", f(T * GD));
  s_.v = plan.add("v", f(T * GD));
  s_.attn = plan.add("attn", f(T * HD));
  if (geo_.qk_norm != model::QkNorm::kNone) {
    s_.q_pre = plan.add("q_pre", f(T * HD));
    s_.k_pre = plan.add("k_pre", f(T * GD));
    s_.qk_rstd = plan.add("qk_rstd", f(T * std::max(geo_.heads, geo_.kv_heads)));
  }
  if (any_dense) {
    s_.gate = plan.add("gate", f(T * geo_.mlp_width));
    s_.up = plan.add("up", f(T * geo_.mlp_width));
    s_.act = plan.add("act", f(T * geo_.mlp_width));
  }
  if (any_moe) {
    s_.router_logits = plan.add("router_logits", f(T * E));
    s_.probs = plan.add("probs", f(T * E));
    s_.weights = plan.add("weights", f(T * K));
    s_.ids = plan.add("ids", f(T * K));
    s_.identity = plan.add("identity", f(T * K));
    s_.eout = plan.add("eout", f(T * K * C));
    s_.eact = plan.add("eact", f(T * K * geo_.expert_width));
    // A forces_ahead() routing hook's step (fill_forced_routing): [moe layers, T, K] ids.
    s_.forced = plan.add("forced routing", f(std::int64_t(moe_layers_) * T * K));
  }
  s_.step = plan.add("step inputs", f(3 * T + table_capacity_));
  s_.rows_x = plan.add("rows_x", f(T * C));
  s_.rows_h = plan.add("rows_h", f(T * C));
  s_.rows_rstd = plan.add("rows_rstd", f(T));
  s_.logits = plan.add("logits", f(T * V));
  // bf16 dense weights: a GEMM of more rows than the small-m kernel takes (a prefill chunk; the
  // lm_head only when more than kSmallGemmRows sequences are sampled at once) widens its weight
  // into this workspace and runs the f32 GEMM on it; FERRY_SMALL_M_GEMM=0 sends every GEMM there.
  {
    model::ModelParams probe = params_;
    bool bf16 = false;
    for_each_dense_linear(probe, [&](ConstTensorView& v) {
      if (v.data != nullptr && v.dtype == DType::kBF16) bf16 = true;
    });
    const bool small_m = device::small_m_gemm_enabled();
    const std::int64_t R = max_logit_rows > 0 ? std::min(max_logit_rows, T) : T;
    if (bf16 && (!small_m || T > device::kSmallGemmRows)) {
      widen_floats_ = max_dense_linear_numel(params_, /*without_lm_head=*/true);
    }
    if (bf16 && (!small_m || R > device::kSmallGemmRows) && params_.lm_head.data != nullptr) {
      widen_floats_ = std::max(widen_floats_, params_.lm_head.numel());
    }
    if (widen_floats_ > 0) s_.widen = plan.add("dense widen", f(widen_floats_));
  }
  FERRY_ASSIGN_OR_RETURN(charge_,
                         BudgetCharge::take(shared, plan.allocation_bytes(), "activations"));
  FERRY_ASSIGN_OR_RETURN(
      arena_, mem::make_arena(plan, mem::MemTier::kDevice, budget_, {.what = "serve activations"}));
  auto pinned = [&](std::size_t bytes, std::string_view what) {
    return mem::Buffer::allocate(mem::MemTier::kPinnedHost, bytes, host_budget_, {.what = what});
  };
  FERRY_ASSIGN_OR_RETURN(h_step_, pinned(f(3 * T + table_capacity_), "step inputs (host)"));
  FERRY_ASSIGN_OR_RETURN(h_logits_, pinned(f(T * V), "logits (host)"));
  if (any_moe) {
    // Routing hook round trip: ids [T, K] i32, weights [T, K], probs [T, E].
    FERRY_ASSIGN_OR_RETURN(h_route_, pinned(f(T * K) * 2 + f(T * E), "routing (host)"));
    FERRY_ASSIGN_OR_RETURN(h_forced_,
                           pinned(f(std::int64_t(moe_layers_) * T * K), "forced routing (host)"));
    expert_bound_.assign(std::size_t(geo_.layers), 0);
    route_seen_.assign(std::size_t(E), 0);
    auto* id = reinterpret_cast<std::int32_t*>(h_route_.data());
    for (std::int64_t i = 0; i < T * K; ++i) id[i] = static_cast<std::int32_t>(i);
    FERRY_TRY(te_.h2d(arena_.data(s_.identity), id, std::size_t(T * K) * 4, st_));
    FERRY_TRY(st_.synchronize());
    before_.resize(std::size_t(K));
  }
  return ok_status();
}

Status CudaModelRunner::attention(int l, std::int64_t T, const kernels::cuda::PagedStep& step) {
  const auto& p = params_.layers[l];
  const std::int64_t C = geo_.hidden, H = geo_.heads, G = geo_.kv_heads, D = geo_.head_dim;
  const ConstTensorView h = f32(s_.h, {T, C});
  const bool normed = geo_.qk_norm != model::QkNorm::kNone;
  FERRY_TRY(dense_gemms(
      {{.out = normed ? f32(s_.q_pre, {T, H * D}) : f32(s_.q, {T, H * D}),
        .a = h,
        .b = p.q,
        .bias = p.q_bias,
        .trans_b = true},
       {.out = normed ? f32(s_.k_pre, {T, G * D}) : f32(s_.k, {T, G * D}),
        .a = h,
        .b = p.k,
        .bias = p.k_bias,
        .trans_b = true},
       {.out = f32(s_.v, {T, G * D}), .a = h, .b = p.v, .bias = p.v_bias, .trans_b = true}},
      st_));
  const std::int64_t R = static_cast<std::int64_t>(geo_.rope.inv_freq.size());
  // The paged cache this layer's keys and values join (kv_write below, or the fused launch).
  const kernels::cuda::PagedKvLayout layout{.base = kv_.data(),
                                            .layer_stride = kv_.layer_stride_elems(),
                                            .block_tokens = kv_.block_tokens(),
                                            .G = geo_.kv_heads,
                                            .D = geo_.head_dim,
                                            .bf16 = kv_.dtype() == DType::kBF16};
  bool roped = false;    // the q/k norms and ropes ran as one fused launch
  bool kv_done = false;  // ... which also wrote the step's K/V rows to the cache (kQkNormRopeKv)
  if (geo_.qk_norm == model::QkNorm::kPerHead && fuse_qk_norm_rope_ &&
      p.q_norm.dtype == DType::kF32 && p.k_norm.dtype == DType::kF32 &&
      p.q_norm.device == Device::kCuda && p.k_norm.device == Device::kCuda &&
      p.q_norm.numel() == D && p.k_norm.numel() == D) {
    // rstd is not written (scratch nobody reads in serving; the unfused path's two norms overlap
    // there anyway). s_.k is still written: kv_write's input on the other paths, scratch here.
    const device::QkNormRopeArgs qk{.q_out = arena_.as<float>(s_.q),
                                    .q_in = arena_.as<float>(s_.q_pre),
                                    .q_weight = static_cast<const float*>(p.q_norm.data),
                                    .k_out = arena_.as<float>(s_.k),
                                    .k_in = arena_.as<float>(s_.k_pre),
                                    .k_weight = static_cast<const float*>(p.k_norm.data),
                                    .positions = step.pos,
                                    .inv_freq = inv_freq_,
                                    .t = T,
                                    .h = H,
                                    .g = G,
                                    .d = D,
                                    .r = 2 * R,
                                    .eps = geo_.rms_eps,
                                    .scaling = geo_.rope.attention_scaling};
    if (fuse_qk_norm_rope_kv_) {
      FERRY_ASSIGN_OR_RETURN(
          roped,
          device::qk_norm_rope_kv_write(
              {.qk = qk, .kv = layout, .layer = l, .step = step, .v = arena_.as<float>(s_.v)},
              st_));
      kv_done = roped;
    } else {
      FERRY_ASSIGN_OR_RETURN(roped, device::qk_norm_rope(qk, st_));
    }
  }
  if (!roped && geo_.qk_norm == model::QkNorm::kPerHead) {
    FERRY_TRY(be_.rms_norm({.out = f32(s_.q, {T * H, D}),
                            .rstd = f32(s_.qk_rstd, {T * H}),
                            .in = f32(s_.q_pre, {T * H, D}),
                            .weight = p.q_norm,
                            .eps = geo_.rms_eps},
                           st_));
    FERRY_TRY(be_.rms_norm({.out = f32(s_.k, {T * G, D}),
                            .rstd = f32(s_.qk_rstd, {T * G}),
                            .in = f32(s_.k_pre, {T * G, D}),
                            .weight = p.k_norm,
                            .eps = geo_.rms_eps},
                           st_));
  } else if (geo_.qk_norm == model::QkNorm::kFullWidth) {
    FERRY_TRY(be_.rms_norm({.out = f32(s_.q, {T, H * D}),
                            .rstd = f32(s_.qk_rstd, {T}),
                            .in = f32(s_.q_pre, {T, H * D}),
                            .weight = p.q_norm,
                            .eps = geo_.rms_eps},
                           st_));
    FERRY_TRY(be_.rms_norm({.out = f32(s_.k, {T, G * D}),
                            .rstd = f32(s_.qk_rstd, {T}),
                            .in = f32(s_.k_pre, {T, G * D}),
                            .weight = p.k_norm,
                            .eps = geo_.rms_eps},
                           st_));
  }
  if (!roped) {
    const ConstTensorView positions =
        ConstTensorView::contiguous(step.pos, DType::kI32, Device::kCuda, {T});
    const ConstTensorView inv_freq =
        ConstTensorView::contiguous(inv_freq_, DType::kF32, Device::kCuda, {R});
    FERRY_TRY(be_.rope({.x = f32(s_.q, {T, H, D}),
                        .positions = positions,
                        .inv_freq = inv_freq,
                        .attention_scaling = geo_.rope.attention_scaling},
                       st_));
    FERRY_TRY(be_.rope({.x = f32(s_.k, {T, G, D}),
                        .positions = positions,
                        .inv_freq = inv_freq,
                        .attention_scaling = geo_.rope.attention_scaling},
                       st_));
  }
  // The step's keys and values join the cache before anyone reads it (same stream: ordered).
  if (!kv_done) {
    FERRY_TRY(
        device::kv_write(layout, l, step, arena_.as<float>(s_.k), arena_.as<float>(s_.v), st_));
  }
  FERRY_TRY(device::paged_attention(layout, l, step, arena_.as<float>(s_.attn),
                                    arena_.as<float>(s_.q), geo_.heads,
                                    1.0f / std::sqrt(static_cast<float>(D)), st_));
  // tmp = the attention block's output; enqueue_step adds it to x (residual_add).
  return dense_gemm({.out = f32(s_.tmp, {T, C}),
                     .a = f32(s_.attn, {T, H * D}),
                     .b = p.o,
                     .bias = p.o_bias,
                     .trans_b = true},
                    st_);
}

Status CudaModelRunner::mlp(int l, std::int64_t T) {
  const auto& p = params_.layers[l];
  const std::int64_t C = geo_.hidden, F = geo_.mlp_width;
  const ConstTensorView h = f32(s_.h, {T, C});
  FERRY_TRY(dense_gemms({{.out = f32(s_.gate, {T, F}), .a = h, .b = p.gate, .trans_b = true},
                         {.out = f32(s_.up, {T, F}), .a = h, .b = p.up, .trans_b = true}},
                        st_));
  FERRY_TRY(be_.swiglu(
      {.out = f32(s_.act, {T, F}), .gate = f32(s_.gate, {T, F}), .up = f32(s_.up, {T, F})}, st_));
  return dense_gemm(
      {.out = f32(s_.tmp, {T, C}), .a = f32(s_.act, {T, F}), .b = p.down, .trans_b = true}, st_);
}

Status CudaModelRunner::moe(int l, const StepBatch& b) {
  const auto& p = params_.layers[l];
  const std::int64_t T = b.tokens(), C = geo_.hidden, E = geo_.experts, K = geo_.top_k;
  auto* d_ids = arena_.as<std::int32_t>(s_.ids);
  FERRY_TRY(dense_gemm({.out = f32(s_.router_logits, {T, E}),
                        .a = f32(s_.h, {T, C}),
                        .b = p.router,
                        .trans_b = true},
                       st_));
  FERRY_TRY(be_.router({.weights = f32(s_.weights, {T, K}),
                        .ids = i32(d_ids, {T, K}),
                        .probs = f32(s_.probs, {T, E}),
                        .logits = f32(s_.router_logits, {T, E}),
                        .top_k = geo_.top_k,
                        .renormalize = geo_.renormalize_topk},
                       st_));
  if (hook_ != nullptr && hook_->forces_ahead()) {
    // The step's forced ids went up before the layers (forward()): applied on the device, no
    // host round trip.
    FERRY_TRY(device::forced_routing(
        {.ids = d_ids,
         .weights = arena_.as<float>(s_.weights),
         .probs = arena_.as<float>(s_.probs),
         .forced = arena_.as<std::int32_t>(s_.forced) + std::int64_t(moe_index_[l]) * T * K,
         .T = T,
         .E = E,
         .K = geo_.top_k,
         .renormalize = geo_.renormalize_topk},
        st_));
  } else if (hook_ != nullptr) {
    // The hook sees (and may force) the routing on the host: one round trip per MoE layer.
    auto* h_ids = reinterpret_cast<std::int32_t*>(h_route_.data());
    auto* h_w = reinterpret_cast<float*>(h_route_.data() + std::size_t(max_tokens_ * K) * 4);
    auto* h_probs = h_w + max_tokens_ * K;
    const std::size_t tk = std::size_t(T * K) * 4;
    FERRY_TRY(te_.d2h(h_ids, d_ids, tk, st_));
    FERRY_TRY(te_.d2h(h_w, arena_.data(s_.weights), tk, st_));
    FERRY_TRY(te_.d2h(h_probs, arena_.data(s_.probs), std::size_t(T * E) * 4, st_));
    ++host_syncs_;
    FERRY_TRY(st_.synchronize());
    FERRY_TRY(apply_routing_hook(*hook_, b, l, geo_, h_ids, h_probs, h_w, before_.data()));
    FERRY_TRY(te_.h2d(d_ids, h_ids, tk, st_));
    FERRY_TRY(te_.h2d(arena_.data(s_.weights), h_w, tk, st_));
  }
  FERRY_TRY(experts_.run_device(l, arena_.as<float>(s_.h), d_ids, T, arena_.as<float>(s_.eact),
                                arena_.as<float>(s_.eout)));
  return be_.moe_combine({.out = f32(s_.tmp, {T, C}),
                          .expert_out = f32(s_.eout, {T * K, C}),
                          .weights = f32(s_.weights, {T, K}),
                          .slot_of = i32(arena_.as<std::int32_t>(s_.identity), {T, K})},
                         st_);
}

Status CudaModelRunner::dense_gemm(const kernels::GemmArgs& g, mem::Stream& stream) {
  if (g.b.dtype != DType::kBF16) return be_.gemm(g, stream);
  const std::int64_t m = g.out.shape[0], n = g.out.shape[1], k = g.a.shape[1];
  if (g.trans_a || !g.trans_b || g.a.ndim != 2 || g.b.ndim != 2 || g.out.ndim != 2 ||
      g.a.dtype != DType::kF32 || g.out.dtype != DType::kF32 || !g.b.is_contiguous() ||
      g.a.stride[1] != 1 || g.out.stride[1] != 1 || g.a.shape[0] != m || g.b.shape[0] != n ||
      g.b.shape[1] != k || (g.bias.data != nullptr && g.bias.dtype != DType::kF32)) {
    return unimplemented(
        "serve: a bf16 weight is read as a contiguous b [n, k] of f32 a [m, k] @ b^T (out {} a {} "
        "b {})",
        g.out.shape_string(), g.a.shape_string(), g.b.shape_string());
  }
  // CudaBackend::gemm's own choice for these rows in f32: its small-m kernel, or cuBLASLt. Rows
  // [r0, r0 + rows) through the small-m kernel:
  auto small_m = [&](std::int64_t r0, std::int64_t rows) {
    return device::small_m_gemm_bf16w(
        {.out = static_cast<float*>(g.out.data) + r0 * g.out.stride[0],
         .a = static_cast<const float*>(g.a.data) + r0 * g.a.stride[0],
         .b = static_cast<const std::uint16_t*>(g.b.data),
         .bias = static_cast<const float*>(g.bias.data),
         .m = rows,
         .n = n,
         .k = k,
         .lda = g.a.stride[0],
         .ldb = g.b.stride[0],
         .ldo = g.out.stride[0],
         .alpha = g.alpha,
         .beta = g.beta},
        stream);
  };
  if (device::small_m_gemm_enabled() && m <= device::kSmallGemmRows) return small_m(0, m);
  // More rows than the workspace was planned for (the lm_head when a prompt is scored: every
  // prompt position's logits, while the plan sized the lm_head for the sampled rows): groups of
  // kSmallGemmRows rows, each reading the bf16 weight in place.
  if (g.b.numel() > widen_floats_ && device::small_m_gemm_enabled()) {
    for (std::int64_t r0 = 0; r0 < m; r0 += device::kSmallGemmRows) {
      FERRY_TRY(small_m(r0, std::min<std::int64_t>(device::kSmallGemmRows, m - r0)));
    }
    return ok_status();
  }
  FERRY_CHECK(g.b.numel() <= widen_floats_,
              "serve: a {}-element bf16 weight for {} rows, the widening workspace holds {}",
              g.b.numel(), m, widen_floats_);
  float* ws = arena_.as<float>(s_.widen);
  FERRY_TRY(
      device::widen_bf16(ws, static_cast<const std::uint16_t*>(g.b.data), g.b.numel(), stream));
  kernels::GemmArgs w = g;
  w.b = ConstTensorView::contiguous(ws, DType::kF32, Device::kCuda, {n, k});
  return be_.gemm(w, stream);
}

// Whether g would take the small-m kernel in dense_gemm (bf16 weight) or CudaBackend::gemm (f32):
// m <= kSmallGemmRows f32 rows against a contiguous [n, k] weight on the device, a @ b^T.
bool small_m_layout(const kernels::GemmArgs& g) {
  const std::int64_t m = g.out.shape[0], n = g.out.shape[1], k = g.a.shape[1];
  const bool dt = g.b.dtype == DType::kBF16 || g.b.dtype == DType::kF32;
  return device::small_m_gemm_enabled() && dt && !g.trans_a && g.trans_b && g.a.ndim == 2 &&
         g.b.ndim == 2 && g.out.ndim == 2 && g.a.dtype == DType::kF32 &&
         g.out.dtype == DType::kF32 && g.b.is_contiguous() && g.a.stride[1] == 1 &&
         g.out.stride[1] == 1 && g.a.shape[0] == m && g.b.shape[0] == n && g.b.shape[1] == k &&
         m >= 1 && m <= device::kSmallGemmRows && k >= 1 && g.a.stride[0] >= k &&
         g.out.stride[0] >= n && g.a.device == Device::kCuda && g.b.device == Device::kCuda &&
         g.out.device == Device::kCuda &&
         (g.bias.data == nullptr ||
          (g.bias.dtype == DType::kF32 && g.bias.device == Device::kCuda && g.bias.numel() == n &&
           g.bias.is_contiguous()));
}

Status CudaModelRunner::dense_gemms(std::initializer_list<kernels::GemmArgs> gs,
                                    mem::Stream& stream) {
  const kernels::GemmArgs& g0 = *gs.begin();
  bool fuse = fuse_qkv_ && gs.size() >= 2 &&
              gs.size() <= std::size_t(device::SmallMGemmMultiArgs::kMaxOutputs);
  for (const kernels::GemmArgs& g : gs) {
    fuse = fuse && small_m_layout(g) && g.b.dtype == g0.b.dtype && g.a.data == g0.a.data &&
           g.a.shape[0] == g0.a.shape[0] && g.a.shape[1] == g0.a.shape[1] &&
           g.a.stride[0] == g0.a.stride[0] && g.alpha == g0.alpha && g.beta == g0.beta;
  }
  if (!fuse) {
    for (const kernels::GemmArgs& g : gs) FERRY_TRY(dense_gemm(g, stream));
    return ok_status();
  }
  device::SmallMGemmMultiArgs m{.a = static_cast<const float*>(g0.a.data),
                                .m = g0.out.shape[0],
                                .k = g0.a.shape[1],
                                .lda = g0.a.stride[0],
                                .alpha = g0.alpha,
                                .beta = g0.beta,
                                .bf16 = g0.b.dtype == DType::kBF16};
  for (const kernels::GemmArgs& g : gs) {
    m.outs[m.count++] = {.out = static_cast<float*>(g.out.data),
                         .b = g.b.data,
                         .bias = static_cast<const float*>(g.bias.data),
                         .n = g.out.shape[1],
                         .ldb = g.b.stride[0],
                         .ldo = g.out.stride[0]};
  }
  return device::small_m_gemm_multi(m, stream);
}

Status CudaModelRunner::residual_add(std::int64_t T, const ConstTensorView* norm) {
  const std::int64_t C = geo_.hidden;
  if (norm != nullptr && fuse_add_norm_ && norm->dtype == DType::kF32 &&
      norm->device == Device::kCuda && norm->numel() == C && norm->is_contiguous()) {
    return device::add_rms_norm({.x_out = arena_.as<float>(s_.x),
                                 .out = arena_.as<float>(s_.h),
                                 .rstd = arena_.as<float>(s_.rstd),
                                 .x = arena_.as<float>(s_.x),
                                 .y = arena_.as<float>(s_.tmp),
                                 .weight = static_cast<const float*>(norm->data),
                                 .n = T,
                                 .c = C,
                                 .eps = geo_.rms_eps},
                                st_);
  }
  FERRY_TRY(
      be_.add({.out = f32(s_.x, {T, C}), .a = f32(s_.x, {T, C}), .b = f32(s_.tmp, {T, C})}, st_));
  if (norm == nullptr) return ok_status();
  return be_.rms_norm({.out = f32(s_.h, {T, C}),
                       .rstd = f32(s_.rstd, {T}),
                       .in = f32(s_.x, {T, C}),
                       .weight = *norm,
                       .eps = geo_.rms_eps},
                      st_);
}

Status CudaModelRunner::embed(std::int64_t T, const std::int32_t* d_ids) {
  const std::int64_t C = geo_.hidden;
  const ConstTensorView& table = params_.embed;
  if (table.dtype == DType::kBF16) {
    return device::embedding_bf16(arena_.as<float>(s_.x),
                                  static_cast<const std::uint16_t*>(table.data), d_ids, T, C,
                                  table.shape[0], st_);
  }
  return be_.embedding({.out = f32(s_.x, {T, C}),
                        .table = table,
                        .ids = ConstTensorView::contiguous(d_ids, DType::kI32, Device::kCuda, {T})},
                       st_);
}

bool CudaModelRunner::graph_eligible(const StepBatch& b, bool device_resolve) const {
  if (!cuda_graphs_ || !graph_stats_.disabled_reason.empty() || debug_sync_) return false;
  if (link_ == nullptr) return false;  // replays' copies could not be counted
  // Paged with device-side slot resolution has no host wait inside the step either.
  if (moe_layers_ > 0 && !experts_.runs_without_host() && !device_resolve) return false;
  if (hook_ != nullptr && !hook_->forces_ahead()) return false;
  // A decode step: every token is its sequence's one token of the step; and logits to read.
  return b.tokens() == std::int64_t(b.tables.size()) && !b.logit_rows.empty();
}

Status CudaModelRunner::enqueue_step(const StepBatch& b, std::int64_t stride, bool forced,
                                     bool device_resolve) {
  const std::int64_t T = b.tokens(), C = geo_.hidden, V = geo_.vocab;
  const std::int64_t S = static_cast<std::int64_t>(b.tables.size());
  auto* h = reinterpret_cast<std::int32_t*>(h_step_.data());
  if (forced) {
    // Every MoE layer's forced routing for the step in one copy (read by forced_routing).
    FERRY_TRY(te_.h2d(arena_.data(s_.forced), h_forced_.data(),
                      std::size_t(std::int64_t(moe_layers_) * T * geo_.top_k) * 4, st_));
  }
  std::int32_t* d = step_i32();
  FERRY_TRY(te_.h2d(d, h, std::size_t(3 * T + S * stride) * 4, st_));
  const kernels::cuda::PagedStep step{
      .seq_of = d + 2 * T, .pos = d + T, .tables = d + 3 * T, .table_stride = int(stride), .T = T};

  FERRY_TRY(embed(T, d));
  // Each layer: h = attn_norm(x); tmp = attention(h); x += tmp; h = mlp_norm(x); tmp = mlp/moe(h);
  // x += tmp. A residual add and the norm after it run as one launch (residual_add), so the next
  // layer's attn_norm comes with this layer's last add.
  if (geo_.layers > 0) {
    FERRY_TRY(be_.rms_norm({.out = f32(s_.h, {T, C}),
                            .rstd = f32(s_.rstd, {T}),
                            .in = f32(s_.x, {T, C}),
                            .weight = params_.layers[0].attn_norm,
                            .eps = geo_.rms_eps},
                           st_));
  }
  for (int l = 0; l < geo_.layers; ++l) {
    const auto& p = params_.layers[l];
    FERRY_TRY(attention(l, T, step));
    FERRY_TRY(residual_add(T, &p.mlp_norm));
    FERRY_TRY(geo_.layer_is_moe[l] ? moe(l, b) : mlp(l, T));
    FERRY_TRY(residual_add(T, l + 1 < geo_.layers ? &params_.layers[l + 1].attn_norm : nullptr));
  }
  // The step's slot resolution logs come back with the logits (same stream, same sync).
  if (device_resolve) FERRY_TRY(experts_.enqueue_device_log(st_));
  const std::int64_t R = static_cast<std::int64_t>(b.logit_rows.size());
  if (R == 0) return ok_status();
  FERRY_CHECK(R <= max_tokens_, "serve: {} logit rows for a {}-token plan", R, max_tokens_);
  for (std::int64_t r = 0; r < R; ++r) {
    const std::int32_t t = b.logit_rows[std::size_t(r)];
    FERRY_CHECK(t >= 0 && t < T, "serve: logit row {} outside the step", t);
    FERRY_TRY(te_.d2d(arena_.as<float>(s_.rows_x) + r * C, arena_.as<float>(s_.x) + t * C,
                      std::size_t(C) * 4, st_));
  }
  FERRY_TRY(be_.rms_norm({.out = f32(s_.rows_h, {R, C}),
                          .rstd = f32(s_.rows_rstd, {R}),
                          .in = f32(s_.rows_x, {R, C}),
                          .weight = params_.final_norm,
                          .eps = geo_.rms_eps},
                         st_));
  FERRY_TRY(dense_gemm({.out = f32(s_.logits, {R, V}),
                        .a = f32(s_.rows_h, {R, C}),
                        .b = params_.lm_head,
                        .trans_b = true},
                       st_));
  return te_.d2h(h_logits_.data(), arena_.data(s_.logits), std::size_t(R * V) * 4, st_);
}

Status CudaModelRunner::run_graph(const StepBatch& b, std::int64_t stride, bool forced,
                                  bool device_resolve) {
  ++graph_stats_.eligible_steps;
  GraphKey key{.T = b.tokens(),
               .stride = stride,
               .forced = forced,
               .device_resolve = device_resolve,
               .kv_base = kv_.data(),
               .kv_layer_stride = kv_.layer_stride_elems(),
               .logit_rows = b.logit_rows};
  auto it = std::find_if(graphs_.begin(), graphs_.end(),
                         [&](const StepGraph& g) { return g.key == key; });
  if (it == graphs_.end()) {
    // First sight of this shape: run it eagerly (cuBLASLt tunes and allocates its workspace
    // here, which a capture cannot do), capture it the next time.
    if (graphs_.size() >= kMaxGraphs) graphs_.erase(graphs_.begin());  // the least recent
    graphs_.push_back({.key = std::move(key)});
    ++graph_stats_.warmup_steps;
    return enqueue_step(b, stride, forced, device_resolve);
  }
  StepGraph g = std::move(*it);
  graphs_.erase(it);
  if (g.graph.empty()) {
    // Capture: nothing runs, but every host call happens once, so the counters move by one
    // step's copies and expert work; each later replay adds the same deltas.
    const auto& c = te_.counters();
    const std::uint64_t h2d0 = c.h2d_bytes, d2h0 = c.d2h_bytes, d2d0 = c.d2d_bytes;
    const ExecutorCounters e0 = experts_.counters();
    Result<mem::Graph> captured =
        mem::Graph::capture(st_, [&] { return enqueue_step(b, stride, forced, device_resolve); });
    if (!captured.ok()) {
      // Graphs off for this runner, said in graph_stats(); the step runs eagerly as without.
      graph_stats_.disabled_reason = captured.status().to_string();
      graphs_.clear();
      return enqueue_step(b, stride, forced, device_resolve);
    }
    g.graph = std::move(*captured);
    g.h2d = c.h2d_bytes - h2d0;
    g.d2h = c.d2h_bytes - d2h0;
    g.d2d = c.d2d_bytes - d2d0;
    const ExecutorCounters& e1 = experts_.counters();
    g.experts = {.groups = e1.groups - e0.groups,
                 .static_bytes_copied = e1.static_bytes_copied - e0.static_bytes_copied,
                 .expert_rows = e1.expert_rows - e0.expert_rows,
                 .cpu_misses = e1.cpu_misses - e0.cpu_misses,
                 .bypassed = e1.bypassed - e0.bypassed,
                 .host_syncs = e1.host_syncs - e0.host_syncs,
                 .device_resolved = e1.device_resolved - e0.device_resolved};
    ++graph_stats_.captures;
  } else {
    link_->count_replayed(mem::CopyKind::kHostToDevice, g.h2d);
    link_->count_replayed(mem::CopyKind::kDeviceToHost, g.d2h);
    link_->count_replayed(mem::CopyKind::kDeviceToDevice, g.d2d);
    experts_.count_replayed(g.experts);
    ++graph_stats_.replays;
  }
  const Status launched = g.graph.launch(st_);
  graphs_.push_back(std::move(g));  // most recent last
  return launched;
}

Status CudaModelRunner::forward(const StepBatch& b, float* logits) {
  const std::int64_t T = b.tokens(), V = geo_.vocab;
  if (T <= 0 || T > max_tokens_) {
    return invalid_argument("serve: step of {} tokens outside [1, {}]", T, max_tokens_);
  }
  FERRY_CHECK(b.positions.size() == b.ids.size() && b.seq_of.size() == b.ids.size(),
              "serve: step batch fields disagree");
  // A forcing hook's routes first: they bound each MoE layer's distinct experts.
  const bool forced = hook_ != nullptr && hook_->forces_ahead() && moe_layers_ > 0;
  auto* h_forced = reinterpret_cast<std::int32_t*>(h_forced_.data());
  if (forced) FERRY_TRY(fill_forced_routing(*hook_, b, geo_, h_forced));
  // Paged decode steps whose experts fit every MoE layer's free slots resolve slots on the device
  // (no host wait inside: graph-eligible); this uploads stale layer state first (compute stream).
  const std::int64_t S = static_cast<std::int64_t>(b.tables.size());
  bool device_resolve = false;
  if (moe_layers_ > 0 && T == S && !b.logit_rows.empty()) {
    std::span<const std::int64_t> bounds;
    if (forced) {
      for (int l = 0; l < geo_.layers; ++l) {
        if (!geo_.layer_is_moe[std::size_t(l)]) continue;
        expert_bound_[std::size_t(l)] = routed_experts_bound(
            h_forced + std::int64_t(moe_index_[std::size_t(l)]) * T * geo_.top_k, T, geo_.top_k,
            route_seen_);
      }
      bounds = expert_bound_;
    }
    FERRY_ASSIGN_OR_RETURN(device_resolve, experts_.begin_device_step(T, bounds));
  }
  const bool graph = graph_eligible(b, device_resolve);
  // Step inputs: [ids T | positions T | seq_of T | tables S x stride], one copy up. A graph's
  // step keeps one stride (the pool's capacity) so its shape does not change as sequences grow.
  std::int64_t stride = 1;
  for (const BlockTable* t : b.tables) {
    stride = std::max<std::int64_t>(stride, static_cast<std::int64_t>(t->blocks.size()));
  }
  if (graph) stride = std::max<std::int64_t>(stride, kv_.capacity_blocks());
  FERRY_CHECK(S * stride <= table_capacity_, "serve: {} tables of {} blocks exceed the plan", S,
              stride);
  auto* h = reinterpret_cast<std::int32_t*>(h_step_.data());
  std::copy(b.ids.begin(), b.ids.end(), h);
  std::copy(b.positions.begin(), b.positions.end(), h + T);
  std::copy(b.seq_of.begin(), b.seq_of.end(), h + 2 * T);
  for (std::int64_t s = 0; s < S; ++s) {
    const auto& blocks = b.tables[std::size_t(s)]->blocks;
    std::int32_t* row = h + 3 * T + s * stride;
    std::copy(blocks.begin(), blocks.end(), row);
    std::fill(row + blocks.size(), row + stride, 0);
  }
  for (std::int64_t t = 0; t < T; ++t) {
    const BlockTable& table = *b.tables[std::size_t(b.seq_of[std::size_t(t)])];
    FERRY_CHECK(
        b.positions[std::size_t(t)] >= 0 &&
            b.positions[std::size_t(t)] < std::int64_t(table.blocks.size()) * kv_.block_tokens(),
        "serve: position {} is not covered by its block table", b.positions[std::size_t(t)]);
  }
  Status ran = graph ? run_graph(b, stride, forced, device_resolve)
                     : enqueue_step(b, stride, forced, device_resolve);
  ++host_syncs_;  // the step's one read-back (or, with no logits rows, its plain sync)
  // The pinned step buffers are free again after this sync.
  if (ran.ok()) ran = st_.synchronize();
  if (device_resolve) {
    if (!ran.ok()) {
      experts_.cancel_device_step();
      return ran;
    }
    // The pager replays the device's decisions (and checks them); the device's copies join the
    // link's counters (no host call made them).
    FERRY_ASSIGN_OR_RETURN(const std::uint64_t copied, experts_.finish_device_step());
    if (link_ != nullptr) link_->count_replayed(mem::CopyKind::kHostToDevice, copied);
  }
  FERRY_TRY(ran);
  const std::int64_t R = static_cast<std::int64_t>(b.logit_rows.size());
  if (R > 0) std::memcpy(logits, h_logits_.data(), std::size_t(R * V) * 4);
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<ModelRunner>> ModelRunner::create_cuda(
    const model::DecoderGeometry& geo, const model::ModelParams& params, KvCache& kv,
    ExpertExecutor& experts, std::int64_t max_tokens, kernels::Backend& backend,
    const float* d_inv_freq, mem::Stream& stream, mem::TransferEngine& te,
    mem::MemoryBudget* shared, std::int64_t max_logit_rows) {
  if (max_tokens <= 0) return invalid_argument("serve: max_tokens must be positive");
  if (backend.device() != Device::kCuda || stream.device() != Device::kCuda) {
    return invalid_argument("serve: the CUDA runner needs a CUDA backend and a CUDA stream");
  }
  if (static_cast<int>(params.layers.size()) != geo.layers) {
    return invalid_argument("serve: {} layer parameter sets for {} layers", params.layers.size(),
                            geo.layers);
  }
  if (kv.tier() != mem::MemTier::kDevice || (geo.experts > 0 && !experts.on_device())) {
    return invalid_argument(
        "serve: the CUDA runner needs the KV pool in GPU memory and a device expert executor");
  }
  if (geo.head_dim > 256) {
    return unimplemented("serve: CUDA paged attention supports head dim <= 256, got {}",
                         geo.head_dim);
  }
  auto r = std::make_unique<CudaModelRunner>(geo, params, kv, experts, max_tokens, backend,
                                             d_inv_freq, stream, te);
  FERRY_TRY(r->init(shared, max_logit_rows));
  return std::unique_ptr<ModelRunner>(std::move(r));
}

}  // namespace ferry::serve
