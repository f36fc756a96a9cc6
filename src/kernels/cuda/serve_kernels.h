// SPDX-License-Identifier: Apache-2.0
// The serving engine's own CUDA kernels (src/serve on a CUDA backend, docs/serve.md "CUDA path"):
//   kv_write        a step's K/V rows into the paged KV cache, through the block tables
//   paged_attention causal GQA of a step's queries (prefill chunks and decodes mixed) against the
//                   paged cache, one CTA per (token, head) with the positions split over its warps
//                   (online softmax per warp, combined in warp order), or the baseline warp per
//                   (token, head) over positions in order (KernelVariant, serve_kernel_args.h)
//   expert_ffn      routed experts' SwiGLU FFN for rows [row_begin, row_end) of a [T*K] routing,
//                   the weights read through a table of per-expert pointers
//   forced_routing  a routing hook's forced ids (uploaded once per step) applied to the router's
//                   output of one MoE layer (router.cu)
//   link_pace_*     timed waits on a copy stream that hold it to a link rate (serve_link_pace.cu)
//   copy_from_host  a kernel reading mapped pinned host memory (a device-initiated copy)
// Host-includable without CUDA headers (only mem::Stream): src/serve calls these in CUDA builds
// (FERRY_HAVE_CUDA); CPU builds never compile the .cu files and never call them.
// Contract as launchers.h: device pointers to contiguous row-major f32 data, shapes validated by
// the caller, enqueued on `stream` (last), no allocation; Status from the launch (FERRY_DEBUG_SYNC
// synchronizes and checks).
// K/V rows: f32, or bf16 (PagedKvLayout::bf16, KvConfig::dtype): rounded to nearest even when
// written, widened exactly when read, so a bf16 pool gives the f32 kernels' arithmetic on the
// rounded rows (the GPU tests compare the two bit for bit).
// Determinism: every output element is computed by one warp (one CTA for paged_attention) in a
// fixed order (lane partial sums, then a fixed xor-shuffle tree; a fixed warp order), never with
// atomics, and does not depend on which other rows share the launch or where the weights sit; so
// expert_ffn gives the same bits for an expert in any slot (resident, static staging, paged slot)
// and any token grouping. Tests: tests/gpu/serve_gpu_test.cpp (vs the CPU paged_attention /
// expert_ffn_row twins with style.md's rule, and bit identity across slots and groupings) and
// tests/gpu/serve_decode_kernels_gpu_test.cpp (both variants of each kernel, batch invariance).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/result.h"
#include "core/status.h"
#include "kernels/cuda/serve_kernel_args.h"
#include "mem/stream.h"

