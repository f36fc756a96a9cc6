// SPDX-License-Identifier: Apache-2.0
// `ferry bench serve`'s measurement: for each expert mode, one fresh Engine on the same weights,
// the same prompt and the same forced routing runs a prefill of P tokens (one step) and a
// single-stream greedy decode of D tokens (D one-token steps), and reports per phase: tokens/s,
// expert hit rate, host->device bytes per token, link utilisation against a roofline, copy syncs
// per token, and the device tier's peak against its budget.
// Definitions (also written into the JSON):
//   h2d bytes       the host transfer engine's host->device bytes (expert misses, static bulk
//                   copies); the emulated device tier's only H2D traffic.
//   roofline %      (h2d bytes / link rate) / phase wall time: the share of the phase the link
//                   is busy; equal to tokens/s divided by the roofline tokens/s = link rate /
//                   (h2d bytes per token). null when a phase moves no bytes.
//   copy syncs      host syncs of expert copies: one per pager miss batch (PagerCounters::
//                   copy_batches) and one per static bulk layer copy. Other host syncs (logits,
//                   sampling) are not counted by the engine.
// Sizing: with expert_slots, every MoE layer gets that many slots and the device budget is the KV
// pool plus those slots. With budget_bytes (the total accelerator budget), dense weights and the
// KV pool (sized for P + D + 1 tokens) are taken off first and the rest is expert slots,
// equal per layer (expert_fraction sets the budget from the share of experts instead). resident
// runs without the budget (the reference). A mode that does not fit (static's one-layer staging,
// or an engine whose creation runs out of memory, e.g. resident's every expert on a GPU too
// small for them) is reported as skipped with the reason. Every mode's token ids and logits bits
// are compared with the first mode run (engine property, docs/serve.md "Byte identity"). Pacing:
// link_gbps > 0 sets mem::set_host_link_rate for the runs (link_pacer.h) and restores it
// afterwards. Not thread-safe (global pacing, global pool).
//
// CUDA (backend = a CUDA backend): every mode runs the CUDA engine (docs/serve.md "CUDA path"),
// whose one device budget also holds the dense weights (in dense_dtype), the expert pointer tables
// and the activations. A probe engine (paged, top-k slots, no budget, no steps) measures those
// fixed bytes (dense + KV + tables + activations = its peak - its slots); the budget is fixed bytes
// + expert slots (with budget_bytes: the slots are what is left after the fixed bytes). h2d bytes
// are then every H2D byte of the engine's CUDA transfer engine (expert copies, step inputs,
// pointer tables, the routing hook's ids, cpu-experts' rows); expert_h2d_bytes the expert copies
// alone. host syncs are counted where the host waits on the device: one per step (logits), one per
// MoE layer for the routing hook (a trace is replayed through it), one per MoE layer for the
// routed ids (paged, cpu-experts). Pager copy batches and static's bulk copies are ordered by
// events (no host sync), so copy_syncs is 0 there. Pacing on CUDA: link_gbps > 0 sets
// EngineConfig::link_pace_gbps (serve/link_engine.h: the copy stream, i.e. expert copies, held to
// that rate by timed waits on the stream); the step inputs and tables on the compute stream are
// not paced. Decode steps without a host wait inside (resident, static) run as CUDA graphs unless
// cuda_graphs is false; each mode reports its GraphStats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "kernels/backend.h"
#include "model/model_compute.h"
#include "serve/cpu_expert_rate.h"
#include "serve/link_engine.h"
#include "serve/model_runner.h"
#include "serve/routing_trace.h"
#include "serve/serve_config.h"

