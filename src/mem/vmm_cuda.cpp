// SPDX-License-Identifier: Apache-2.0
// CUDA build: device virtual reservations through the CUDA virtual memory management API
// (cuMemAddressReserve, then per mapped range cuMemCreate + cuMemMap + cuMemSetAccess; undone by
// cuMemUnmap + cuMemRelease, and cuMemAddressFree for the reservation).
// Why the driver entry points come from cudaGetDriverEntryPoint*: the rest of ferry links only
// the runtime (CUDA::cudart); fetching the eight functions at run time keeps libcuda out of the
// link line, and the CPU+nvcc CI build links as before. They are requested at the CUDA 12.0 ABI
// (the cuMem* signatures are those of 10.2, the _v10020 typedefs).
// Each map() is one physical allocation (its own handle): cuMemUnmap cannot unmap part of a
// mapping, so the caller maps the granules it may later release one by one.
// Where VMM is missing (a driver without the entry points, a device whose
// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0, or cuMemAddressReserve answering
// CUDA_ERROR_NOT_SUPPORTED) the functions here return unavailable, and VirtualRegion backs the
// range whole up front with device_up_front_alloc (cudaMalloc).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/check.h"
#include "mem/budget.h"
#include "mem/cuda/cuda_util.h"
#include "mem/tier_alloc.h"
#include "mem/vmm.h"

namespace ferry::mem::detail {

namespace {

struct DriverVmm {
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 attribute = nullptr;
  std::string error;  // empty: every entry point was found
};

template <typename Fn>
void entry_point(const char* name, Fn& fn, std::string& error) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &found);
#endif
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();
    if (error.empty()) {
      error = std::string(name) + ": " + (e != cudaSuccess ? cudaGetErrorName(e) : "not found");
    }
    return;
  }
  fn = reinterpret_cast<Fn>(p);
}

const DriverVmm& driver() {
  static const DriverVmm d = [] {
    DriverVmm v;
    entry_point("cuMemGetAllocationGranularity", v.granularity, v.error);
    entry_point("cuMemAddressReserve", v.reserve, v.error);
    entry_point("cuMemAddressFree", v.address_free, v.error);
    entry_point("cuMemCreate", v.create, v.error);
    entry_point("cuMemRelease", v.release, v.error);
    entry_point("cuMemMap", v.map, v.error);
    entry_point("cuMemUnmap", v.unmap, v.error);
    entry_point("cuMemSetAccess", v.set_access, v.error);
    entry_point("cuDeviceGet", v.device_get, v.error);
    entry_point("cuDeviceGetAttribute", v.attribute, v.error);
    return v;
  }();
  return d;
}

Status driver_ready(int device, std::string_view what) {
  // The driver calls below act on the current context: make sure device's primary one exists.
  // First, so that no device (or no driver) is its own error and not "no VMM" (unavailable,
  // which VirtualRegion answers by allocating the whole range instead).
  ScopedDevice guard(device);
  FERRY_CUDA_TRY(guard.status());
  FERRY_CUDA_TRY(cudaFree(nullptr));
  const DriverVmm& d = driver();
  if (!d.error.empty()) {
    return unavailable("mem: the CUDA driver lacks virtual memory management for {} ({})", what,
                       d.error);
  }
  return ok_status();
}

Status cu_status(CUresult r, std::string_view call, std::size_t bytes, int device,
                 std::string_view what) {
  if (r == CUDA_ERROR_NOT_SUPPORTED) {  // no VMM on this device: vmm.h's "unavailable"
    return unavailable("mem: {} of {} on device {} for {} returned CUDA_ERROR_NOT_SUPPORTED", call,
                       format_bytes(bytes), device, what);
  }
  const StatusCode code =
      r == CUDA_ERROR_OUT_OF_MEMORY ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  std::size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  cudaGetLastError();
  return Status(code, fmt::format("mem: {} of {} on device {} for {} failed (CUresult {}); "
                                  "free {} of {}",
                                  call, format_bytes(bytes), device, what, static_cast<int>(r),
                                  format_bytes(free_b), format_bytes(total_b)));
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUdeviceptr dptr(std::byte* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}

}  // namespace

