// Host-side pieces every CUDA source of the extension shares: the CUDA_CHECK macro, the device guard
// and the device checks. Only .cu files include this; the API in cuda_ops.h stays free of CUDA headers
// so that the bindings and the CPU-only build compile without them.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kv_common.h"

namespace specgen_kv::cuda_ops {

inline std::string describe(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

}  // namespace specgen_kv::cuda_ops

// Every CUDA call goes through this: the failing call, the error and file:line become a KvError.
// cudaGetLastError clears a non-sticky error so the next call does not report it again.
#define CUDA_CHECK(expr)                                                                        \
  do {                                                                                          \
    cudaError_t err_ = (expr);                                                                  \
    if (err_ != cudaSuccess) {                                                                  \
      (void)cudaGetLastError();                                                                 \
      throw ::specgen_kv::KvError(std::string(#expr) + " failed: " +                           \
                                      ::specgen_kv::cuda_ops::describe(err_),                   \
                                  __FILE__, __LINE__);                                          \
    }                                                                                           \
  } while (0)

namespace specgen_kv::cuda_ops {

// Makes `device` current for the scope and restores the caller's device (torch keeps its own notion
// of the current device; we must not change it behind its back).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) CUDA_CHECK(cudaSetDevice(device));
    device_ = device;
  }
  ~DeviceGuard() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int device_ = 0;
};

// Throws unless `device` is a usable CUDA device. Defined in cuda_ops.cu, so the message names that
// file whichever copy path asked.
void check_device(int device);
// Multiprocessor count of `device`, queried once per device: launch paths ask on every copy.
int sm_count_cached(int device);

}  // namespace specgen_kv::cuda_ops
