// SPDX-License-Identifier: Apache-2.0
// TEMPORARY: placeholder definitions so the backend links while these ops are being written.
// Each returns unimplemented; the file is deleted when the real ops land.
#include "kernels/cpu/cpu_backend.h"

namespace ferry::kernels {

std::size_t CpuBackend::workspace_bytes(const CrossEntropyArgs&) const { return 0; }
Status CpuBackend::attention(const AttentionArgs&, Stream&) {
  return unimplemented("kernels: attention not written yet");
}
Status CpuBackend::attention_backward(const AttentionBackwardArgs&, Stream&) {
  return unimplemented("kernels: attention_backward not written yet");
}
Status CpuBackend::router(const RouterArgs&, Stream&) {
  return unimplemented("kernels: router not written yet");
}
Status CpuBackend::router_backward(const RouterBackwardArgs&, Stream&) {
  return unimplemented("kernels: router_backward not written yet");
}
Status CpuBackend::moe_dispatch(const MoeDispatchArgs&, Stream&) {
  return unimplemented("kernels: moe_dispatch not written yet");
}
Status CpuBackend::moe_dispatch_backward(const MoeDispatchBackwardArgs&, Stream&) {
  return unimplemented("kernels: moe_dispatch_backward not written yet");
}
Status CpuBackend::moe_combine(const MoeCombineArgs&, Stream&) {
  return unimplemented("kernels: moe_combine not written yet");
}
Status CpuBackend::moe_combine_backward(const MoeCombineBackwardArgs&, Stream&) {
  return unimplemented("kernels: moe_combine_backward not written yet");
}
Status CpuBackend::cross_entropy(const CrossEntropyArgs&, Stream&) {
  return unimplemented("kernels: cross_entropy not written yet");
}

}  // namespace ferry::kernels
