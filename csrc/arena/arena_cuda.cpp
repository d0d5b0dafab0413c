// arena.h with CUDA: the driver's virtual memory management, reached through the runtime's entry-point
// query so that the module links no libcuda (it loads on a host without a driver, as the other
// modules do, and fails only when called there).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <mutex>

#include "arena.h"

namespace specgen_arena {
namespace {

struct Driver {
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 free_address = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
};

void check_rt(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw ArenaError(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

void check(CUresult status, const char* what) {
  if (status != CUDA_SUCCESS) {
    throw ArenaError(std::string(what) + " failed with CUresult " + std::to_string(static_cast<int>(status)));
  }
}

template <typename F>
void entry(const char* symbol, F* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  check_rt(cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found), symbol);
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    throw ArenaError(std::string("the CUDA driver has no ") + symbol);
  }
  *out = reinterpret_cast<F>(fn);
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  static std::string failed;
  std::call_once(once, [] {
    try {
      entry("cuMemCreate", &d.create);
      entry("cuMemRelease", &d.release);
      entry("cuMemAddressReserve", &d.reserve);
      entry("cuMemAddressFree", &d.free_address);
      entry("cuMemMap", &d.map);
      entry("cuMemUnmap", &d.unmap);
      entry("cuMemSetAccess", &d.set_access);
      entry("cuMemExportToShareableHandle", &d.export_handle);
      entry("cuMemImportFromShareableHandle", &d.import_handle);
      entry("cuMemGetAllocationGranularity", &d.granularity);
    } catch (const ArenaError& e) {
      failed = e.what();
    }
  });
  if (!failed.empty()) throw ArenaError(failed);
  return d;
}

CUmemAllocationProp properties(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// The primary context of `device` current on this thread: where torch's tensors live.
void use_device(int device) {
  check_rt(cudaSetDevice(device), "cudaSetDevice");
  check_rt(cudaFree(nullptr), "creating the device's primary context");
}

// Reserves an address range for `handle`, maps it there and opens it read-write to `device`.
uint64_t map_here(const Driver& d, int device, CUmemGenericAllocationHandle handle, uint64_t size) {
  CUdeviceptr ptr = 0;
  check(d.reserve(&ptr, size, 0, 0, 0), "cuMemAddressReserve");
  CUresult status = d.map(ptr, size, 0, handle, 0);
  if (status != CUDA_SUCCESS) {
    d.free_address(ptr, size);
    check(status, "cuMemMap");
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  status = d.set_access(ptr, size, &access, 1);
  if (status != CUDA_SUCCESS) {
    d.unmap(ptr, size);
    d.free_address(ptr, size);
    check(status, "cuMemSetAccess");
  }
  return static_cast<uint64_t>(ptr);
}

}  // namespace

Mapping create(int device, uint64_t nbytes) {
  const Driver& d = driver();
  use_device(device);
  CUmemAllocationProp prop = properties(device);
  size_t grain = 0;
  check(d.granularity(&grain, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
  uint64_t size = ((nbytes ? nbytes : 1) + grain - 1) / grain * grain;
  CUmemGenericAllocationHandle handle = 0;
  check(d.create(&handle, size, &prop, 0), "cuMemCreate");
  int fd = -1;
  CUresult status = d.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (status != CUDA_SUCCESS) {
    d.release(handle);
    check(status, "cuMemExportToShareableHandle");
  }
  uint64_t ptr = 0;
  try {
    ptr = map_here(d, device, handle, size);
  } catch (...) {
    ::close(fd);
    d.release(handle);
    throw;
  }
  // The mapping holds the allocation from here on; close() releases it with the mapping.
  d.release(handle);
  return Mapping{fd, ptr, size};
}

Mapping open(int device, int fd, uint64_t size) {
  const Driver& d = driver();
  use_device(device);
  CUmemGenericAllocationHandle handle = 0;
  check(d.import_handle(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle");
  uint64_t ptr = 0;
  try {
    ptr = map_here(d, device, handle, size);
  } catch (...) {
    d.release(handle);
    throw;
  }
  d.release(handle);
  return Mapping{-1, ptr, size};
}

void close(int device, uint64_t ptr, uint64_t size) {
  const Driver& d = driver();
  use_device(device);
  check_rt(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(d.unmap(static_cast<CUdeviceptr>(ptr), size), "cuMemUnmap");
  check(d.free_address(static_cast<CUdeviceptr>(ptr), size), "cuMemAddressFree");
}

bool cuda_compiled() { return true; }

}  // namespace specgen_arena
