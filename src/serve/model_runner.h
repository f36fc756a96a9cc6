// SPDX-License-Identifier: Apache-2.0
// ModelRunner: one forward pass of a scheduler step — any mix of prefill chunks and decode tokens
// from several sequences — over the paged KV cache, in f32, on a CPU backend (this file) or a
// CUDA backend (create_cuda, model_runner_cuda.cpp: same steps, device buffers, CUDA kernels
// for the KV writes and paged attention).
// One layer, top to bottom (shapes: T step tokens, C hidden, H/G heads, D head dim, K top-k):
//   h1 = rms_norm(x); q,k,v = h1 W^T (+b); [q/k norm]; rope(q, k at each token's position)
//   write k, v rows into the cache at (sequence, position); o = paged_attention(q, cache)
//   x += o Wo^T; h2 = rms_norm(x)
//   dense: x += mlp(h2)
//   moe:   ids, w = router(h2 Wr^T); [routing hook may record / force ids]; eout = experts(h2)
//          through the ExpertExecutor (any mode); x += combine(eout, w) in routing order
// then logits = lm_head(final_norm(x[rows])) for the rows the step samples from.
// Memory is planned: every buffer is sized for max_tokens at create(); forward() never allocates
// (the executor's per-group bookkeeping aside). Not thread-safe.
// Golden tests: tests/unit/serve/runner_golden_test.cpp (HF fixtures, prefill, chunked prefill and
// token-by-token decode against transformers' full forward).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "kernels/backend.h"
#include "mem/budget.h"
#include "mem/transfer_engine.h"
#include "model/model_compute.h"
#include "serve/expert_executor.h"
#include "serve/kv_cache.h"
#include "serve/routing_trace.h"

namespace ferry::serve {

// A step's tokens, packed. Tokens of one sequence are contiguous with consecutive positions, and
// the sequence's table covers them (KvCache::reserve) before forward().
struct StepBatch {
  std::vector<std::int32_t> ids;          // [T]
  std::vector<std::int32_t> positions;    // [T]
  std::vector<std::int32_t> seq_of;       // [T] index into tables / requests
  std::vector<const BlockTable*> tables;  // [S]
  std::vector<std::int64_t> requests;     // [S] request ids (routing trace keys)
  std::vector<std::int32_t> logit_rows;   // rows of the batch to compute logits for
  void clear();
  std::int64_t tokens() const { return static_cast<std::int64_t>(ids.size()); }
};

// The router's top-k weights for given ids: probs[ids[k]] in k order, divided by their f32 sum
// (summed in k order) when renormalize — the same arithmetic as the CPU router, so ids equal to
// the router's give its weights bit for bit (tested).
void weights_for_ids(const float* probs, std::span<const std::int32_t> ids, bool renormalize,
                     float* weights);

// Runs the routing hook over a step's host-side routing of one layer: ids [T, K] may be changed
// (checked: in [0, E), distinct per row), and a changed row gets weights_for_ids() of probs
// [T, E]. before: [K] scratch. Shared by the CPU and CUDA runners.
Status apply_routing_hook(RoutingHook& hook, const StepBatch& b, int layer,
                          const model::DecoderGeometry& geo, std::int32_t* ids, const float* probs,
                          float* weights, std::int32_t* before);

// A step's forced routing, asked of a hook that forces_ahead() before the forward pass (so the
// CUDA runner uploads it in one copy and no MoE layer waits on the host): forced
// [moe_layers, T, K], MoE layers in layer order, each row the hook's experts for (request,
// position, layer), or K x -1 where it keeps the router's choice. Checked here as
// apply_routing_hook checks them (in [0, E), distinct per row); the hook is called in the order
// apply_routing_hook calls it (layer, then token).
Status fill_forced_routing(RoutingHook& hook, const StepBatch& b, const model::DecoderGeometry& geo,
                           std::int32_t* forced);
// At most how many different experts one MoE layer's call of a step routes to, from its forced
// rows (forced [T, K] of fill_forced_routing): the forced rows' distinct experts plus K for each
// row the router still chooses (-1 rows). The device slot resolver needs distinct experts, not
// rows, to fit the free slots (4 decoding requests x top-8 are 32 rows, often ~20 experts).
// seen: scratch of >= E bytes, left zeroed.
std::int64_t routed_experts_bound(const std::int32_t* forced, std::int64_t T, int K,
                                  std::vector<unsigned char>& seen);
// Applies one MoE layer's forced rows (forced [T, K]) to the router's output in place, as
// apply_routing_hook does: a row of -1 or one equal to the router's ids is left alone; another
// replaces ids [T, K] and gets weights_for_ids() of probs [T, E] in weights [T, K]. The CPU twin
// of the CUDA runner's forced_routing kernel (bit-equal: tests/gpu/serve_gpu_test.cpp).
void apply_forced_rows(const std::int32_t* forced, std::int64_t T, int K, std::int64_t E,
                       bool renormalize, const float* probs, std::int32_t* ids, float* weights);

// The CUDA runner's decode-step graphs (model_runner_cuda.cpp): steps run eagerly (graph
// eligible but a shape seen for the first time: the warm-up that tunes cuBLASLt and allocates its
// workspace), captured, and replayed; disabled_reason says why graphs were turned off for the
// runner (a capture failed), empty otherwise.
struct GraphStats {
  std::uint64_t eligible_steps = 0, warmup_steps = 0, captures = 0, replays = 0;
  std::string disabled_reason;
};

class ModelRunner {
 public:
  // The CPU runner (a CPU backend; unimplemented for others: see create_cuda).
  static Result<std::unique_ptr<ModelRunner>> create(const model::DecoderGeometry& geo,
                                                     const model::ModelParams& params, KvCache& kv,
                                                     ExpertExecutor& experts,
                                                     std::int64_t max_tokens,
                                                     kernels::Backend& backend);
  // The CUDA runner (model_runner_cuda.cpp). `params`: device views (DeviceWeights), experts
  // empty unless resident; d_inv_freq: the rope table on the device; kv: a pool in GPU memory;
  // experts: created with an ExpertDevice on the same streams. Every op is enqueued on `stream`
  // (a CUDA stream of the backend's device, owned by the caller and outliving the runner); the
  // activations live in one kDevice arena sized for max_tokens here, charged to `shared` (the
  // engine's device budget, may be null) as "activations". forward() copies back only the
  // logits rows it is asked for and returns once they are in `logits` (one stream sync; paged and
  // cpu-experts modes add one per MoE layer for the routed ids — not paged decode steps whose
  // slots are resolved on the device, ExpertExecutor::begin_device_step — a routing hook that
  // does not forces_ahead() one more). With `te` the engine's LinkEngine, decode steps without a
  // host wait inside are replayed as CUDA graphs (set_cuda_graphs; model_runner_cuda.cpp).
  // bf16 dense weights (views of dtype bf16): decode GEMMs run the small-m kernel's bf16 twin,
  // larger ones widen the weight into a "dense widen" slot of the activations arena sized for the
  // largest such weight — the lm_head's only when more than 4 logits rows can come at once
  // (max_logit_rows: the most sequences sampled per step; 0: max_tokens).
  static Result<std::unique_ptr<ModelRunner>> create_cuda(
      const model::DecoderGeometry& geo, const model::ModelParams& params, KvCache& kv,
      ExpertExecutor& experts, std::int64_t max_tokens, kernels::Backend& backend,
      const float* d_inv_freq, mem::Stream& stream, mem::TransferEngine& te,
      mem::MemoryBudget* shared, std::int64_t max_logit_rows = 0);
  virtual ~ModelRunner() = default;

