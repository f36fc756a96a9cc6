// SPDX-License-Identifier: Apache-2.0
// The Status side of decode_fusion.h: the switches, argument checks, then the launchers
// (launchers.h) with check_launch (FERRY_DEBUG_SYNC) after each.
#include "kernels/cuda/decode_fusion.h"

#include <atomic>
#include <cstdlib>

#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/serve_launchers.h"

namespace ferry::kernels::cuda {
namespace {

std::atomic<int> g_override{-1};
std::atomic<unsigned> g_override_off{0};

bool switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || v[0] != '0';
}

}  // namespace

void override_decode_fusion_for_tests(int on, unsigned off_mask) {
  g_override_off.store(on < 0 ? 0u : off_mask);
  g_override.store(on < 0 ? -1 : (on != 0 ? 1 : 0));
}

bool decode_fusion_enabled(DecodeFusion f) {
  if (const int o = g_override.load(); o >= 0) {
    return o == 1 && (g_override_off.load() & (1u << static_cast<unsigned>(f))) == 0;
  }
  static const bool all = switch_on("FERRY_DECODE_FUSION");
  static const bool qkv = all && switch_on("FERRY_FUSE_QKV");
  static const bool add_norm = all && switch_on("FERRY_FUSE_ADD_NORM");
  static const bool qk_norm_rope = all && switch_on("FERRY_FUSE_QK_NORM_ROPE");
  static const bool qk_norm_rope_kv = qk_norm_rope && switch_on("FERRY_FUSE_QK_NORM_ROPE_KV");
  switch (f) {
    case DecodeFusion::kQkv:
      return qkv;
    case DecodeFusion::kAddNorm:
      return add_norm;
    case DecodeFusion::kQkNormRope:
      return qk_norm_rope;
    case DecodeFusion::kQkNormRopeKv:
      return qk_norm_rope_kv;
  }
  return false;
}

static_assert(SmallMGemmMultiArgs::kMaxOutputs == kSmallGemmMaxOutputs);

