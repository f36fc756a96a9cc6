// SPDX-License-Identifier: Apache-2.0
// TEMPORARY: placeholder definitions so the backend links while these ops are being written.
// Each returns unimplemented; the file is deleted when the real ops land.
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

Status ReferenceBackend::gemm(const GemmArgs&, Stream&) {
  return unimplemented("kernels: gemm not written yet");
}
Status ReferenceBackend::embedding(const EmbeddingArgs&, Stream&) {
  return unimplemented("kernels: embedding not written yet");
}
Status ReferenceBackend::embedding_backward(const EmbeddingBackwardArgs&, Stream&) {
  return unimplemented("kernels: embedding_backward not written yet");
}
Status ReferenceBackend::rms_norm(const RmsNormArgs&, Stream&) {
  return unimplemented("kernels: rms_norm not written yet");
}
Status ReferenceBackend::rms_norm_backward(const RmsNormBackwardArgs&, Stream&) {
  return unimplemented("kernels: rms_norm_backward not written yet");
}
Status ReferenceBackend::rope(const RopeArgs&, Stream&) {
  return unimplemented("kernels: rope not written yet");
}
Status ReferenceBackend::swiglu(const SwiGluArgs&, Stream&) {
  return unimplemented("kernels: swiglu not written yet");
}
Status ReferenceBackend::swiglu_backward(const SwiGluBackwardArgs&, Stream&) {
  return unimplemented("kernels: swiglu_backward not written yet");
}
Status ReferenceBackend::add(const AddArgs&, Stream&) {
  return unimplemented("kernels: add not written yet");
}
Status ReferenceBackend::adamw(const AdamWArgs&, Stream&) {
  return unimplemented("kernels: adamw not written yet");
}
Status ReferenceBackend::sum_squares(const SumSquaresArgs&, Stream&) {
  return unimplemented("kernels: sum_squares not written yet");
}

}  // namespace ferry::kernels