  // logits: [batch.logit_rows.size(), V] f32, host memory.
  virtual Status forward(const StepBatch& batch, float* logits);

  void set_routing_hook(RoutingHook* hook) { hook_ = hook; }
  // CUDA runner: decode steps captured as CUDA graphs and replayed (EngineConfig::cuda_graphs);
  // the CPU runner ignores it.
  void set_cuda_graphs(bool on) { cuda_graphs_ = on; }
  const GraphStats& graph_stats() const { return graph_stats_; }
  // EngineConfig::batch_invariant: dense GEMMs row by row in dot_fixed order (CPU runner).
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  std::int64_t max_tokens() const { return max_tokens_; }
  const model::DecoderGeometry& geometry() const { return geo_; }
  // Host waits on the device in forward() (CUDA runner: the logits read-back, one per step, and
  // the routing hook's round trip, one per MoE layer); 0 on the CPU runner. The expert
  // executor's own syncs are ExecutorCounters::host_syncs.
  std::uint64_t host_syncs() const { return host_syncs_; }

 protected:
  ModelRunner(const model::DecoderGeometry& geo, const model::ModelParams& params, KvCache& kv,
              ExpertExecutor& experts, std::int64_t max_tokens, kernels::Backend& backend)
      : geo_(geo),
        params_(params),
        kv_(kv),
        experts_(experts),
        max_tokens_(max_tokens),
        be_(backend) {}

 private:
  Status attention(int l, const StepBatch& b);
  Status mlp(int l, std::int64_t T);
  Status moe(int l, const StepBatch& b);
  // The backend's, or row by row (batch_invariant_); a bf16 b (dense_dtype) is widened into
  // widen_ first (or read by dot_fixed's bf16 twin when batch-invariant).
  Status gemm(const kernels::GemmArgs& a);
  Status embed(const StepBatch& b);  // x_ = the step's embedding rows (a bf16 table widened)

 protected:
  model::DecoderGeometry geo_;
  const model::ModelParams& params_;
  KvCache& kv_;
  ExpertExecutor& experts_;
  std::int64_t max_tokens_;
  kernels::Backend& be_;
  RoutingHook* hook_ = nullptr;
  bool batch_invariant_ = false;
  std::uint64_t host_syncs_ = 0;
  bool cuda_graphs_ = true;
  GraphStats graph_stats_;
  // [L] index of each MoE layer among the MoE layers (-1: dense), and their count.
  std::vector<int> moe_index_;
  int moe_layers_ = 0;
  void index_moe_layers();

 private:
  // Planned buffers (see create()).
  std::vector<float> x_, h_, rstd_, q_pre_, k_pre_, q_, k_, v_, attn_, tmp_;  // [T, ...]
  std::vector<float> qk_rstd_;
  std::vector<float> gate_, up_, act_;                  // [T, F]
  std::vector<float> router_logits_, probs_, weights_;  // [T, E], [T, E], [T, K]
  std::vector<std::int32_t> ids_, before_, identity_;   // [T, K]
  std::vector<std::int32_t> forced_;                    // [moe layers, T, K] (forces_ahead hooks)
  std::vector<float> eout_;                             // [T*K, C]
  std::vector<float> rows_x_, rows_h_, rows_rstd_;      // [T, C], [T, C], [T]
  std::vector<float> widen_;  // [largest bf16 dense weight] f32 (bf16 dense weights only)
};

}  // namespace ferry::serve
