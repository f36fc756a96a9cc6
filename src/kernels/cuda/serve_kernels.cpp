// SPDX-License-Identifier: Apache-2.0
// The Status side of serve_kernels.h: argument checks, then the launchers of paged_attention.cu
// and expert_ffn.cu, with check_launch (FERRY_DEBUG_SYNC) after each.
#include "kernels/cuda/serve_kernels.h"

#include <cstdlib>

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/serve_launchers.h"

namespace ferry::kernels::cuda {
namespace {

Status check_common(const char* op, const PagedKvLayout& kv, const PagedStep& step,
                    const mem::Stream& stream) {
  if (stream.device() != Device::kCuda) {
    return invalid_argument("cuda {}: needs a CUDA stream", op);
  }
  if (kv.base == nullptr || kv.block_tokens <= 0 || kv.G <= 0 || kv.D <= 0) {
    return invalid_argument("cuda {}: empty KV layout", op);
  }
  if (step.T > 0 && (step.seq_of == nullptr || step.pos == nullptr || step.tables == nullptr ||
                     step.table_stride <= 0)) {
    return invalid_argument("cuda {}: step without seq_of / pos / tables", op);
  }
  return ok_status();
}

}  // namespace

Status kv_write(const PagedKvLayout& kv, int layer, const PagedStep& step, const float* k,
                const float* v, mem::Stream& stream) {
  FERRY_TRY(check_common("kv_write", kv, step, stream));
  FERRY_LAUNCH_TRY("serve kv_write", native(stream),
                   launch_kv_write(kv, layer, step, k, v, native(stream)));
  return ok_status();
}

Status paged_attention(const PagedKvLayout& kv, int layer, const PagedStep& step, float* out,
                       const float* q, int H, float scale, mem::Stream& stream) {
  return paged_attention(kv, layer, step, out, q, H, scale, KernelVariant::kDefault, stream);
}

Status paged_attention(const PagedKvLayout& kv, int layer, const PagedStep& step, float* out,
                       const float* q, int H, float scale, KernelVariant variant,
                       mem::Stream& stream) {
  FERRY_TRY(check_common("paged_attention", kv, step, stream));
  if (H % kv.G != 0) {
    return invalid_argument("cuda paged_attention: {} heads not divisible by {} kv heads", H, kv.G);
  }
  if (kv.D > 256) return unimplemented("cuda paged_attention: head dim {} > 256", kv.D);
  if (step.T * H > 0x7fffffff) {
    return unimplemented("cuda paged_attention: {} tokens x {} heads exceed the grid", step.T, H);
  }
  FERRY_LAUNCH_TRY(
      "serve paged_attention", native(stream),
      launch_paged_attention(kv, layer, step, out, q, H, scale, variant, native(stream)));
  return ok_status();
}

Status expert_ffn(const ExpertFfnArgs& a, mem::Stream& stream) {
  return expert_ffn(a, KernelVariant::kDefault, stream);
}

Status expert_ffn(const ExpertFfnArgs& a, KernelVariant variant, mem::Stream& stream) {
  if (stream.device() != Device::kCuda) return invalid_argument("cuda expert_ffn: CUDA stream");
  const std::int64_t rows = a.row_end - a.row_begin;
  if (rows <= 0) return ok_status();
  if (a.out == nullptr || a.act == nullptr || a.x == nullptr || a.ids == nullptr ||
      a.table == nullptr || a.K <= 0 || a.E <= 0 || a.C <= 0 || a.F <= 0) {
    return invalid_argument("cuda expert_ffn: missing pointers or empty shapes");
  }
  if (a.row_filter != ExpertRowFilter::kAll && a.miss_log == nullptr) {
    return invalid_argument("cuda expert_ffn: a hits / misses row filter needs the resolve log");
  }
  if (rows > 0x7fffffff || (a.F + 7) / 8 > 65535 || (a.C + 7) / 8 > 65535) {
    return unimplemented("cuda expert_ffn: {} rows, F {}, C {} exceed the launch grid", rows, a.F,
                         a.C);
  }
  FERRY_LAUNCH_TRY("serve expert_ffn", native(stream),
                   launch_expert_ffn(a, variant, native(stream)));
  return ok_status();
}

Status router_f32(float* weights, std::int32_t* ids, float* probs, const float* logits,
                  std::int64_t t, std::int64_t e, int k, bool renormalize, KernelVariant variant,
                  mem::Stream& stream) {
  if (stream.device() != Device::kCuda) return invalid_argument("cuda router_f32: CUDA stream");
  if (t == 0) return ok_status();
  if (weights == nullptr || ids == nullptr || probs == nullptr || logits == nullptr || t < 0 ||
      k < 1 || k > 32 || k > e) {
    return invalid_argument("cuda router_f32: missing pointers or t {}, top_k {} vs E {}", t, k, e);
  }
  if ((t + 3) / 4 > 0x7fffffff) return unimplemented("cuda router_f32: {} tokens", t);
  FERRY_LAUNCH_TRY("serve router_f32", native(stream),
                   launch_router_f32(weights, ids, probs, logits, t, e, k, renormalize, variant,
                                     native(stream)));
  return ok_status();
}

Status forced_routing(const ForcedRoutingArgs& a, mem::Stream& stream) {
  if (stream.device() != Device::kCuda) return invalid_argument("cuda forced_routing: CUDA stream");
  if (a.T <= 0) return ok_status();
  if (a.ids == nullptr || a.weights == nullptr || a.probs == nullptr || a.forced == nullptr ||
      a.K <= 0 || a.E < a.K) {
    return invalid_argument("cuda forced_routing: missing pointers or K {} / E {}", a.K, a.E);
  }
  if (a.K > 32) return unimplemented("cuda forced_routing: top-k {} > 32", a.K);
  FERRY_LAUNCH_TRY("serve forced_routing", native(stream),
                   launch_forced_routing(a, native(stream)));
  return ok_status();
}

bool small_m_gemm_enabled() {
  // NOTE(serve): the same switch as cuda_backend.cpp's (read once per process there too).
  static const bool on = [] {
    const char* v = std::getenv("FERRY_SMALL_M_GEMM");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

Status small_m_gemm_bf16w(const SmallMGemmBf16Args& a, mem::Stream& stream) {
  if (stream.device() != Device::kCuda) return invalid_argument("cuda small_m_gemm_bf16w: stream");
  if (a.out == nullptr || a.a == nullptr || a.b == nullptr || a.m < 1 || a.m > kSmallGemmMaxRows ||
      a.n < 0 || a.k < 1 || a.lda < a.k || a.ldb < a.k || a.ldo < a.n) {
    return invalid_argument("cuda small_m_gemm_bf16w: m {} (1..{}), n {}, k {}, ld {} {} {}", a.m,
                            kSmallGemmMaxRows, a.n, a.k, a.lda, a.ldb, a.ldo);
  }
  FERRY_LAUNCH_TRY("serve small_m_gemm_bf16w", native(stream),
                   launch_small_m_gemm_bf16w(a.out, a.a, a.b, a.bias, a.m, a.n, a.k, a.lda, a.ldb,
                                             a.ldo, a.alpha, a.beta, native(stream)));
  return ok_status();
}

Status widen_bf16(float* out, const std::uint16_t* in, std::int64_t n, mem::Stream& stream) {
  if (stream.device() != Device::kCuda) return invalid_argument("cuda widen_bf16: CUDA stream");
  if (n == 0) return ok_status();
  if (out == nullptr || in == nullptr || n < 0) {
    return invalid_argument("cuda widen_bf16: missing pointers or n {}", n);
  }
  FERRY_LAUNCH_TRY("serve widen_bf16", native(stream),
                   launch_widen_bf16(out, in, n, native(stream)));
  return ok_status();
}

Status embedding_bf16(float* out, const std::uint16_t* table, const std::int32_t* ids,
                      std::int64_t t, std::int64_t c, std::int64_t v, mem::Stream& stream) {
  if (stream.device() != Device::kCuda) {
    return invalid_argument("cuda embedding_bf16: CUDA stream");
  }
  if (t == 0) return ok_status();
  if (out == nullptr || table == nullptr || ids == nullptr || t < 0 || c <= 0 || v <= 0) {
    return invalid_argument("cuda embedding_bf16: missing pointers or t {} c {} v {}", t, c, v);
  }
  if (t > 0x7fffffff) return unimplemented("cuda embedding_bf16: {} tokens in one launch", t);
  FERRY_LAUNCH_TRY("serve embedding_bf16", native(stream),
                   launch_embedding_bf16(out, table, ids, t, c, v, native(stream)));
  return ok_status();
}

Status link_pace_mark(unsigned long long* d_mark, mem::Stream& stream) {
  if (stream.device() != Device::kCuda || d_mark == nullptr) {
    return invalid_argument("cuda link_pace_mark: needs a CUDA stream and a mark");
  }
  FERRY_LAUNCH_TRY("serve link_pace_mark", native(stream),
                   launch_link_pace_mark(d_mark, native(stream)));
  return ok_status();
}

Status copy_from_host(void* dst, const void* src, std::size_t bytes, int blocks,
                      mem::Stream& stream) {
  if (stream.device() != Device::kCuda) return invalid_argument("cuda copy_from_host: CUDA stream");
  if (bytes == 0) return ok_status();
  if (dst == nullptr || src == nullptr || blocks <= 0 || blocks > 65535 ||
      reinterpret_cast<std::uintptr_t>(dst) % 16 != 0 ||
      reinterpret_cast<std::uintptr_t>(src) % 16 != 0 || bytes % 16 != 0) {
    return invalid_argument(
        "cuda copy_from_host: needs 16-byte aligned pointers, a multiple of 16 bytes (got {}) and "
        "1..65535 blocks (got {})",
        bytes, blocks);
  }
  FERRY_LAUNCH_TRY("serve copy_from_host", native(stream),
                   launch_copy_from_host(dst, src, bytes, blocks, native(stream)));
  return ok_status();
}

Status link_pace_wait(unsigned long long* d_mark, unsigned long long ns, mem::Stream& stream) {
  if (stream.device() != Device::kCuda || d_mark == nullptr) {
    return invalid_argument("cuda link_pace_wait: needs a CUDA stream and a mark");
  }
  FERRY_LAUNCH_TRY("serve link_pace_wait", native(stream),
                   launch_link_pace_wait(d_mark, ns, native(stream)));
  return ok_status();
}

Status resolve_slots(const SlotResolveArgs& a, mem::Stream& stream) {
  return resolve_slots(a, KernelVariant::kDefault, stream);
}

Status resolve_slots(const SlotResolveArgs& a, KernelVariant variant, mem::Stream& stream) {
  if (stream.device() != Device::kCuda) return invalid_argument("cuda resolve_slots: CUDA stream");
  if (a.ids == nullptr || a.state == nullptr || a.table == nullptr || a.log == nullptr ||
      a.slot_base == nullptr || a.E <= 0 || a.max_cap <= 0 || a.n < 0 || a.expert_bytes <= 0) {
    return invalid_argument("cuda resolve_slots: missing pointers or empty shapes");
  }
  if (a.E > 4096) return unimplemented("cuda resolve_slots: {} experts > 4096", a.E);
  FERRY_LAUNCH_TRY("serve resolve_slots", native(stream),
                   launch_resolve_slots(a, variant, native(stream)));
  return ok_status();
}

Status copy_misses(const MissCopyArgs& a, mem::Stream& stream) {
  if (stream.device() != Device::kCuda) return invalid_argument("cuda copy_misses: CUDA stream");
  if (a.slot_base == nullptr || a.src_base == nullptr || a.log == nullptr || a.E <= 0 ||
      a.expert_bytes <= 0 || a.blocks <= 0 || a.blocks > 65535) {
    return invalid_argument("cuda copy_misses: missing pointers, empty shapes or {} blocks",
                            a.blocks);
  }
  FERRY_LAUNCH_TRY("serve copy_misses", native(stream), launch_copy_misses(a, native(stream)));
  return ok_status();
}

Status link_pace_wait_misses(unsigned long long* d_mark, const std::int32_t* d_log,
                             std::uint64_t expert_bytes, double gbps, mem::Stream& stream) {
  if (stream.device() != Device::kCuda || d_mark == nullptr || d_log == nullptr || !(gbps > 0)) {
    return invalid_argument(
        "cuda link_pace_wait_misses: needs a CUDA stream, a mark, a log, a rate");
  }
  FERRY_LAUNCH_TRY("serve link_pace_wait_misses", native(stream),
                   launch_link_pace_wait_misses(d_mark, d_log, expert_bytes, gbps, native(stream)));
  return ok_status();
}

Result<const void*> mapped_pointer(const void* host) {
  // Any address inside a pinned allocation (an expert store's layer starts mid-buffer): the
  // pointer's attributes name its device address (the same address under UVA).
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, host) == cudaSuccess && attr.type == cudaMemoryTypeHost &&
      attr.devicePointer != nullptr) {
    return static_cast<const void*>(attr.devicePointer);
  }
  cudaGetLastError();
  void* d = nullptr;
  if (const cudaError_t e = cudaHostGetDevicePointer(&d, const_cast<void*>(host), 0);
      e != cudaSuccess) {
    cudaGetLastError();
    return unavailable("cuda: host memory at {} is not mapped for the device ({})", host,
                       cudaGetErrorName(e));
  }
  return static_cast<const void*>(d);
}

}  // namespace ferry::kernels::cuda
