// The digest of device memory (csrc/digest/digest.h): a grid-stride loop reads each element once,
// each thread sums x_i * s_i in double, a warp-shuffle and shared-memory reduction per block, one
// double atomicAdd per block into the caller's result.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "digest.h"
#include "sign_hash.h"

#define DIGEST_CUDA_CHECK(expr)                                                                      \
  do {                                                                                               \
    cudaError_t err_ = (expr);                                                                       \
    if (err_ != cudaSuccess) {                                                                       \
      (void)cudaGetLastError();                                                                      \
      throw ::specgen_digest::DigestError(std::string(#expr) + " failed: " + cudaGetErrorName(err_) + \
                                              " (" + cudaGetErrorString(err_) + ")",                 \
                                          __FILE__, __LINE__);                                       \
    }                                                                                                \
  } while (0)

namespace specgen_digest {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ double load(const float* x, int64_t i) { return static_cast<double>(__ldg(x + i)); }
__device__ __forceinline__ double load(const double* x, int64_t i) { return __ldg(x + i); }
__device__ __forceinline__ double load(const __half* x, int64_t i) { return static_cast<double>(__half2float(x[i])); }
__device__ __forceinline__ double load(const __nv_bfloat16* x, int64_t i) {
  return static_cast<double>(__bfloat162float(x[i]));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) digest_kernel(const T* __restrict__ x, int64_t n, uint64_t seed,
                                                           double* out) {
  double total = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    total += load(x, i) * sign_of(static_cast<uint64_t>(i), seed);
  }
  for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_down_sync(0xFFFFFFFFu, total, offset);
  __shared__ double warp_sums[kThreads / 32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = total;
  __syncthreads();
  if (warp == 0) {
    total = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_down_sync(0xFFFFFFFFu, total, offset);
    if (lane == 0) atomicAdd(out, total);
  }
}

// Makes `device` current for the scope and restores the caller's (torch keeps its own notion of the
// current device; it must not change behind its back).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    DIGEST_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device_) DIGEST_CUDA_CHECK(cudaSetDevice(device_));
  }
  ~DeviceGuard() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_ = 0;
  int previous_ = 0;
};

int blocks_for(int device, int64_t n) {
  constexpr int kMaxDevices = 64;
  static int sm_counts[kMaxDevices] = {};  // asked once per device: a runner digests every call
  DIGEST_CHECK(device >= 0 && device < kMaxDevices, "device_digest: device index out of range");
  int& sm_count = sm_counts[device];
  if (sm_count == 0) DIGEST_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  // Enough resident blocks to keep the memory system busy, no more than the elements need.
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(sm_count) * 4;
  return static_cast<int>(wanted < cap ? (wanted > 0 ? wanted : 1) : cap);
}

template <typename T>
void launch(int device, uint64_t data, int64_t n, uint64_t seed, uint64_t out, uint64_t stream) {
  digest_kernel<T><<<blocks_for(device, n), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const T*>(data), n, seed, reinterpret_cast<double*>(out));
  DIGEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void device_digest(int device, uint64_t data, int64_t n, DType dtype, uint64_t seed, uint64_t out,
                   uint64_t stream) {
  DIGEST_CHECK(n >= 0, "device_digest: negative element count");
  DIGEST_CHECK(out != 0, "device_digest: null result pointer");
  if (n == 0) return;
  DIGEST_CHECK(data != 0, "device_digest: null data pointer");
  DeviceGuard guard(device);
  switch (dtype) {
    case DType::F32: return launch<float>(device, data, n, seed, out, stream);
    case DType::F64: return launch<double>(device, data, n, seed, out, stream);
    case DType::F16: return launch<__half>(device, data, n, seed, out, stream);
    case DType::BF16: return launch<__nv_bfloat16>(device, data, n, seed, out, stream);
  }
  throw DigestError("device_digest: unknown dtype", __FILE__, __LINE__);
}

bool cuda_compiled() { return true; }

}  // namespace specgen_digest
