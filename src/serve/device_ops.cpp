// SPDX-License-Identifier: Apache-2.0
#include "serve/device_ops.h"

#if FERRY_HAVE_CUDA
#include "kernels/cuda/decode_fusion.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/serve_kernels.h"
#endif

namespace ferry::serve::device {

#if FERRY_HAVE_CUDA
static_assert(kSmallGemmRows == kernels::cuda::kSmallGemmMaxRows);

Status kv_write(const PagedKvLayout& kv, int layer, const PagedStep& step, const float* k,
                const float* v, mem::Stream& stream) {
  return kernels::cuda::kv_write(kv, layer, step, k, v, stream);
}
Status paged_attention(const PagedKvLayout& kv, int layer, const PagedStep& step, float* out,
                       const float* q, int H, float scale, mem::Stream& stream) {
  return kernels::cuda::paged_attention(kv, layer, step, out, q, H, scale, stream);
}
Status expert_ffn(const ExpertFfnArgs& a, mem::Stream& stream) {
  return kernels::cuda::expert_ffn(a, stream);
}
Status forced_routing(const ForcedRoutingArgs& a, mem::Stream& stream) {
  return kernels::cuda::forced_routing(a, stream);
}
Status link_pace_mark(unsigned long long* d_mark, mem::Stream& stream) {
  return kernels::cuda::link_pace_mark(d_mark, stream);
}
Status link_pace_wait(unsigned long long* d_mark, unsigned long long ns, mem::Stream& stream) {
  return kernels::cuda::link_pace_wait(d_mark, ns, stream);
}
Status resolve_slots(const SlotResolveArgs& a, mem::Stream& stream) {
  return kernels::cuda::resolve_slots(a, stream);
}
Status copy_misses(const MissCopyArgs& a, mem::Stream& stream) {
  return kernels::cuda::copy_misses(a, stream);
}
Status link_pace_wait_misses(unsigned long long* d_mark, const std::int32_t* d_log,
                             std::uint64_t expert_bytes, double gbps, mem::Stream& stream) {
  return kernels::cuda::link_pace_wait_misses(d_mark, d_log, expert_bytes, gbps, stream);
}
Result<const void*> mapped_pointer(const void* host) { return kernels::cuda::mapped_pointer(host); }
bool small_m_gemm_enabled() { return kernels::cuda::small_m_gemm_enabled(); }
Status small_m_gemm_bf16w(const SmallMGemmBf16Args& a, mem::Stream& stream) {
  return kernels::cuda::small_m_gemm_bf16w(a, stream);
}
Status widen_bf16(float* out, const std::uint16_t* in, std::int64_t n, mem::Stream& stream) {
  return kernels::cuda::widen_bf16(out, in, n, stream);
}
Status embedding_bf16(float* out, const std::uint16_t* table, const std::int32_t* ids,
                      std::int64_t t, std::int64_t c, std::int64_t v, mem::Stream& stream) {
  return kernels::cuda::embedding_bf16(out, table, ids, t, c, v, stream);
}
bool decode_fusion_enabled(DecodeFusion f) { return kernels::cuda::decode_fusion_enabled(f); }
Status small_m_gemm_multi(const SmallMGemmMultiArgs& a, mem::Stream& stream) {
  return kernels::cuda::small_m_gemm_multi(a, stream);
}
Status add_rms_norm(const AddRmsNormArgs& a, mem::Stream& stream) {
  return kernels::cuda::add_rms_norm(a, stream);
}
Result<bool> qk_norm_rope(const QkNormRopeArgs& a, mem::Stream& stream) {
  return kernels::cuda::qk_norm_rope(a, stream);
}
Result<bool> qk_norm_rope_kv_write(const QkNormRopeKvArgs& a, mem::Stream& stream) {
  return kernels::cuda::qk_norm_rope_kv_write(a, stream);
}
#else
Status kv_write(const PagedKvLayout&, int, const PagedStep&, const float*, const float*,
                mem::Stream&) {
  return unavailable("serve: kv_write needs a CUDA build");
}
Status paged_attention(const PagedKvLayout&, int, const PagedStep&, float*, const float*, int,
                       float, mem::Stream&) {
  return unavailable("serve: paged_attention on CUDA needs a CUDA build");
}
Status expert_ffn(const ExpertFfnArgs&, mem::Stream&) {
  return unavailable("serve: expert_ffn on CUDA needs a CUDA build");
}
Status forced_routing(const ForcedRoutingArgs&, mem::Stream&) {
  return unavailable("serve: forced_routing on CUDA needs a CUDA build");
}
Status link_pace_mark(unsigned long long*, mem::Stream&) {
  return unavailable("serve: link pacing on CUDA needs a CUDA build");
}
Status link_pace_wait(unsigned long long*, unsigned long long, mem::Stream&) {
  return unavailable("serve: link pacing on CUDA needs a CUDA build");
}
Status resolve_slots(const SlotResolveArgs&, mem::Stream&) {
  return unavailable("serve: device slot resolution needs a CUDA build");
}
Status copy_misses(const MissCopyArgs&, mem::Stream&) {
  return unavailable("serve: device miss copies need a CUDA build");
}
Status link_pace_wait_misses(unsigned long long*, const std::int32_t*, std::uint64_t, double,
                             mem::Stream&) {
  return unavailable("serve: link pacing on CUDA needs a CUDA build");
}
Result<const void*> mapped_pointer(const void*) {
  return unavailable("serve: mapped host memory needs a CUDA build");
}
bool small_m_gemm_enabled() { return false; }
Status small_m_gemm_bf16w(const SmallMGemmBf16Args&, mem::Stream&) {
  return unavailable("serve: bf16 dense GEMMs on CUDA need a CUDA build");
}
Status widen_bf16(float*, const std::uint16_t*, std::int64_t, mem::Stream&) {
  return unavailable("serve: bf16 dense weights on CUDA need a CUDA build");
}
Status embedding_bf16(float*, const std::uint16_t*, const std::int32_t*, std::int64_t, std::int64_t,
                      std::int64_t, mem::Stream&) {
  return unavailable("serve: bf16 embeddings on CUDA need a CUDA build");
}
bool decode_fusion_enabled(DecodeFusion) { return false; }
Status small_m_gemm_multi(const SmallMGemmMultiArgs&, mem::Stream&) {
  return unavailable("serve: fused small-m GEMMs need a CUDA build");
}
Status add_rms_norm(const AddRmsNormArgs&, mem::Stream&) {
  return unavailable("serve: fused add + rms_norm needs a CUDA build");
}
Result<bool> qk_norm_rope(const QkNormRopeArgs&, mem::Stream&) {
  return unavailable("serve: fused q/k norm + rope needs a CUDA build");
}
Result<bool> qk_norm_rope_kv_write(const QkNormRopeKvArgs&, mem::Stream&) {
  return unavailable("serve: fused q/k norm + rope + KV write needs a CUDA build");
}
#endif

}  // namespace ferry::serve::device
