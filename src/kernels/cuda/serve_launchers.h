// SPDX-License-Identifier: Apache-2.0
// cudaError_t launchers of the serving kernels (paged_attention.cu, expert_ffn.cu, router.cu's
// forced routing, serve_link_pace.cu), called by
// serve_kernels.cpp, which validates arguments and turns the result into a Status. Contract as
// launchers.h.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/serve_kernel_args.h"

namespace ferry::kernels::cuda {

cudaError_t launch_kv_write(const PagedKvLayout& kv, int layer, const PagedStep& step,
                            const float* k, const float* v, cudaStream_t stream);
// rope.cu: launch_qk_norm_rope_f32 (launchers.h) on a.qk, the same launch also writing the step's
// K/V rows into the paged cache (QkNormRopeKvArgs, serve_kernel_args.h); cudaErrorNotSupported
// (nothing launched) where launch_qk_norm_rope_f32 declines. a.step.T == a.qk.t, a.kv.G == a.qk.g,
// a.kv.D == a.qk.d (checked by the caller).
cudaError_t launch_qk_norm_rope_kv_f32(const QkNormRopeKvArgs& a, cudaStream_t stream);
// D = kv.D <= 256 (checked by the caller). kDecode falls back to kBaseline when D % 4 != 0 or a
// pointer is not 16-byte aligned.
cudaError_t launch_paged_attention(const PagedKvLayout& kv, int layer, const PagedStep& step,
                                   float* out, const float* q, int H, float scale,
                                   KernelVariant variant, cudaStream_t stream);
// Grid limits checked by the caller: rows < 2^31, ceil(F / 8) and ceil(C / 8) <= 65535.
cudaError_t launch_expert_ffn(const ExpertFfnArgs& a, KernelVariant variant, cudaStream_t stream);
// router.cu. K <= 32 (checked by the caller). A warp per token, or a thread per token under
// FERRY_ROUTER_REGISTERS=0 (the same bits).
cudaError_t launch_forced_routing(const ForcedRoutingArgs& a, cudaStream_t stream);
// router.cu: launch_router (launchers.h) on f32 logits [t, e] with the kernel named (kDecode: the
// logits held in registers, E <= 256, else kBaseline); launch_router takes kDefault. 1 <= k <=
// min(e, 32) (checked by the caller).
cudaError_t launch_router_f32(float* weights, std::int32_t* ids, float* probs, const float* logits,
                              std::int64_t t, std::int64_t e, int k, bool renormalize,
                              KernelVariant variant, cudaStream_t stream);
// serve_link_pace.cu: one thread each. mark: *d_mark = the GPU's global timer (ns). wait: spins
// (nanosleep) until the timer reaches *d_mark + ns, then sets *d_mark to the timer.
cudaError_t launch_link_pace_mark(unsigned long long* d_mark, cudaStream_t stream);
cudaError_t launch_link_pace_wait(unsigned long long* d_mark, unsigned long long ns,
                                  cudaStream_t stream);
// serve_link_pace.cu: dst (device) <- src (pinned host, mapped) by a kernel of `blocks` x 256
// threads; 16-byte aligned pointers, bytes % 16 == 0 (checked by the caller).
cudaError_t launch_copy_from_host(void* dst, const void* src, std::size_t bytes, int blocks,
                                  cudaStream_t stream);

// serve_dense.cu (bf16 dense weights; t < 2^31 checked by the caller): out [t, c] f32 = the
// widened rows ids[t] of table [v, c] bf16 (zeros for an id outside [0, v)); out [n] f32 = in [n]
// bf16 widened.
cudaError_t launch_embedding_bf16(float* out, const std::uint16_t* table, const std::int32_t* ids,
                                  std::int64_t t, std::int64_t c, std::int64_t v,
                                  cudaStream_t stream);
cudaError_t launch_widen_bf16(float* out, const std::uint16_t* in, std::int64_t n,
                              cudaStream_t stream);

// serve_slot_resolve.cu (arguments checked by the caller: E <= 4096, max_cap >= 1).
cudaError_t launch_resolve_slots(const SlotResolveArgs& a, KernelVariant variant,
                                 cudaStream_t stream);
cudaError_t launch_copy_misses(const MissCopyArgs& a, cudaStream_t stream);
cudaError_t launch_link_pace_wait_misses(unsigned long long* d_mark, const std::int32_t* d_log,
                                         unsigned long long expert_bytes, double gbps,
                                         cudaStream_t stream);

}  // namespace ferry::kernels::cuda