namespace {
std::atomic<std::uint64_t> g_calls[kDecodeFusions];
void count_call(DecodeFusion f) {
  g_calls[static_cast<int>(f)].fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

std::uint64_t decode_fusion_calls(DecodeFusion f) {
  return g_calls[static_cast<int>(f)].load(std::memory_order_relaxed);
}

Status small_m_gemm_multi(const SmallMGemmMultiArgs& a, mem::Stream& stream) {
  if (stream.device() != Device::kCuda) return invalid_argument("cuda small_m_gemm_multi: stream");
  if (a.count < 1 || a.count > kSmallGemmMaxOutputs || a.a == nullptr || a.m < 1 ||
      a.m > kSmallGemmMaxRows || a.k < 1 || a.lda < a.k) {
    return invalid_argument(
        "cuda small_m_gemm_multi: {} outputs (1..{}), m {} (1..{}), k {}, lda {}", a.count,
        kSmallGemmMaxOutputs, a.m, kSmallGemmMaxRows, a.k, a.lda);
  }
  SmallMGemmOutput outs[kSmallGemmMaxOutputs];
  std::int64_t blocks = 0;
  for (int i = 0; i < a.count; ++i) {
    const SmallMGemmMultiArgs::Output& o = a.outs[i];
    if (o.out == nullptr || o.b == nullptr || o.n < 0 || o.ldb < a.k || o.ldo < o.n) {
      return invalid_argument("cuda small_m_gemm_multi: output {}: n {}, ldb {}, ldo {} (k {})", i,
                              o.n, o.ldb, o.ldo, a.k);
    }
    outs[i] = {.out = o.out, .b = o.b, .bias = o.bias, .n = o.n, .ldb = o.ldb, .ldo = o.ldo};
    blocks += (o.n + 7) / 8;
  }
  if (blocks > 0x7fffffff) {
    return unimplemented("cuda small_m_gemm_multi: {} blocks exceed the grid", blocks);
  }
  FERRY_LAUNCH_TRY("serve small_m_gemm_multi", native(stream),
                   a.bf16 ? launch_small_m_gemm_multi_bf16w(outs, a.count, a.a, a.m, a.k, a.lda,
                                                            a.alpha, a.beta, native(stream))
                          : launch_small_m_gemm_multi_f32(outs, a.count, a.a, a.m, a.k, a.lda,
                                                          a.alpha, a.beta, native(stream)));
  count_call(DecodeFusion::kQkv);
  return ok_status();
}

Status add_rms_norm(const AddRmsNormArgs& a, mem::Stream& stream) {
  if (stream.device() != Device::kCuda) return invalid_argument("cuda add_rms_norm: CUDA stream");
  if (a.n == 0) return ok_status();
  if (a.x_out == nullptr || a.out == nullptr || a.x == nullptr || a.y == nullptr ||
      a.weight == nullptr || a.n < 0 || a.c < 1) {
    return invalid_argument("cuda add_rms_norm: missing pointers or n {} c {}", a.n, a.c);
  }
  if (a.n > 0x7fffffff) return unimplemented("cuda add_rms_norm: {} rows in one launch", a.n);
  FERRY_LAUNCH_TRY("serve add_rms_norm", native(stream),
                   launch_add_rms_norm_f32(a.x_out, a.out, a.rstd, a.x, a.y, a.weight, a.n, a.c,
                                           a.eps, native(stream)));
  count_call(DecodeFusion::kAddNorm);
  return ok_status();
}

namespace {
// qk_norm_rope's argument checks: an error, or whether the launch fits the grid.
Result<bool> check_qk_norm_rope(const QkNormRopeArgs& a, const mem::Stream& stream) {
  if (stream.device() != Device::kCuda) return invalid_argument("cuda qk_norm_rope: CUDA stream");
  if (a.q_out == nullptr || a.q_in == nullptr || a.q_weight == nullptr || a.k_out == nullptr ||
      a.k_in == nullptr || a.k_weight == nullptr || a.positions == nullptr ||
      (a.r > 0 && a.inv_freq == nullptr) || a.t < 0 || a.h < 1 || a.g < 1 || a.d < 1 || a.r < 0) {
    return invalid_argument("cuda qk_norm_rope: missing pointers or t {} h {} g {} d {} r {}", a.t,
                            a.h, a.g, a.d, a.r);
  }
  return (a.t * (a.h + a.g) + 3) / 4 <= 0x7fffffff;
}
}  // namespace

Result<bool> qk_norm_rope(const QkNormRopeArgs& a, mem::Stream& stream) {
  FERRY_ASSIGN_OR_RETURN(const bool fits, check_qk_norm_rope(a, stream));
  if (!fits) return false;
  const cudaError_t e = launch_qk_norm_rope_f32(
      a.q_out, a.q_rstd, a.q_in, a.q_weight, a.k_out, a.k_rstd, a.k_in, a.k_weight, a.positions,
      a.inv_freq, a.t, a.h, a.g, a.d, a.r, a.eps, a.scaling, native(stream));
  if (e == cudaErrorNotSupported) return false;
  FERRY_LAUNCH_TRY("serve qk_norm_rope", native(stream), e);
  count_call(DecodeFusion::kQkNormRope);
  return true;
}

Result<bool> qk_norm_rope_kv_write(const QkNormRopeKvArgs& a, mem::Stream& stream) {
  FERRY_ASSIGN_OR_RETURN(const bool fits, check_qk_norm_rope(a.qk, stream));
  const PagedKvLayout& kv = a.kv;
  const PagedStep& st = a.step;
  if (kv.base == nullptr || kv.block_tokens <= 0 || kv.G != a.qk.g || kv.D != a.qk.d ||
      a.layer < 0 || a.v == nullptr || st.T != a.qk.t ||
      (st.T > 0 && (st.seq_of == nullptr || st.pos == nullptr || st.tables == nullptr ||
                    st.table_stride <= 0))) {
    return invalid_argument(
        "cuda qk_norm_rope_kv_write: KV layout G {} D {} (g {} d {}), layer {}, step T {} (t {}), "
        "or missing step / v pointers",
        kv.G, kv.D, a.qk.g, a.qk.d, a.layer, st.T, a.qk.t);
  }
  if (!fits) return false;
  const cudaError_t e = launch_qk_norm_rope_kv_f32(a, native(stream));
  if (e == cudaErrorNotSupported) return false;
  FERRY_LAUNCH_TRY("serve qk_norm_rope_kv_write", native(stream), e);
  count_call(DecodeFusion::kQkNormRope);
  count_call(DecodeFusion::kQkNormRopeKv);
  return true;
}

}  // namespace ferry::kernels::cuda
