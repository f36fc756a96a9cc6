// SPDX-License-Identifier: Apache-2.0
#include "serve/device_ops.h"

#if FERRY_HAVE_CUDA
#include "kernels/cuda/serve_kernels.h"
#endif

namespace ferry::serve::device {

#if FERRY_HAVE_CUDA
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
#endif

}  // namespace ferry::serve::device
