// SPDX-License-Identifier: Apache-2.0
// CUDA build: device memory via cudaMalloc on the requested device; pinned host memory via
// cudaHostAlloc or mmap + cudaHostRegister (PinnedMode). Allocation failures are Status values
// naming the tier, the request and what the driver reports free — never aborts.
#include <cuda_runtime.h>

#include "core/check.h"
#include "core/log.h"
#include "mem/budget.h"
#include "mem/cuda/cuda_util.h"
#include "mem/tier_alloc.h"

namespace ferry::mem::detail {

Result<std::byte*> device_alloc(std::size_t bytes, int device, std::string_view what) {
  ScopedDevice guard(device);
  if (guard.status() != cudaSuccess) {
    const cudaError_t e = guard.status();
    cudaGetLastError();
    return unavailable("mem: device {} unusable for {}: {} ({})", device, what, cudaGetErrorName(e),
                       cudaGetErrorString(e));
  }
  void* p = nullptr;
  if (const cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
    cudaGetLastError();
    std::size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    const StatusCode code =
        e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
    return Status(code, fmt::format("mem: device allocation failed on device {} for {}: need {}, "
                                    "free {} of {} ({})",
                                    device, what, format_bytes(bytes), format_bytes(free_b),
                                    format_bytes(total_b), cudaGetErrorName(e)));
  }
  return static_cast<std::byte*>(p);
}

void device_free(std::byte* p, std::size_t bytes, int device) {
  ScopedDevice guard(device);
  const cudaError_t e = cudaFree(p);
  FERRY_CHECK(e == cudaSuccess, "mem: cudaFree of {} bytes on device {} failed: {}", bytes, device,
              cudaGetErrorName(e));
}

bool device_tier_emulated() { return false; }

namespace {
// Page-locking needs a CUDA context. On a machine with no device (CI builds the CUDA variant
// without a GPU) the pinned tier degrades to plain mmap'd pages — same API and budget, nothing to
// pin for — and says so once. Decided once per process so alloc and free always agree.
bool pinned_without_device() {
  static const bool none = [] {
    int n = 0;
    const bool no_dev = cudaGetDeviceCount(&n) != cudaSuccess || n == 0;
    cudaGetLastError();
    if (no_dev) {
      log::get("mem")->warn("no CUDA device: the pinned-host tier uses unpinned mmap'd pages");
    }
    return no_dev;
  }();
  return none;
}
}  // namespace

Result<std::byte*> pinned_alloc(std::size_t bytes, PinnedMode mode, bool write_combined,
                                std::string_view what) {
  if (pinned_without_device()) return map_pages(bytes, "pinned-host", what);
  if (mode == PinnedMode::kHostAlloc) {
    void* p = nullptr;
    const unsigned flags =
        cudaHostAllocPortable | (write_combined ? cudaHostAllocWriteCombined : 0u);
    if (const cudaError_t e = cudaHostAlloc(&p, bytes, flags); e != cudaSuccess) {
      cudaGetLastError();
      return resource_exhausted(
          "mem: pinned-host allocation failed for {}: need {} "
          "(cudaHostAlloc: {})",
          what, format_bytes(bytes), cudaGetErrorName(e));
    }
    return static_cast<std::byte*>(p);
  }
  FERRY_ASSIGN_OR_RETURN(std::byte * p, map_pages(bytes, "pinned-host", what));
  prefault_pages(p, bytes);
  const std::size_t mapped = align_up(bytes, kPageBytes);
  if (const cudaError_t e = cudaHostRegister(p, mapped, cudaHostRegisterPortable);
      e != cudaSuccess) {
    cudaGetLastError();
    unmap_pages(p, bytes);
    return resource_exhausted(
        "mem: pinned-host registration failed for {}: need {} "
        "(cudaHostRegister: {}; check ulimit -l)",
        what, format_bytes(bytes), cudaGetErrorName(e));
  }
  return p;
}

void pinned_free(std::byte* p, std::size_t bytes, PinnedMode mode) {
  if (pinned_without_device()) return unmap_pages(p, bytes);
  if (mode == PinnedMode::kHostAlloc) {
    const cudaError_t e = cudaFreeHost(p);
    FERRY_CHECK(e == cudaSuccess, "mem: cudaFreeHost of {} bytes failed: {}", bytes,
                cudaGetErrorName(e));
    return;
  }
  const cudaError_t e = cudaHostUnregister(p);
  FERRY_CHECK(e == cudaSuccess, "mem: cudaHostUnregister of {} bytes failed: {}", bytes,
              cudaGetErrorName(e));
  unmap_pages(p, bytes);
}

}  // namespace ferry::mem::detail
