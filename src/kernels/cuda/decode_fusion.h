// SPDX-License-Identifier: Apache-2.0
// Decode fusions (docs/cuda.md "Decode fusions (session 12)"): a serve decode step's short
// dependent launches merged, each output bit-identical to the launches it replaces (the reference
// twin: those launches, which tests/gpu/serve_decode_fusion_gpu_test.cpp compares bit for bit):
//   small_m_gemm_multi  the q/k/v (or gate/up) small-m GEMMs on one input row set (gemm_small_m.cu)
//   add_rms_norm        x = x + y, then h = rms_norm(x) (rms_norm.cu)
//   qk_norm_rope        Qwen3's per-head q/k rms_norms, then rope on q and k (rope.cu)
//   qk_norm_rope_kv_write  qk_norm_rope, and the step's K/V rows into the paged cache (kv_write's
//                       launch, paged_attention.cu) by the same launch (rope.cu)
// decode_fusion_enabled() is the switch of each (serve_kernel_args.h DecodeFusion), read once per
// process so every step and every CUDA graph of a process takes the same path (the serving modes
// stay bit-identical; the fused and unfused paths are too, so the switch changes timing only).
// Host-includable without CUDA headers. Contract as serve_kernels.h.
#pragma once

#include <cstdint>

#include "core/result.h"
#include "core/status.h"
#include "kernels/cuda/serve_kernel_args.h"
#include "mem/stream.h"

namespace ferry::kernels::cuda {

// On unless FERRY_DECODE_FUSION=0 or the fusion's own switch (FERRY_FUSE_QKV,
// FERRY_FUSE_ADD_NORM, FERRY_FUSE_QK_NORM_ROPE, FERRY_FUSE_QK_NORM_ROPE_KV) is "0"; kQkNormRopeKv
// also needs kQkNormRope (it extends that launch).
bool decode_fusion_enabled(DecodeFusion f);
// Tests only (the engine-level A/B in one process): while set (0 off, 1 on; -1 clears),
// decode_fusion_enabled answers it for every fusion instead of the switches, except that the
// fusions in `off_mask` (bit 1 << DecodeFusion) answer false. The serve runner asks once, when it
// is created, so each runner's steps and graphs stay on one path.
void override_decode_fusion_for_tests(int on, unsigned off_mask = 0);
// How many calls of each fused entry point below enqueued their work, since the process started
// (qk_norm_rope / qk_norm_rope_kv_write: only those that returned true; qk_norm_rope_kv_write
// counts under kQkNormRope too, since it runs that fusion). Tests read it to see that a runner
// took the fused path; nothing else does.
std::uint64_t decode_fusion_calls(DecodeFusion f);

// SmallMGemmMultiArgs (serve_kernel_args.h): 1..3 outputs, 1 <= m <= 4.
Status small_m_gemm_multi(const SmallMGemmMultiArgs& a, mem::Stream& stream);
// AddRmsNormArgs: f32 [n, c].
Status add_rms_norm(const AddRmsNormArgs& a, mem::Stream& stream);
// QkNormRopeArgs: true when the fused kernel ran; false when the shape or alignment is outside it
// (nothing enqueued: the caller runs the two rms_norms and the two ropes).
Result<bool> qk_norm_rope(const QkNormRopeArgs& a, mem::Stream& stream);
// QkNormRopeKvArgs: qk_norm_rope's outputs, and the cache rows kv_write(a.kv, a.layer, a.step,
// a.qk.k_out, a.v) would write, in one launch. True when it ran; false (nothing enqueued) where
// qk_norm_rope declines: the caller runs its unfused path and kv_write.
Result<bool> qk_norm_rope_kv_write(const QkNormRopeKvArgs& a, mem::Stream& stream);

}  // namespace ferry::kernels::cuda
