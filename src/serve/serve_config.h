// SPDX-License-Identifier: Apache-2.0
// Plain configuration structs of the serving engine, filled by the CLI (or a test) and validated
// once by Engine::create. Libraries take these, never argv.
//   ExpertMode   where routed experts are computed from (docs/serve.md "modes")
//   PagerConfig  the expert pager's size, policy and pinned hot set
//   KvConfig     the paged KV cache's block size and byte budget
//   EngineConfig the scheduler's limits plus the two above
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"

namespace ferry::serve {

class ExpertStore;

enum class ExpertMode : std::uint8_t {
  kResident,    // every expert read in place (the model's own weight views); the reference
  kStatic,      // each MoE layer's experts copied in bulk to a device staging area every forward
  kCpuExperts,  // experts computed from the packed host store (llama.cpp --n-cpu-moe)
  kPaged,       // the expert pager: per-layer slot caches over the device tier
};

enum class EvictionPolicy : std::uint8_t {
  kLru,   // least recently used (default)
  kLfu,   // least frequently used while resident, ties by recency
  kLfru,  // frequency decayed by recency (LRFU): score = score * 2^(-age/half_life) + 1
};

// How cpu-experts computes routed experts on the CPU (docs/serve.md "The fast CPU expert path").
enum class CpuExpertKernel : std::uint8_t {
  kDefault,  // the engine's choice: kFast on the CUDA engine, kExact on the CPU engine
  kExact,    // expert_ffn_row per routed row (expert_ffn.h): the CPU engine's bit-identity path
  kFast,     // ExpertFfnGrouped (expert_ffn_fast.h): the step's rows grouped by expert, weight
             // rows split across the thread pool, SIMD; within a tolerance of kExact
};

std::string_view to_string(ExpertMode m);
std::string_view to_string(EvictionPolicy p);
std::string_view to_string(CpuExpertKernel k);
Result<ExpertMode> parse_expert_mode(std::string_view s);
// "f32" or "bf16" (PagerConfig::expert_dtype); anything else is invalid_argument.
Result<DType> parse_expert_dtype(std::string_view s);
// "f32" or "bf16" (EngineConfig::dense_dtype); anything else is invalid_argument.
Result<DType> parse_dense_dtype(std::string_view s);
Result<EvictionPolicy> parse_eviction_policy(std::string_view s);
// "fast" or "exact" (PagerConfig::cpu_expert_kernel); anything else is invalid_argument.
Result<CpuExpertKernel> parse_cpu_expert_kernel(std::string_view s);

struct PagerConfig {
  ExpertMode mode = ExpertMode::kResident;
  EvictionPolicy policy = EvictionPolicy::kLru;
  // Slots per MoE layer. layer_slots (indexed by layer, entries of dense layers ignored) wins over
  // slots_per_layer, which wins over budget_bytes. All zero / empty: every expert gets a slot.
  int slots_per_layer = 0;
  std::vector<int> layer_slots;
  // Hard byte budget of the device tier the pager (or static staging) allocates from.
  // 0: exactly what the chosen slots need. With no slot count, the slots are what fits.
  std::size_t budget_bytes = 0;
  // Pinned hot set: hot_experts[layer] are loaded at start and never evicted (count against cap).
  std::vector<std::vector<int>> hot_experts;
  int lfru_half_life = 8;  // accesses of a layer after which an LFRU score halves
  // MV-WSA (paged mode): the caps may be resized while serving, up to E per layer; the slots are
  // laid out for E per layer in a virtual reservation of which only the live caps are committed
  // (expert_pager.h), and the device budget is charged the live caps only.
  bool resizable = false;
  // Resizable only: the reservation's granule (0: the tier's, 2 MiB; host memory accepts any
  // multiple of 4 KiB, which tests use to see commits follow a tiny model's caps).
  std::size_t granularity_bytes = 0;
  // Per-miss placement (paged mode, docs/serve.md "Miss placement"). A miss is copied into a slot
  // (the default) unless
  //   miss_cost_model: computing its rows on the CPU from the host store is cheaper than the
  //     copy: rows * 6*C*F / (cpu_gflops * 1e9) < expert_bytes / (link_gbps * 1e9) seconds;
  //   bypass_window > 0 (bypass admission): the layer has no free slot (admitting would evict a
  //     resident expert) and the expert was not used in the layer's last bypass_window steps —
  //     a one-off is computed from the host instead; its next use within the window is admitted.
  // The CPU engine computes both placements with expert_ffn_row on the same rows (bits equal).
  // The CUDA engine computes them on the CPU (cpu_expert_kernel: the fast kernel by default)
  // while the GPU copies the other misses and runs the slot rows, then copies the rows up: not
  // bit-identical to the GPU rows (flagged: ExecutorCounters::cpu_misses / bypassed).
  bool miss_cost_model = false;
  double link_gbps = 24;
  double cpu_gflops = 50;  // an assumption unless measure_cpu_gflops
  // miss_cost_model: replace cpu_gflops at create by this machine's measured rate
  // (serve/cpu_expert_rate.h: the host path's kernel timed on one row of one expert, over
  // distinct experts of the host store; `--cpu-gflops auto`). ExpertExecutor::measured_cpu_rate.
  bool measure_cpu_gflops = false;
  int bypass_window = 0;
  // CUDA engine, paged mode: a group's misses are copied in one batch on the copy stream while
  // compute runs the rows of its resident experts, then each missed expert's rows as soon as its
  // own copy has landed (an event per copy, no host sync). false: compute waits for the whole
  // batch before the group's one launch (the serial order; kept to measure the overlap against).
  // Same bits either way. The CPU engine's copies are synchronous and ignore it.
  bool overlap_misses = true;
  // Paged mode, LRU or LFU, no miss placement: a layer call whose routed rows fit the free slots
  // (T*K <= cap - hot) resolves its slots without the host pager's acquire
  // (serve/device_resolver.h): the CUDA engine's decode steps on the device with no host sync
  // (so they can be CUDA graphs), the CPU engine through the CPU twin. The host pager replays
  // every such call (same decisions, counters, observers), so outputs and counters equal the
  // host path's. false: always the host path (ferry bench serve --no-device-resolve, the A/B).
  bool device_resolve = true;
  // How routed experts are stored and read: kF32, or kBF16 (CUDA engine only: the host store,
  // the slots / staging / resident copy and the PCIe bytes are bf16, half of f32's; expert_ffn
  // widens each weight and accumulates in f32). Every mode reads the same bf16 bits, so the modes
  // stay bit-identical to each other; against f32 weights the difference is the rounding of the
  // weights to bf16. Dense weights: EngineConfig::dense_dtype; K/V and activations stay f32. The
  // CPU engine refuses kBF16.
  DType expert_dtype = DType::kF32;
  // The packed host store the non-resident modes read experts from, owned by the caller (it
  // must outlive the engine, have expert_dtype and the model's geometry, and hold the bits the
  // model's expert views convert to). null: the engine packs its own from the model's views.
  // Lets several engines share one host copy (bench serve builds the 48-layer model's bf16
  // experts once, straight into a store: builtin_model.h make_builtin_moe_packed).
  const ExpertStore* host_store = nullptr;
  // cpu-experts mode, and the CUDA engine's paged misses computed on the host (miss placement;
  // the CPU engine's stay on expert_ffn_row; other modes ignore it): kExact runs expert_ffn_row
  // per row, the arithmetic every other mode shares, so on the CPU engine cpu-experts stays
  // bit-identical to them; kFast runs expert_ffn_fast.h (all cores on distinct weight rows, SIMD,
  // tokens sharing an expert share its row loads): a different summation order, within the
  // tolerance rule. The CUDA engine's cpu-experts is never bit-identical to its GPU modes, so there
  // kDefault = kFast; on the CPU engine kDefault = kExact. ferry serve / bench serve
  // --cpu-expert-kernel.
  CpuExpertKernel cpu_expert_kernel = CpuExpertKernel::kDefault;
};

struct KvConfig {
  int block_tokens = 16;                   // tokens per KV block
  std::size_t budget_bytes = 64ull << 20;  // K and V of every layer, all blocks
  // MV-WSA: the pool may later be resized up to this many bytes (KvCache::resize); it is laid
  // out for that many blocks in a virtual reservation of which only the live blocks are
  // committed (kv_cache.h). 0: budget_bytes (fixed size, one exact allocation).
  std::size_t max_budget_bytes = 0;
  // Resizable only: the reservation's granule (as PagerConfig::granularity_bytes).
  std::size_t granularity_bytes = 0;
  // Automatic prefix caching (kv_cache.h): full blocks keep their K/V after their request ends,
  // keyed by a hash chained over token ids, and a new request reuses its longest cached
  // block-aligned prefix. The CLI turns it on (--no-prefix-cache off); off here by default so a
  // library user's schedule is the plain one unless asked.
  bool prefix_cache = false;
  // How K and V are stored: kF32, or kBF16 -- half the bytes per block (twice the blocks for a
  // budget), each row rounded to nearest even when written and widened exactly when read, so
  // attention's arithmetic is the f32 cache's on the rounded rows (kv_cache.h; on CUDA kv_write,
  // the fused cache write and both paged attention kernels take either). Every expert mode
  // shares the cache, so the modes stay bit-identical to each other.
  DType dtype = DType::kF32;
};

// "f32" or "bf16" (KvConfig::dtype); anything else is invalid_argument.
Result<DType> parse_kv_dtype(std::string_view s);

struct EngineConfig {
  PagerConfig pager;
  KvConfig kv;
  // One hard device budget over the KV pool and the expert slots / staging together (each also
  // keeps its own limit above); its peak is reported. 0: unlimited (only the parts' limits).
  std::size_t device_budget_bytes = 0;
  int max_batch_tokens = 64;     // tokens per step: decode tokens first, then prefill chunks
  int max_running = 4;           // sequences decoded concurrently (continuous batching)
  std::uint64_t seed = 0x5e12e;  // for requests without a sampling seed
  // KV admission. false: reserve prompt + max_new_tokens at admission (a running request never
  // waits). true: reserve what is computed now and grow block by block; a decode step whose
  // block cannot be had preempts the youngest running request (blocks freed, re-queued first,
  // recomputed on re-admission with its tokens and Rng kept, so its output is unchanged).
  bool kv_preempt = false;
  int max_seq_len = 0;  // prompt + new tokens; 0: no limit but the KV pool (the CLI passes
                        // max_position_embeddings)
  // Every dense GEMM of the forward pass one row at a time in a fixed summation order
  // (dot_fixed, expert_ffn.h) instead of BLAS, so a token's bits do not depend on which other
  // tokens share its step (OpenBLAS sgemm rounds a row differently by its place in the tile).
  // Slower; what makes outputs with the prefix cache bit-identical to those without it.
  bool batch_invariant = false;
  // CUDA engine: link pacing (serve/link_engine.h). > 0: host->device copies on the copy stream
  // (pager misses, static bulk copies) are held to this many GB/s, in chunks of
  // link_pace_chunk_bytes, by timed waits on that stream (PCIe Gen4 ~24 GB/s on a faster link).
  // 0: the real link's rate. The CPU engine refuses it (its emulated link has mem/link_pacer.h).
  double link_pace_gbps = 0;
  std::size_t link_pace_chunk_bytes = 16ull << 20;
  // CUDA engine: decode steps (every token of the step is its sequence's one decode token)
  // without a host sync inside the layer loop — resident and static modes, no access observer,
  // no routing hook or one that forces_ahead() — are captured once as a CUDA graph per step
  // shape and replayed (docs/serve.md "Decode steps as CUDA graphs"). false: every step is
  // launched op by op (the A/B baseline; same bits). Ignored by the CPU engine.
  bool cuda_graphs = true;
  // How the dense linear weights (q, k, v, o, a dense layer's gate/up/down, the MoE router, the
  // lm_head and the embedding table; not norms or biases, not routed experts: PagerConfig::
  // expert_dtype) are stored: kF32, or kBF16 — half the bytes (in the CUDA engine's device
  // budget: "dense weights"), each weight widened exactly to f32 where it is read, activations and
  // accumulation f32, so the outputs are the f32 engine's bits on the weights rounded to bf16
  // (round to nearest even), on either backend (docs/serve.md "bf16 dense weights"). Every
  // expert mode shares the dense path, so the modes stay bit-identical to each other.
  DType dense_dtype = DType::kF32;
};

}  // namespace ferry::serve
