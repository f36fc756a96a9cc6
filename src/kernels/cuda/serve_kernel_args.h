// SPDX-License-Identifier: Apache-2.0
// Plain argument structs of the serving kernels (serve_kernels.h), shared by the host-side
// Status API and the .cu launchers (serve_launchers.h); no CUDA or fmt headers.
#pragma once

#include <cstdint>

namespace ferry::kernels::cuda {

// Which of an op's two kernels runs (paged_attention, expert_ffn, the router's softmax/top-k;
// docs/cuda.md "Decode kernels"): kDecode the decode-shaped kernel (more CTAs / 16-byte loads in
// flight for a step of 1-4 tokens), kBaseline the first one (kept as the reference twin of the
// GPU tests and as an A/B switch), kDefault: kDecode unless the op's environment switch is "0"
// (FERRY_PAGED_ATTN_SPLIT, FERRY_EXPERT_FFN_CHUNKED, FERRY_ROUTER_REGISTERS; read once per
// process, so every launch of a process takes the same kernel and the serving modes stay
// bit-identical).
enum class KernelVariant : std::uint8_t { kDefault, kBaseline, kDecode };

// The paged KV cache's layout (serve/kv_cache.h): per layer l and block b, K rows then V rows,
// each [block_tokens, G*D] elements, f32 or (bf16) bf16 bits (KvConfig::dtype: rounded to nearest
// even when written, widened exactly when read):
//   k(l, b) = base + l * layer_stride + (b * 2 + 0) * block_tokens * G*D;  v: (b * 2 + 1)
struct PagedKvLayout {
  void* base = nullptr;
  // elements: capacity_blocks * 2 * block_tokens * G*D; a resizable pool's rounded up to its
  // commit granule (a layer's blocks start on a granule: KvCache::layer_stride_elems)
  std::int64_t layer_stride = 0;
  int block_tokens = 0;
  int G = 0, D = 0;
  bool bf16 = false;  // the rows are bf16 bits (else f32)
};

// Where each step token goes: sequence, position and that sequence's block table.
struct PagedStep {
  const std::int32_t* seq_of = nullptr;  // [T] index into tables
  const std::int32_t* pos = nullptr;     // [T]
  const std::int32_t* tables = nullptr;  // [S, table_stride] block ids in position order
  int table_stride = 0;
  std::int64_t T = 0;
};

// Rows i in [row_begin, row_end) of a [T*K] routing: token t = i / K, expert e = ids[i];
//   act[i, :] = silu(gate_e x_t) * (up_e x_t),   out[i, :] = down_e act[i, :]
// table: [3, E] pointers (gate_e [F, C], up_e [F, C], down_e [C, F], row-major, device), f32, or
// bf16 bits when `bf16` (each weight widened exactly; products and sums in f32, same order); an
// id outside [0, E) or a null pointer gives a zero row (the host checked routed ids already).
// row_list (optional): positions p in [row_begin, row_end) name the rows i = row_list[p] instead,
// so one launch can run any subset of the rows (the paged executor runs the rows of its resident
// experts first, then each missed expert's rows once its copy has landed). A row's bits do not
// depend on which launch or position computes it.
// row_filter with miss_log (a SlotResolveArgs log of this layer's resolve): kHits runs only the
// rows whose expert is not among the log's misses, kMisses only those whose expert is; the other
// rows are neither computed nor written. Device slot resolution runs the hits beside the miss
// copy and the misses after it: the two launches write disjoint rows, each row once.
enum class ExpertRowFilter : std::int32_t { kAll = 0, kHits = 1, kMisses = 2 };
struct ExpertFfnArgs {
  float* out = nullptr;                    // [T*K, C]
  float* act = nullptr;                    // [T*K, F] scratch
  const float* x = nullptr;                // [T, C]
  const std::int32_t* ids = nullptr;       // [T*K]
  const void* const* table = nullptr;      // [3, E]
  const std::int32_t* row_list = nullptr;  // [>= row_end] or null (rows are the positions)
  std::int64_t row_begin = 0, row_end = 0;
  int K = 0, E = 0;
  std::int64_t C = 0, F = 0;
  bool bf16 = false;  // weights in bf16 (else f32)
  ExpertRowFilter row_filter = ExpertRowFilter::kAll;
  const std::int32_t* miss_log = nullptr;  // [log_ints(E)], needed unless row_filter is kAll
};
// A linear layer on a few rows with a bf16 weight (the serving engine's --dense-dtype bf16):
//   out[r, j] = alpha * sum_q a[r, q] * widen(b[j, q]) (+ bias[j]) + beta * out[r, j],
// 1 <= m <= 4, rows contiguous with the given leading dimensions (elements), device pointers:
// the small-m f32 kernel's arithmetic on the widened weight (gemm_small_m.cu).
struct SmallMGemmBf16Args {
  float* out = nullptr;              // [m, ldo]
  const float* a = nullptr;          // [m, lda]
  const std::uint16_t* b = nullptr;  // [n, ldb] bf16 bits
  const float* bias = nullptr;       // [n] or null
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldo = 0;
  float alpha = 1.0f, beta = 0.0f;
};

// Decode fusions (docs/cuda.md "Decode fusions (session 12)"; decode_fusion.h): launches of a
// decode step merged into one, each output bit-identical to the launches it replaces, each behind
// a switch read once per process (on unless FERRY_DECODE_FUSION=0 or its own switch is "0"):
//   kQkv        (FERRY_FUSE_QKV)           the small-m GEMMs on one input (q/k/v; a dense MLP's
//                                          gate/up) as one launch (SmallMGemmMultiArgs)
//   kAddNorm    (FERRY_FUSE_ADD_NORM)      the residual add and the next rms_norm (AddRmsNormArgs)
//   kQkNormRope (FERRY_FUSE_QK_NORM_ROPE)  Qwen3's per-head q/k norms and both ropes
//                                          (QkNormRopeArgs)
//   kQkNormRopeKv (FERRY_FUSE_QK_NORM_ROPE_KV, and only where kQkNormRope is on) the step's K/V
//                                          rows written to the paged cache by that launch too,
//                                          kv_write's launch gone (QkNormRopeKvArgs)
enum class DecodeFusion : std::uint8_t { kQkv, kAddNorm, kQkNormRope, kQkNormRopeKv };
inline constexpr int kDecodeFusions = 4;

// Up to 3 linear layers on the same rows a [m, k] (lda), m <= 4: out_o [m, ldo_o] =
// alpha * a @ b_o^T (+ bias_o) + beta * out_o, b_o [n_o, ldb_o] f32, or bf16 bits when `bf16`;
// each output gets the bits of its own small-m launch (the f32 kernel CudaBackend::gemm takes for
// m <= 4, or small_m_gemm_bf16w).
struct SmallMGemmMultiArgs {
  struct Output {
    float* out = nullptr;         // [m, ldo]
    const void* b = nullptr;      // [n, ldb]
    const float* bias = nullptr;  // [n] or null
    std::int64_t n = 0, ldb = 0, ldo = 0;
  };
  static constexpr int kMaxOutputs = 3;
  Output outs[kMaxOutputs];
  int count = 0;
  const float* a = nullptr;
  std::int64_t m = 0, k = 0, lda = 0;
  float alpha = 1.0f, beta = 0.0f;
  bool bf16 = false;  // the weights are bf16 bits (else f32)
};

// x_out = x + y, then out = rms_norm(x_out) * weight (rstd optional), f32 [n, c]: the bits of the
// backend's add followed by its rms_norm. x_out may alias x.
struct AddRmsNormArgs {
  float* x_out = nullptr;         // [n, c] the new residual
  float* out = nullptr;           // [n, c] the normed rows
  float* rstd = nullptr;          // [n] or null
  const float* x = nullptr;       // [n, c]
  const float* y = nullptr;       // [n, c]
  const float* weight = nullptr;  // [c]
  std::int64_t n = 0, c = 0;
  float eps = 0.0f;
};

// Per-head q/k rms_norm then rope (forward), f32: q_out [t, h, d] =
// rope(rms_norm(q_in) * q_weight), k likewise with g heads; r = 2 * (inv_freq's length) rotary
// dims <= d; rstd [t*h] / [t*g] optional. The bits of the backend's two rms_norms and two ropes.
// Taken for d % 4 == 0, 4 <= d < 256 and 16-byte aligned pointers (the rms_norm kernel it
// mirrors), else not applicable.
struct QkNormRopeArgs {
  float* q_out = nullptr;
  float* q_rstd = nullptr;
  const float* q_in = nullptr;
  const float* q_weight = nullptr;  // [d]
  float* k_out = nullptr;
  float* k_rstd = nullptr;
  const float* k_in = nullptr;
  const float* k_weight = nullptr;          // [d]
  const std::int32_t* positions = nullptr;  // [t]
  const float* inv_freq = nullptr;          // [r / 2]
  std::int64_t t = 0, h = 0, g = 0, d = 0, r = 0;
  float eps = 0.0f, scaling = 1.0f;
};

// QkNormRopeArgs, and in the same launch the step's K/V rows into the paged cache: each k row,
// once normed and roped (and stored to qk.k_out as before), and the v row of the same token and
// kv head go where kv_write(kv, layer, step, qk.k_out, v) puts them, the same f32 values (so the
// cache gets kv_write's bits). step.T == qk.t, kv.G == qk.g, kv.D == qk.d; step.pos is where the
// rows land (the runner passes the same positions as qk.positions).
struct QkNormRopeKvArgs {
  QkNormRopeArgs qk;
  PagedKvLayout kv;
  int layer = 0;
  PagedStep step;
  const float* v = nullptr;  // [t, g*d]
};

// One MoE layer's forced routing (a routing hook's ids for the step, uploaded before the layers
// run), applied to the router's output in place. Row t: forced[t, 0] < 0 or forced row == ids row
// -> unchanged; else ids row = forced row and weights[t, k] = probs[t, forced[t, k]] in k order,
// divided by their f32 sum (summed in k order) when renormalize. The CPU twin is
// serve::apply_forced_rows (model_runner.h); forced ids are checked on the host (in [0, E),
// distinct) before the upload.
struct ForcedRoutingArgs {
  std::int32_t* ids = nullptr;           // [T, K] the router's ids, replaced where forced
  float* weights = nullptr;              // [T, K] the router's weights, recomputed where replaced
  const float* probs = nullptr;          // [T, E] the router's softmax
  const std::int32_t* forced = nullptr;  // [T, K]
  std::int64_t T = 0, E = 0;
  int K = 0;
  bool renormalize = false;
};

// Device-side slot resolution of one paged MoE layer (docs/serve.md "Device-side slot
// resolution"; the CPU twin is serve::resolve_slots_twin in serve/slot_resolve.h, the host rule
// is ExpertPager::acquire with LRU, LFU or LFRU). `state` is the layer's int32 block
// (SlotStateLayout below; 8-byte aligned):
//   [0] live cap, [1] tick (u32: the layer's acquire count), [2] victim rule (kSlotRuleLru,
//   kSlotRuleLfu or kSlotRuleLfru), [3] LFRU half-life h in ticks (the length of lfru_decay),
//   slot_of [E] (-1: not resident), expert_in [max_cap] (-1: empty), stamp [max_cap] (u32 last
//   use tick), flags [max_cap] (kSlotHot | kSlotInUse), uses [max_cap] (u32 uses since load),
//   score_at [max_cap] (u32 tick of the LFRU score), then at an even int offset score [max_cap]
//   (f64 LFRU score as of score_at).
// LFRU's decay over an age of a ticks is exact in both places: ldexp(lfru_decay[a % h], -(a / h))
// with the table lfru_decay[r] = exp2(-r / h) made once on the host (serve/eviction_policy.h
// lfru_decay); a slot's score now is score * decay (one rounding), a hit sets score =
// fma(score, decay, 1) (one rounding), a load score = 1.
// One call: in-use flags of the previous call cleared (its release), tick + 1; the step's
// distinct experts in first-appearance order over ids; hits first (in use, stamp = tick, uses
// + 1, score as above, score_at = tick); then each miss takes the lowest empty slot under cap,
// else, among the slots that are neither hot nor in use, the smallest (stamp, slot) under LRU,
// (uses, stamp, slot) under LFU or (score now, stamp, slot) under LFRU (its expert is evicted:
// slot_of -1, table entries null; the slot's stamp = score_at = tick, uses = 1, score = 1); the
// table gets the miss's pointers (slot_base + slot * expert_bytes + {0, up_offset,
// down_offset}). log: [0] hits, [1] misses, [2] evictions, [3] errors (ids outside [0, E) or a
// miss without a slot: skipped, a bug of the caller), [4] n, then ids [E], miss_expert [E],
// miss_slot [E], evicted [E] (-1: the slot was empty); n <= E (the caller runs this only when
// n <= cap - hot).
inline constexpr int kSlotHot = 1, kSlotInUse = 2;
inline constexpr int kSlotRuleLru = 0, kSlotRuleLfu = 1, kSlotRuleLfru = 2;
struct SlotStateLayout {
  static constexpr std::int64_t kHeader = 4, kLogHeader = 5;
  // The int offset of the f64 scores: after the u32 arrays, rounded up to even.
  static constexpr std::int64_t score_offset(int E, int max_cap) {
    return (kHeader + E + 5 * std::int64_t(max_cap) + 1) / 2 * 2;
  }
  // Even, so consecutive blocks stay 8-byte aligned.
  static constexpr std::int64_t state_ints(int E, int max_cap) {
    return score_offset(E, max_cap) + 2 * std::int64_t(max_cap);
  }
  // The max_cap of a block of `ints` ints (the inverse of state_ints: the padding is < 7 ints).
  static int max_cap_of(std::int64_t ints, int E) { return int((ints - kHeader - E) / 7); }
  static std::int64_t log_ints(int E) { return kLogHeader + 4 * std::int64_t(E); }
};
struct SlotResolveArgs {
  const std::int32_t* ids = nullptr;  // [n] the layer's routed ids (row t*K + k)
  std::int64_t n = 0;
  int E = 0, max_cap = 0;
  std::int32_t* state = nullptr;       // [state_ints(E, max_cap)]
  const void** table = nullptr;        // [3, E]
  std::int32_t* log = nullptr;         // [log_ints(E)]
  const double* lfru_decay = nullptr;  // [state[3]] under LFRU (else unused, may be null)
  unsigned char* slot_base = nullptr;  // slot s at slot_base + s * expert_bytes
  std::int64_t expert_bytes = 0, up_offset = 0, down_offset = 0;
};
// The misses of one resolve (its log) copied from the host store: miss j's block
// src_base + miss_expert[j] * expert_bytes (pinned host memory, its mapped device address on
// CUDA) to slot_base + miss_slot[j] * expert_bytes. Pointers aligned to the largest of 16, 4, 1
// dividing expert_bytes.
struct MissCopyArgs {
  unsigned char* slot_base = nullptr;
  const unsigned char* src_base = nullptr;  // the layer's expert 0 in the host store
  std::int64_t expert_bytes = 0;
  const std::int32_t* log = nullptr;  // a SlotResolveArgs log
  int E = 0;
  int blocks = 0;  // grid size (CUDA)
};
}  // namespace ferry::kernels::cuda