Result<std::size_t> device_vmm_granularity(int device) {
  FERRY_TRY(driver_ready(device, "granularity query"));
  const CUmemAllocationProp prop = device_prop(device);
  std::size_t g = 0;
  if (const CUresult r = driver().granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS || g == 0) {
    return cu_status(r, "cuMemGetAllocationGranularity", 0, device, "granularity query");
  }
  return g;
}

Status device_vmm_supported(int device) {
  FERRY_TRY(driver_ready(device, "virtual memory support query"));
  const DriverVmm& d = driver();
  CUdevice dev = 0;
  int supported = 0;
  if (const CUresult r = d.device_get(&dev, device); r != CUDA_SUCCESS) {
    return cu_status(r, "cuDeviceGet", 0, device, "virtual memory support query");
  }
  if (const CUresult r =
          d.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
      r != CUDA_SUCCESS) {
    return cu_status(r, "cuDeviceGetAttribute", 0, device, "virtual memory support query");
  }
  if (supported == 0) {
    return unavailable(
        "mem: device {} lacks CUDA virtual memory management "
        "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)",
        device);
  }
  return ok_status();
}

Result<std::byte*> device_vmm_reserve(std::size_t bytes, std::size_t align, int device,
                                      std::string_view what) {
  FERRY_TRY(driver_ready(device, what));
  CUdeviceptr p = 0;
  if (const CUresult r = driver().reserve(&p, bytes, align, 0, 0); r != CUDA_SUCCESS) {
    return cu_status(r, "cuMemAddressReserve", bytes, device, what);
  }
  return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(p));
}

void device_vmm_free(std::byte* base, std::size_t bytes, int device) {
  ScopedDevice guard(device);
  const CUresult r = driver().address_free(dptr(base), bytes);
  FERRY_CHECK(r == CUDA_SUCCESS, "mem: cuMemAddressFree of {} bytes on device {}: CUresult {}",
              bytes, device, static_cast<int>(r));
}

Result<std::uint64_t> device_vmm_map(std::byte* at, std::size_t bytes, int device,
                                     std::string_view what) {
  ScopedDevice guard(device);
  FERRY_CUDA_TRY(guard.status());
  const DriverVmm& d = driver();
  const CUmemAllocationProp prop = device_prop(device);
  CUmemGenericAllocationHandle h = 0;
  if (const CUresult r = d.create(&h, bytes, &prop, 0); r != CUDA_SUCCESS) {
    return cu_status(r, "cuMemCreate", bytes, device, what);
  }
  if (const CUresult r = d.map(dptr(at), bytes, 0, h, 0); r != CUDA_SUCCESS) {
    d.release(h);
    return cu_status(r, "cuMemMap", bytes, device, what);
  }
  // A new mapping starts with no access rights, for any device.
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (const CUresult r = d.set_access(dptr(at), bytes, &access, 1); r != CUDA_SUCCESS) {
    d.unmap(dptr(at), bytes);
    d.release(h);
    return cu_status(r, "cuMemSetAccess", bytes, device, what);
  }
  return static_cast<std::uint64_t>(h);
}

void device_vmm_unmap(std::byte* at, std::size_t bytes, std::uint64_t handle, int device) {
  ScopedDevice guard(device);
  const DriverVmm& d = driver();
  const CUresult r = d.unmap(dptr(at), bytes);
  FERRY_CHECK(r == CUDA_SUCCESS, "mem: cuMemUnmap of {} bytes on device {}: CUresult {}", bytes,
              device, static_cast<int>(r));
  // The physical memory goes back once its last mapping and its handle are gone.
  const CUresult rr = d.release(static_cast<CUmemGenericAllocationHandle>(handle));
  FERRY_CHECK(rr == CUDA_SUCCESS, "mem: cuMemRelease of {} bytes on device {}: CUresult {}", bytes,
              device, static_cast<int>(rr));
}

// The whole-up-front backing is an ordinary device allocation (tier_alloc_cuda.cpp), whose error
// names the bytes needed and free.
Result<std::byte*> device_up_front_alloc(std::size_t bytes, int device) {
  return device_alloc(bytes, device, "a whole-up-front region");
}

void device_up_front_free(std::byte* p, std::size_t bytes, int device) {
  device_free(p, bytes, device);
}

}  // namespace ferry::mem::detail
