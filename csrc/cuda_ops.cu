// CUDA implementation of the runtime half of cuda_ops.h: devices, memory, peer access, IPC, events and
// streams. The copy paths are in copy_launch.cu and persistent_copier.cu.
//
// The runtime is linked statically and never needs a GPU to load: every entry point that can run
// without a device (device_count, pointer_device) turns a missing driver into "no device" instead of
// an error, so the same module works on host memory on a machine without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cuda_common.cuh"
#include "cuda_ops.h"

namespace specgen_kv::cuda_ops {
namespace {

struct EventRecord {
  cudaEvent_t event;
  int device;
};

std::mutex& event_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::vector<EventRecord*>& free_events() {
  static std::vector<EventRecord*> events;
  return events;
}

}  // namespace

void check_device(int device) {
  int count = device_count();
  KV_CHECK(device >= 0 && device < count,
           "CUDA device " + std::to_string(device) + " does not exist (this machine has " +
               std::to_string(count) + " usable CUDA devices)");
}

int sm_count_cached(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, int> counts;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = counts.find(device);
  if (it != counts.end()) return it->second;
  int count = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  counts[device] = count;
  return count;
}

bool compiled() { return true; }

int runtime_version() { return CUDART_VERSION; }

int device_count() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

int pointer_device(uint64_t ptr) {
  if (device_count() == 0) return -1;
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(ptr));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice ? attr.device : -1;
}

int multiprocessor_count(int device) {
  check_device(device);
  return sm_count_cached(device);
}

std::pair<int64_t, int64_t> mem_get_info(int device) {
  check_device(device);
  DeviceGuard guard(device);
  size_t free_bytes = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total)};
}

uint64_t device_alloc(int device, int64_t bytes) {
  check_device(device);
  KV_CHECK(bytes > 0, "device_alloc: bytes must be > 0, got " + std::to_string(bytes));
  DeviceGuard guard(device);
  void* ptr = nullptr;
  CUDA_CHECK(cudaMalloc(&ptr, static_cast<size_t>(bytes)));
  return reinterpret_cast<uint64_t>(ptr);
}

void device_free(int device, uint64_t ptr) {
  check_device(device);
  DeviceGuard guard(device);
  CUDA_CHECK(cudaFree(reinterpret_cast<void*>(ptr)));
}

void device_free_many(int device, const std::vector<uint64_t>& ptrs) {
  check_device(device);
  DeviceGuard guard(device);
  for (uint64_t ptr : ptrs) CUDA_CHECK(cudaFree(reinterpret_cast<void*>(ptr)));
}

void device_memset(int device, uint64_t ptr, int value, int64_t bytes) {
  check_device(device);
  DeviceGuard guard(device);
  CUDA_CHECK(cudaMemset(reinterpret_cast<void*>(ptr), value, static_cast<size_t>(bytes)));
}

bool can_access_peer(int device, int peer) {
  check_device(device);
  check_device(peer);
  if (device == peer) return true;
  int can = 0;
  CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer));
  return can != 0;
}

bool enable_peer_access(int device, int peer) {
  if (device == peer) return true;
  if (!can_access_peer(device, peer)) return false;
  DeviceGuard guard(device);
  cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return true;
  }
  CUDA_CHECK(err);
  return true;
}

std::string ipc_export(int device, uint64_t ptr) {
  check_device(device);
  DeviceGuard guard(device);
  cudaIpcMemHandle_t handle;
  CUDA_CHECK(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(ptr)));
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

uint64_t ipc_open(int device, const std::string& handle_bytes) {
  check_device(device);
  KV_CHECK(handle_bytes.size() == sizeof(cudaIpcMemHandle_t),
           "ipc_open: a CUDA IPC handle has " + std::to_string(sizeof(cudaIpcMemHandle_t)) + " bytes, got " +
               std::to_string(handle_bytes.size()));
  DeviceGuard guard(device);
  cudaIpcMemHandle_t handle;
  std::copy(handle_bytes.begin(), handle_bytes.end(), reinterpret_cast<char*>(&handle));
  void* ptr = nullptr;
  CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess));
  return reinterpret_cast<uint64_t>(ptr);
}

void ipc_close(int device, uint64_t ptr) {
  check_device(device);
  DeviceGuard guard(device);
  CUDA_CHECK(cudaIpcCloseMemHandle(reinterpret_cast<void*>(ptr)));
}

uint64_t event_acquire(int device) {
  {
    std::lock_guard<std::mutex> lock(event_mutex());
    auto& pool = free_events();
    for (size_t i = 0; i < pool.size(); ++i) {
      if (pool[i]->device == device) {
        EventRecord* rec = pool[i];
        pool[i] = pool.back();
        pool.pop_back();
        return reinterpret_cast<uint64_t>(rec);
      }
    }
  }
  DeviceGuard guard(device);
  auto* rec = new EventRecord{nullptr, device};
  // No timing: recording is cheaper. Waiting spins (default flags), which is what a latency-bound
  // caller wants.
  cudaError_t err = cudaEventCreateWithFlags(&rec->event, cudaEventDisableTiming);
  if (err != cudaSuccess) delete rec;
  CUDA_CHECK(err);
  return reinterpret_cast<uint64_t>(rec);
}

void event_release(uint64_t event) {
  if (event == 0) return;
  std::lock_guard<std::mutex> lock(event_mutex());
  free_events().push_back(reinterpret_cast<EventRecord*>(event));
}

void event_record(uint64_t event, uint64_t stream) {
  auto* rec = reinterpret_cast<EventRecord*>(event);
  DeviceGuard guard(rec->device);
  CUDA_CHECK(cudaEventRecord(rec->event, reinterpret_cast<cudaStream_t>(stream)));
}

bool event_query(uint64_t event) {
  auto* rec = reinterpret_cast<EventRecord*>(event);
  cudaError_t err = cudaEventQuery(rec->event);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  CUDA_CHECK(err);
  return true;
}

void event_synchronize(uint64_t event) {
  auto* rec = reinterpret_cast<EventRecord*>(event);
  CUDA_CHECK(cudaEventSynchronize(rec->event));
}

bool event_wait(uint64_t event, double timeout_s) {
  if (timeout_s < 0) {
    event_synchronize(event);
    return true;
  }
  const auto start = std::chrono::steady_clock::now();
  while (!event_query(event)) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) return false;
    std::this_thread::yield();
  }
  return true;
}

void stream_wait_stream(int device, uint64_t stream, uint64_t after) {
  if (stream == after) return;
  uint64_t event = event_acquire(device);
  try {
    event_record(event, after);
    DeviceGuard guard(device);
    // The wait captures the event's state now, so the event can go back to the pool right away.
    CUDA_CHECK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream),
                                   reinterpret_cast<EventRecord*>(event)->event, 0));
  } catch (...) {
    event_release(event);
    throw;
  }
  event_release(event);
}

void stream_synchronize(int device, uint64_t stream) {
  DeviceGuard guard(device);
  CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
}

uint64_t stream_create(int device) {
  check_device(device);
  DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return reinterpret_cast<uint64_t>(stream);
}

void stream_destroy(int device, uint64_t stream) {
  DeviceGuard guard(device);
  CUDA_CHECK(cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream)));
}

int clock_rate_khz(int device) {
  check_device(device);
  int khz = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  return khz;
}

}  // namespace specgen_kv::cuda_ops