namespace ferry::serve::bench {

struct ServeBenchConfig {
  std::vector<ExpertMode> modes;     // run in this order; the first that runs is the reference
  std::vector<std::int32_t> prompt;  // P ids
  int decode_tokens = 64;            // D
  int expert_slots = 0;              // > 0: slots per MoE layer
  std::size_t budget_bytes = 0;      // else: total device budget (dense + KV + experts)
  std::size_t dense_bytes = 0;       // non-expert weight bytes charged to budget_bytes
  // Else, > 0: budget_bytes = dense_bytes + the KV pool + this fraction of all experts' bytes
  // (a scaled geometry's default: the share of experts the target budget holds on the target).
  double expert_fraction = 0;
  std::size_t all_expert_bytes = 0;  // with expert_fraction
  EvictionPolicy policy = EvictionPolicy::kLru;
  // Paged miss placement (serve_config.h): the cost model prices copies at link_gbps (or, unpaced,
  // roofline_gbps) against cpu_gflops; bypass_window > 0 turns bypass admission on.
  bool miss_cost_model = false;
  double cpu_gflops = 50;
  bool measure_cpu_gflops = false;  // PagerConfig::measure_cpu_gflops (--cpu-gflops auto)
  int bypass_window = 0;
  bool overlap_misses = true;  // PagerConfig::overlap_misses (CUDA paged)
  bool device_resolve = true;  // PagerConfig::device_resolve (paged decode slots on the device)
  // PagerConfig::cpu_expert_kernel (cpu-experts: fast or exact CPU expert FFN; kDefault: the
  // engine's choice, fast on CUDA, exact on the CPU engine).
  CpuExpertKernel cpu_expert_kernel = CpuExpertKernel::kDefault;
  DType expert_dtype = DType::kF32;  // PagerConfig::expert_dtype (bf16: CUDA only)
  // EngineConfig::dense_dtype (both engines). dense_bytes above must be counted in it
  // (dense_weights.h dense_weight_bytes); the CUDA engine's probe measures it on the device.
  DType dense_dtype = DType::kF32;
  // KvConfig::dtype (both engines): bf16 halves the pool the request needs (kv_bytes), which the
  // budget then gives to expert slots.
  DType kv_dtype = DType::kF32;
  double link_gbps = 0;  // > 0: pace H2D copies (emulated tier, or CUDA's copy stream) to it (GB/s)
  bool cuda_graphs = true;              // EngineConfig::cuda_graphs (CUDA decode steps as graphs)
  double roofline_gbps = 0;             // the rate the roofline is computed against (> 0)
  const RoutingTrace* trace = nullptr;  // forced routing of request 0 (null: the router's own)
  int kv_block_tokens = 16;
  kernels::Backend* backend = nullptr;  // null: the CPU engine; a CUDA backend: the CUDA engine
  // The model's experts already packed (PagerConfig::host_store; caller-owned): every engine of
  // the run reads this one store instead of packing its own from the weight views.
  const ExpertStore* host_store = nullptr;
};

struct PhaseResult {
  std::int64_t tokens = 0;
  double seconds = 0;
  std::uint64_t h2d_bytes = 0;
  std::uint64_t hits = 0, misses = 0;  // paged only; misses include those computed on the host
  // paged misses computed from host memory (no copy; miss placement's cost model or bypass); on
  // CUDA their rows (C floats each) are what crosses the link instead of the expert
  std::uint64_t host_misses = 0;
  std::uint64_t copy_syncs = 0;
  std::uint64_t expert_h2d_bytes = 0;  // pager miss copies + static bulk copies
  std::uint64_t host_syncs = 0;        // CUDA: every host wait on the device (see above)
  std::uint64_t steps = 0;
  double paced_wait_s = 0;
  double tokens_per_s() const { return seconds > 0 ? double(tokens) / seconds : 0.0; }
};

struct ModeResult {
  ExpertMode mode = ExpertMode::kResident;
  bool ran = false;
  std::string skipped;  // why not, when !ran
  bool under_budget = true;
  PhaseResult prefill, decode;
  std::vector<std::int32_t> tokens;  // greedy ids
  std::uint64_t logits_hash = 0;     // FNV-1a over every sampled logits row's bits
  std::size_t device_budget_bytes = 0, device_peak_bytes = 0, expert_device_bytes = 0;
  int slots_per_layer = 0;  // paged
  GraphStats graphs;        // CUDA: decode steps as graphs (Engine::graph_stats)
  LinkPaceStats pace;       // CUDA with link_gbps: the paced copies (LinkEngine::pace_stats)
  std::uint64_t device_resolved = 0;  // paged: MoE layer calls resolved on the device (or twin)
  CpuExpertKernel cpu_expert_kernel = CpuExpertKernel::kExact;  // cpu-experts: what ran
  // paged with miss placement: the cost model's CPU rate (configured or measured) and, with
  // measure_cpu_gflops, the measurement (serve/cpu_expert_rate.h)
  double placement_cpu_gflops = 0;
  std::optional<CpuExpertRate> measured_cpu_rate;
};

struct ServeBenchReport {
  ServeBenchConfig config;
  std::size_t expert_bytes = 0, kv_bytes = 0, expert_budget_bytes = 0, device_budget_bytes = 0;
  int slots_per_layer = 0, moe_layers = 0;
  bool cuda = false;
  // CUDA: dense weights + KV + pointer tables + activations, measured by the probe engine.
  std::size_t device_fixed_bytes = 0;
  std::size_t dense_device_bytes =
      0;  // CUDA: the probe's dense weights (Engine::device_weight_bytes)
  std::vector<ModeResult> modes;
};

// Fails (invalid_argument / resource_exhausted) before running anything when the sizing is
// impossible (budget below dense + KV, fewer than top-k slots, a dense model, ...).
Result<ServeBenchReport> run_serve_bench(const model::DecoderGeometry& geo,
                                         const model::ModelParams& params,
                                         const ServeBenchConfig& cfg);

// GB/s of a plain host memcpy of 64 MiB (the emulated tier's copy rate without pacing).
double measure_host_copy_gbps();

// GB/s of a pinned host -> GPU 0 copy of 256 MiB through the CUDA transfer engine (best of 5);
// unavailable without CUDA or a GPU. pace_gbps > 0: through a LinkEngine pacing the copy stream
// to that rate (chunk_bytes as EngineConfig::link_pace_chunk_bytes), i.e. the paced link's
// measured rate (at most pace_gbps).
Result<double> measure_pinned_h2d_gbps(double pace_gbps = 0, std::size_t chunk_bytes = 16ull << 20);

// The report's JSON (definitions included); ratios are null where a mode is missing.
Json report_json(const ServeBenchReport& r);

}  // namespace ferry::serve::bench
