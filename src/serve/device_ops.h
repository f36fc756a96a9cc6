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

using kernels::cuda::ExpertFfnArgs;
using kernels::cuda::ForcedRoutingArgs;
using kernels::cuda::MissCopyArgs;
using kernels::cuda::PagedKvLayout;
using kernels::cuda::PagedStep;
using kernels::cuda::SlotResolveArgs;

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

}  // namespace ferry::serve::device
