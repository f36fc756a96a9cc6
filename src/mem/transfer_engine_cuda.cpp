// SPDX-License-Identifier: Apache-2.0
// CUDA transfer engine: cudaMemcpyAsync on the caller's stream; completion through Events.
#include <cuda_runtime.h>

#include "core/check.h"
#include "mem/cuda/cuda_util.h"
#include "mem/runtime_hooks.h"
#include "mem/transfer_engine.h"

namespace ferry::mem {

namespace {

class CudaTransferEngine final : public TransferEngine {
 public:
  explicit CudaTransferEngine(int device) : device_(device) {}
  Device device() const override { return Device::kCuda; }

  Status copy(void* dst, const void* src, std::size_t bytes, CopyKind kind,
              Stream& stream) override {
    FERRY_CHECK(stream.device() == Device::kCuda && stream.device_index() == device_,
                "mem: cuda transfer engine (device {}) given a {} stream of device {}", device_,
                to_string(stream.device()), stream.device_index());
    if (bytes == 0) return {};
    detail::RtCopyKind k = detail::RtCopyKind::kHostToDevice;
    if (kind == CopyKind::kDeviceToHost) k = detail::RtCopyKind::kDeviceToHost;
    if (kind == CopyKind::kDeviceToDevice) k = detail::RtCopyKind::kDeviceToDevice;
    FERRY_TRY(detail::rt_memcpy_async(dst, src, bytes, k, stream.native()));
    count(kind, bytes);
    return {};
  }
  Status zero(void* dst, std::size_t bytes, Stream& stream) override {
    FERRY_CHECK(stream.device() == Device::kCuda && stream.device_index() == device_,
                "mem: cuda transfer engine (device {}) given a {} stream of device {}", device_,
                to_string(stream.device()), stream.device_index());
    if (bytes == 0) return {};
    return detail::rt_memset_async(dst, 0, bytes, stream.native());
  }

 private:
  int device_;
};

}  // namespace

Result<std::unique_ptr<TransferEngine>> cuda_transfer_engine(int device) {
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || device < 0 || device >= n) {
    cudaGetLastError();
    return unavailable("mem: no CUDA transfer engine for device {}: {} device(s) visible{}", device,
                       n, e != cudaSuccess ? fmt::format(" ({})", cudaGetErrorName(e)) : "");
  }
  return std::unique_ptr<TransferEngine>(new CudaTransferEngine(device));
}

}  // namespace ferry::mem