namespace ferry::kernels::cuda {

// k, v: [T, G*D] -> the cache rows of (seq_of[t], pos[t]) in `layer`. (The serve runner's
// default path writes them in its q/k norm + rope launch instead: decode_fusion.h
// qk_norm_rope_kv_write, the same bits.)
Status kv_write(const PagedKvLayout& kv, int layer, const PagedStep& step, const float* k,
                const float* v, mem::Stream& stream);

// out, q: [T, H, D] (rope applied). Token t attends to positions [0, pos[t]] of its sequence,
// which must be in the cache. Query head h reads kv head h / (H / G). D <= 256.
// `variant` (KernelVariant, serve_kernel_args.h): the split-keys kernel (kDecode) or the warp
// per (token, head) baseline; the overload without it takes kDefault (FERRY_PAGED_ATTN_SPLIT).
Status paged_attention(const PagedKvLayout& kv, int layer, const PagedStep& step, float* out,
                       const float* q, int H, float scale, mem::Stream& stream);
Status paged_attention(const PagedKvLayout& kv, int layer, const PagedStep& step, float* out,
                       const float* q, int H, float scale, KernelVariant variant,
                       mem::Stream& stream);

// Rows [row_begin, row_end) of ExpertFfnArgs (serve_kernel_args.h); the chunked 16-byte-load
// kernels (kDecode) or the lane-strided baseline; kDefault: FERRY_EXPERT_FFN_CHUNKED.
Status expert_ffn(const ExpertFfnArgs& a, mem::Stream& stream);
Status expert_ffn(const ExpertFfnArgs& a, KernelVariant variant, mem::Stream& stream);
// The router's softmax + top-k (CudaBackend::router's kernel, router.cu) on f32 logits [t, e]
// with the kernel named: weights, ids [t, k], probs [t, e]; 1 <= k <= min(e, 32). For the GPU
// tests' A/B of the two kernels (CudaBackend::router takes kDefault: FERRY_ROUTER_REGISTERS).
Status router_f32(float* weights, std::int32_t* ids, float* probs, const float* logits,
                  std::int64_t t, std::int64_t e, int k, bool renormalize, KernelVariant variant,
                  mem::Stream& stream);
// ForcedRoutingArgs (serve_kernel_args.h): a routing hook's forced ids applied on the device, so
// the runner needs no host round trip per MoE layer. K <= 32.
Status forced_routing(const ForcedRoutingArgs& a, mem::Stream& stream);
// bf16 dense weights (docs/serve.md "bf16 dense weights"; gemm_small_m.cu, serve_dense.cu), each
// the f32 path's bits on the widened weights: a small-m linear layer (SmallMGemmBf16Args, m <= 4,
// FERRY_SMALL_M_GEMM=0 aside: small_m_gemm_enabled() says whether the f32 GEMM takes that path);
// widen_bf16 out [n] f32 = in [n] bf16 (a weight into an f32 workspace for cuBLASLt); and the
// embedding rows of a bf16 table widened (out [t, c], table [v, c], ids [t]; an id outside
// [0, v) gives zeros).
Status small_m_gemm_bf16w(const SmallMGemmBf16Args& a, mem::Stream& stream);
Status widen_bf16(float* out, const std::uint16_t* in, std::int64_t n, mem::Stream& stream);
Status embedding_bf16(float* out, const std::uint16_t* table, const std::int32_t* ids,
                      std::int64_t t, std::int64_t c, std::int64_t v, mem::Stream& stream);
// Whether CudaBackend::gemm sends f32 GEMMs of m <= kSmallGemmMaxRows rows to the small-m kernel
// (true unless FERRY_SMALL_M_GEMM=0): the bf16 path must take the same one to keep its bits.
bool small_m_gemm_enabled();

// Link pacing (serve/link_engine.h): enqueued on the paced copy stream around each chunk of a
// host->device copy: mark before the first chunk, wait(ns = chunk bytes / rate) after each, so
// the stream cannot move the chunk in less than ns, whatever the real link's speed. d_mark:
// [1] device u64 owned by the caller, used by one stream only.
Status link_pace_mark(unsigned long long* d_mark, mem::Stream& stream);
Status link_pace_wait(unsigned long long* d_mark, unsigned long long ns, mem::Stream& stream);
// A device-initiated copy: `blocks` x 256 threads read src, pinned host memory through its mapped
// (UVA) address, and write dst in GPU memory — the copy a device-side miss path would use without
// a host call (docs/serve.md "Device-side slot resolution"; measured by ServeDeviceCopy.*).
// Pointers 16-byte aligned and bytes a multiple of 16 (invalid_argument otherwise).
Status copy_from_host(void* dst, const void* src, std::size_t bytes, int blocks,
                      mem::Stream& stream);
// Device-side slot resolution (serve_slot_resolve.cu; CPU twins in serve/slot_resolve.h): one
// paged layer's LRU slot decisions (one warp: kDecode, the default; the block kernel: kBaseline
// or FERRY_RESOLVE_WARP=0; both make the twin's decisions), its misses copied from mapped pinned
// host memory, and a link pacing wait of ceil(misses * expert_bytes / gbps) ns read from the
// resolve log. E <= 4096 (the resolve kernels' shared memory).
Status resolve_slots(const SlotResolveArgs& a, mem::Stream& stream);
Status resolve_slots(const SlotResolveArgs& a, KernelVariant variant, mem::Stream& stream);
Status copy_misses(const MissCopyArgs& a, mem::Stream& stream);
Status link_pace_wait_misses(unsigned long long* d_mark, const std::int32_t* d_log,
                             std::uint64_t expert_bytes, double gbps, mem::Stream& stream);
// The device address of pinned host memory (cudaHostGetDevicePointer); unavailable if the
// allocation is not mapped.
Result<const void*> mapped_pointer(const void* host);

}  // namespace ferry::kernels::cuda
