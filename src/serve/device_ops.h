// SPDX-License-Identifier: Apache-2.0
// The serving engine's CUDA kernels as seen from src/serve (kernels/cuda/serve_kernels.h), so the
// engine's device path compiles in every build: in CUDA builds these forward to the kernels; in
// CPU builds they return unavailable (no CUDA engine can be created there: cuda_backend() is
// unavailable first). Argument structs: kernels/cuda/serve_kernel_args.h (plain, no CUDA).
// Enqueued on `stream` (a CUDA stream), which comes last; nothing blocks the host.
#pragma once

#include "core/result.h"
#include "core/status.h"
#include "kernels/cuda/serve_kernel_args.h"
#include "mem/stream.h"

namespace ferry::serve::device {

using kernels::cuda::AddRmsNormArgs;
using kernels::cuda::DecodeFusion;
using kernels::cuda::ExpertFfnArgs;
using kernels::cuda::ForcedRoutingArgs;
using kernels::cuda::MissCopyArgs;
using kernels::cuda::PagedKvLayout;
using kernels::cuda::PagedStep;
using kernels::cuda::QkNormRopeArgs;
using kernels::cuda::QkNormRopeKvArgs;
using kernels::cuda::SlotResolveArgs;
using kernels::cuda::SmallMGemmBf16Args;
using kernels::cuda::SmallMGemmMultiArgs;

Status kv_write(const PagedKvLayout& kv, int layer, const PagedStep& step, const float* k,
                const float* v, mem::Stream& stream);
Status paged_attention(const PagedKvLayout& kv, int layer, const PagedStep& step, float* out,
                       const float* q, int H, float scale, mem::Stream& stream);
Status expert_ffn(const ExpertFfnArgs& a, mem::Stream& stream);
Status forced_routing(const ForcedRoutingArgs& a, mem::Stream& stream);
Status link_pace_mark(unsigned long long* d_mark, mem::Stream& stream);
Status link_pace_wait(unsigned long long* d_mark, unsigned long long ns, mem::Stream& stream);
// Device-side slot resolution (serve/device_resolver.h): the resolve kernel, the miss-copy kernel,
// a pacing wait for the logged misses' bytes, and the device address of pinned host memory.
Status resolve_slots(const SlotResolveArgs& a, mem::Stream& stream);
Status copy_misses(const MissCopyArgs& a, mem::Stream& stream);
Status link_pace_wait_misses(unsigned long long* d_mark, const std::int32_t* d_log,
                             std::uint64_t expert_bytes, double gbps, mem::Stream& stream);
Result<const void*> mapped_pointer(const void* host);
// bf16 dense weights (kernels/cuda/serve_kernels.h): a linear layer of m <= kSmallGemmRows rows on
// a bf16 weight, a bf16 weight widened into an f32 workspace, the widened embedding rows; and
// whether the CUDA backend's f32 GEMM takes its small-m kernel for m <= kSmallGemmRows (false in
// CPU builds).
inline constexpr int kSmallGemmRows = 4;  // kernels/cuda/launchers.h kSmallGemmMaxRows
bool small_m_gemm_enabled();
Status small_m_gemm_bf16w(const SmallMGemmBf16Args& a, mem::Stream& stream);
Status widen_bf16(float* out, const std::uint16_t* in, std::int64_t n, mem::Stream& stream);
Status embedding_bf16(float* out, const std::uint16_t* table, const std::int32_t* ids,
                      std::int64_t t, std::int64_t c, std::int64_t v, mem::Stream& stream);
// Decode fusions (kernels/cuda/decode_fusion.h): whether each is on (false in CPU builds), and
// the fused launches, each the bits of the launches it replaces.
bool decode_fusion_enabled(DecodeFusion f);
Status small_m_gemm_multi(const SmallMGemmMultiArgs& a, mem::Stream& stream);
Status add_rms_norm(const AddRmsNormArgs& a, mem::Stream& stream);
Result<bool> qk_norm_rope(const QkNormRopeArgs& a, mem::Stream& stream);
Result<bool> qk_norm_rope_kv_write(const QkNormRopeKvArgs& a, mem::Stream& stream);

}  // namespace ferry::serve::device
