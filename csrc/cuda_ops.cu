// CUDA implementation of cuda_ops.h: memory, peer access, IPC, events, and the copy paths.
//
// The runtime is linked statically and never needs a GPU to load: every entry point that can run
// without a device (device_count, pointer_device) turns a missing driver into "no device" instead of
// an error, so the same module works on host memory on a machine without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_ops.h"

namespace specgen_kv::cuda_ops {
namespace {

std::string describe(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

}  // namespace
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
namespace {

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

void check_device(int device) {
  int count = device_count();
  KV_CHECK(device >= 0 && device < count,
           "CUDA device " + std::to_string(device) + " does not exist (this machine has " +
               std::to_string(count) + " usable CUDA devices)");
}

constexpr int kTileBytes = 4096;          // one warp moves one tile at a time
constexpr int kMaxSegments = 128;         // pool segments passed to the kernel by value
constexpr int kMaxBlocksPerLaunch = 2048; // block pairs passed to the kernel by value
constexpr int kMaxThreadsPerCta = 512;    // leaves each thread enough registers for all its loads in flight

struct DevRegion {
  unsigned long long base;
  long long block_stride;
  long long bytes;
  long long slot_offset;
  int tile_start;
  int pad;
};

struct CopyArgs {
  unsigned long long segments[kMaxSegments];
  long long slots_per_segment;
  long long slot_bytes;
  const DevRegion* regions_global;
  int num_regions;
  int tiles_per_block;
  int to_pool;
  int count;
};

template <int NREG>
struct InlineRegions {
  DevRegion r[NREG];
};

template <int CAP>
struct InlinePairs {
  int block[CAP];
  int slot[CAP];
};

// One warp copies n bytes (n <= kTileBytes). With 16-byte alignment each lane issues all of its
// loads before its first store, so kTileBytes / 512 loads per lane are in flight at once; the
// streaming cache hints keep the copied data from evicting the engine's working set from L2.
template <int ALIGN>
__device__ __forceinline__ void copy_tile(char* __restrict__ dst, const char* __restrict__ src, int n, int lane) {
  if constexpr (ALIGN == 16) {
    constexpr int kLoads = kTileBytes / (32 * 16);
    uint4 v[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      int i = (k * 32 + lane) * 16;
      if (i < n) v[k] = __ldcs(reinterpret_cast<const uint4*>(src + i));
    }
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      int i = (k * 32 + lane) * 16;
      if (i < n) __stcs(reinterpret_cast<uint4*>(dst + i), v[k]);
    }
  } else {
    for (int i = lane; i < n; i += 32) dst[i] = src[i];
  }
}

// Region holding a tile of a block: binary search over the regions' first tiles.
template <int NREG, bool GLOBAL_REGIONS>
__device__ __forceinline__ int find_region(const CopyArgs& args, const InlineRegions<NREG>& inline_regions, int tile) {
  int lo = 0, hi = args.num_regions - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    const int start = GLOBAL_REGIONS ? args.regions_global[mid].tile_start : inline_regions.r[mid].tile_start;
    if (start <= tile) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// One warp copies one 4 KiB tile of one block between the engine cache and a pool slot.
template <int ALIGN>
__device__ __forceinline__ void copy_block_tile(const DevRegion& region, int tile, long long block,
                                                unsigned long long segment_base, long long slot_in_segment,
                                                long long slot_bytes, int to_pool, int lane) {
  const long long offset = static_cast<long long>(tile - region.tile_start) * kTileBytes;
  const int n = static_cast<int>(min(static_cast<long long>(kTileBytes), region.bytes - offset));
  char* cache = reinterpret_cast<char*>(region.base) + block * region.block_stride + offset;
  char* pool = reinterpret_cast<char*>(segment_base) + slot_in_segment * slot_bytes + region.slot_offset + offset;
  if (to_pool) {
    copy_tile<ALIGN>(pool, cache, n, lane);
  } else {
    copy_tile<ALIGN>(cache, pool, n, lane);
  }
}

// The parameters are __grid_constant__ so that indexing them with run-time values (block pairs,
// regions, segments) reads the parameter bank in place instead of copying it to local memory first.
//
// Grid-stride over (block pair, tile) work items, one warp per tile: a single block is spread over
// many warps and multiprocessors, and a large batch keeps every multiprocessor busy.
template <int CAP, int NREG, bool GLOBAL_REGIONS, int ALIGN>
__global__ void __launch_bounds__(kMaxThreadsPerCta)
    kv_copy_kernel(const __grid_constant__ CopyArgs args, const __grid_constant__ InlineRegions<NREG> inline_regions,
                   const __grid_constant__ InlinePairs<CAP> pairs) {
  const int lane = threadIdx.x & 31;
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const long long num_warps = (static_cast<long long>(gridDim.x) * blockDim.x) >> 5;
  const long long total = static_cast<long long>(args.count) * args.tiles_per_block;
  for (long long t = warp; t < total; t += num_warps) {
    const int pair = static_cast<int>(t / args.tiles_per_block);
    const int tile = static_cast<int>(t - static_cast<long long>(pair) * args.tiles_per_block);
    const int lo = find_region<NREG, GLOBAL_REGIONS>(args, inline_regions, tile);
    const DevRegion& region = GLOBAL_REGIONS ? args.regions_global[lo] : inline_regions.r[lo];
    const long long slot = pairs.slot[pair];
    const long long segment = slot / args.slots_per_segment;
    copy_block_tile<ALIGN>(region, tile, pairs.block[pair], args.segments[segment], slot - segment * args.slots_per_segment,
                           args.slot_bytes, args.to_pool, lane);
  }
}


// ---------------------------------------------------------------------------------------------
// Persistent copier: a few resident CTAs that take small copies from a ring in pinned host memory.
// A launched kernel's latency has a floor (the launch itself, a few microseconds of GPU time, plus
// the host's launch call); CTAs that are already running only have to notice the request (one PCIe
// read) and copy. A single CTA is not enough: one multiprocessor keeps too few peer reads in flight
// (one CTA took 7 us for a 64 KiB block), so the copy is spread over kPersistentCtas of them, one
// warp per 4 KiB tile. It is for latency-bound fetches of a few blocks; large batches go through the
// launched kernel, which spreads over every multiprocessor.

constexpr int kPersistentRing = 64;
constexpr int kPersistentCtas = 16;
constexpr int kPersistentThreads = 128;
constexpr int kPersistentWords = 32;          // one request: 128 bytes, read by one warp in one go
constexpr unsigned long long kEpochExit = ~0ull;

// Request words: [0] seq, [1] count, [2] to_pool, [3..16] blocks, [17..30] slots, [31] seq again.
// The host writes seq into both ends last; a snapshot whose two ends both hold the expected seq has
// every word of the request (each 64-byte half was written before its own seq word).
static_assert(3 + 2 * kPersistentMaxBlocks + 1 == kPersistentWords, "request layout");

struct PersistentMailbox {              // pinned host memory, mapped into the device
  unsigned int ring[kPersistentRing][kPersistentWords];
  unsigned long long stop;              // host: nonzero asks the kernel to finish and exit
  unsigned long long host_pad[7];       // host-written and device-written words on separate lines
  unsigned long long done;              // device: last sequence number completed (data visible)
  unsigned long long alive;             // host sets 1 when it launches the kernel; the kernel's last act is 0
  unsigned long long copy_ns;           // device: global-timer ns from seeing the last request to done
  unsigned long long device_pad[5];
};

struct PersistentDeviceState {          // device memory, shared by the resident CTAs
  unsigned long long epoch;             // the request the CTAs are to work on now, or kEpochExit
  unsigned long long finished;          // CTA completions, kPersistentCtas per request
  unsigned long long seen_ns;           // when the leader saw the current request
  unsigned int request[kPersistentWords];
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <int NREG, bool GLOBAL_REGIONS, int ALIGN>
__global__ void __launch_bounds__(kPersistentThreads)
    kv_persistent_kernel(PersistentMailbox* mailbox, PersistentDeviceState* state, const __grid_constant__ CopyArgs args,
                         const __grid_constant__ InlineRegions<NREG> inline_regions,
                         const unsigned long long* segments, unsigned long long idle_ns) {
  __shared__ unsigned int request[kPersistentWords];
  __shared__ int leave;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const bool leader = blockIdx.x == 0 && warp == 0;
  volatile unsigned long long* epoch = &state->epoch;
  // A relaunch (after an idle exit) carries on after the last request the previous run finished.
  const unsigned long long first = *reinterpret_cast<volatile unsigned long long*>(&mailbox->done) + 1;
  for (unsigned long long next = first;; ++next) {
    if (leader) {
      // Poll the ring entry itself (one 128-byte read per look). Leave after idle_ns without a
      // request, or when told to: a kernel that never ends would hang every device-wide
      // synchronization and CUDA's lazy loading of other kernels. The host relaunches on demand.
      const unsigned long long idle_since = global_ns();
      const volatile unsigned int* entry = mailbox->ring[next % kPersistentRing];
      bool exiting = false;
      for (unsigned int looks = 0;; ++looks) {
        const unsigned int word = entry[lane];
        const unsigned int head = __shfl_sync(0xffffffffu, word, 0);
        const unsigned int tail = __shfl_sync(0xffffffffu, word, kPersistentWords - 1);
        if (head == static_cast<unsigned int>(next) && tail == static_cast<unsigned int>(next)) {
          state->request[lane] = word;
          break;
        }
        int quit = 0;
        if (lane == 0) {
          quit = global_ns() - idle_since > idle_ns ||
                 ((looks & 15) == 15 && *reinterpret_cast<volatile unsigned long long*>(&mailbox->stop) != 0);
        }
        if (__shfl_sync(0xffffffffu, quit, 0)) {
          exiting = true;
          break;
        }
        __nanosleep(32);
      }
      // Every lane's request word must be visible device-wide before the epoch announces it.
      __threadfence();
      __syncwarp();
      if (lane == 0) {
        if (!exiting) state->seen_ns = global_ns();
        __threadfence();
        *epoch = exiting ? kEpochExit : next;
      }
      __syncwarp();
    }
    if (threadIdx.x == 0) {
      unsigned long long e;
      while ((e = *epoch) != next && e != kEpochExit) __nanosleep(20);
      leave = e == kEpochExit;
      __threadfence();
    }
    __syncthreads();
    if (leave) {
      if (blockIdx.x == 0 && threadIdx.x == 0) {
        __threadfence_system();
        *reinterpret_cast<volatile unsigned long long*>(&mailbox->alive) = 0;
      }
      return;
    }
    if (threadIdx.x < kPersistentWords) request[threadIdx.x] = *reinterpret_cast<volatile unsigned int*>(&state->request[threadIdx.x]);
    __syncthreads();
    const int count = static_cast<int>(request[1]);
    const int to_pool = static_cast<int>(request[2]);
    const int* blocks = reinterpret_cast<const int*>(request + 3);
    const int* slots = reinterpret_cast<const int*>(request + 3 + kPersistentMaxBlocks);
    const int total = count * args.tiles_per_block;
    // Consecutive tiles go to different CTAs, so even one block spreads over many multiprocessors.
    const int warps_in_grid = kPersistentCtas * (kPersistentThreads / 32);
    for (int t = warp * kPersistentCtas + blockIdx.x; t < total; t += warps_in_grid) {
      const int pair = t / args.tiles_per_block;
      const int tile = t - pair * args.tiles_per_block;
      const int lo = find_region<NREG, GLOBAL_REGIONS>(args, inline_regions, tile);
      const DevRegion& region = GLOBAL_REGIONS ? args.regions_global[lo] : inline_regions.r[lo];
      const long long slot = slots[pair];
      const long long segment = slot / args.slots_per_segment;
      // Segments can change between requests (the pool grew or shrank): read the table, not a cache.
      const unsigned long long base = *reinterpret_cast<const volatile unsigned long long*>(&segments[segment]);
      copy_block_tile<ALIGN>(region, tile, blocks[pair], base, slot - segment * args.slots_per_segment,
                             args.slot_bytes, to_pool, lane);
    }
    // Every warp's writes (local or peer memory) must be visible before the host learns it is done.
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned long long target = static_cast<unsigned long long>(kPersistentCtas) * next;
      const unsigned long long previous = atomicAdd(&state->finished, 1ull);
      if (previous + 1 == target) {
        // The last CTA to finish tells the host: `done` first, with nothing between it and the
        // fences above (every CTA's data is visible system-wide before its count), then the timing
        // readout, which needs no fence of its own (see persistent_last_timing).
        const unsigned long long finished_at = global_ns();
        *reinterpret_cast<volatile unsigned long long*>(&mailbox->done) = next;
        mailbox->copy_ns = finished_at - *reinterpret_cast<volatile unsigned long long*>(&state->seen_ns);
      }
      if (blockIdx.x == 0) {
        // The leader takes the next request only when every CTA is done with this one (they all work
        // from the one request buffer).
        while (*reinterpret_cast<volatile unsigned long long*>(&state->finished) < target) __nanosleep(20);
      }
    }
    __syncthreads();
  }
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

template <int CAP, int NREG, bool GLOBAL_REGIONS, int ALIGN>
void launch_one(const CopyArgs& args, const DeviceLayout& layout, const int32_t* blocks, const int32_t* slots,
                int count, cudaStream_t stream, const KernelConfig& config) {
  InlineRegions<NREG> regions{};
  if constexpr (!GLOBAL_REGIONS) {
    for (size_t r = 0; r < layout.regions.size(); ++r) {
      const Region& src = layout.regions[r];
      regions.r[r] = DevRegion{src.base, src.block_stride, src.bytes, src.slot_offset, layout.tile_start[r], 0};
    }
  }
  InlinePairs<CAP> pairs;
  std::copy(blocks, blocks + count, pairs.block);
  std::copy(slots, slots + count, pairs.slot);
  CopyArgs a = args;
  a.count = count;
  const long long tiles = static_cast<long long>(count) * layout.tiles_per_block;
  const int warps_per_cta = std::max(1, std::min(kMaxThreadsPerCta / 32, config.warps_per_cta));
  const long long wanted = (tiles + warps_per_cta - 1) / warps_per_cta;
  const long long limit = static_cast<long long>(sm_count_cached(layout.device)) * std::max(1, config.ctas_per_sm);
  const int ctas = static_cast<int>(std::max(1LL, std::min(wanted, limit)));
  kv_copy_kernel<CAP, NREG, GLOBAL_REGIONS, ALIGN><<<ctas, warps_per_cta * 32, 0, stream>>>(a, regions, pairs);
  CUDA_CHECK(cudaGetLastError());
}

template <int CAP, int ALIGN>
void launch_with_regions(const CopyArgs& args, const DeviceLayout& layout, const int32_t* blocks, const int32_t* slots,
                         int count, cudaStream_t stream, const KernelConfig& config) {
  const size_t nreg = layout.regions.size();
  if (nreg <= 4) {
    launch_one<CAP, 4, false, ALIGN>(args, layout, blocks, slots, count, stream, config);
  } else if (nreg <= 64) {
    launch_one<CAP, 64, false, ALIGN>(args, layout, blocks, slots, count, stream, config);
  } else {
    launch_one<CAP, 1, true, ALIGN>(args, layout, blocks, slots, count, stream, config);
  }
}

template <int ALIGN>
void launch_sized(const CopyArgs& args, const DeviceLayout& layout, const int32_t* blocks, const int32_t* slots,
                  int count, cudaStream_t stream, const KernelConfig& config) {
  // The smallest parameter block that holds the batch: less to copy into every launch.
  if (count <= 16) {
    launch_with_regions<16, ALIGN>(args, layout, blocks, slots, count, stream, config);
  } else if (count <= 256) {
    launch_with_regions<256, ALIGN>(args, layout, blocks, slots, count, stream, config);
  } else {
    launch_with_regions<kMaxBlocksPerLaunch, ALIGN>(args, layout, blocks, slots, count, stream, config);
  }
}

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

DeviceLayout make_device_layout(int device, const std::vector<Region>& regions) {
  check_device(device);
  DeviceLayout layout;
  layout.device = device;
  layout.regions = regions;
  bool aligned = true;
  int32_t tiles = 0;
  for (const Region& r : regions) {
    KV_CHECK(r.bytes > 0 && r.bytes < (int64_t{1} << 31), "a block region must hold 1 byte to 2 GiB, got " +
                                                               std::to_string(r.bytes));
    layout.tile_start.push_back(tiles);
    tiles += static_cast<int32_t>((r.bytes + kTileBytes - 1) / kTileBytes);
    aligned = aligned && r.base % 16 == 0 && r.block_stride % 16 == 0 && r.bytes % 16 == 0 && r.slot_offset % 16 == 0;
  }
  layout.tiles_per_block = tiles;
  layout.alignment = aligned ? 16 : 1;
  if (regions.size() > 64) {
    std::vector<DevRegion> table;
    for (size_t r = 0; r < regions.size(); ++r) {
      const Region& src = regions[r];
      table.push_back(DevRegion{src.base, src.block_stride, src.bytes, src.slot_offset, layout.tile_start[r], 0});
    }
    DeviceGuard guard(device);
    void* ptr = nullptr;
    CUDA_CHECK(cudaMalloc(&ptr, table.size() * sizeof(DevRegion)));
    layout.regions_on_device = reinterpret_cast<uint64_t>(ptr);
    CUDA_CHECK(cudaMemcpy(ptr, table.data(), table.size() * sizeof(DevRegion), cudaMemcpyHostToDevice));
  }
  return layout;
}

void free_device_layout(DeviceLayout& layout) {
  if (layout.regions_on_device != 0) {
    DeviceGuard guard(layout.device);
    (void)cudaFree(reinterpret_cast<void*>(layout.regions_on_device));
    layout.regions_on_device = 0;
  }
}

void launch_kernel_copy(const DeviceLayout& layout, const std::vector<uint64_t>& segments, int64_t slots_per_segment,
                        int64_t slot_bytes, bool to_pool, const int32_t* blocks, const int32_t* slots, int64_t n,
                        uint64_t stream, const KernelConfig& config) {
  KV_CHECK(segments.size() <= static_cast<size_t>(kMaxSegments),
           "the SM copy kernel takes at most " + std::to_string(kMaxSegments) + " pool segments, got " +
               std::to_string(segments.size()));
  if (n == 0) return;
  CopyArgs args{};
  bool aligned = layout.alignment == 16 && slot_bytes % 16 == 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    args.segments[s] = segments[s];
    aligned = aligned && segments[s] % 16 == 0;
  }
  args.slots_per_segment = slots_per_segment;
  args.slot_bytes = slot_bytes;
  args.regions_global = reinterpret_cast<const DevRegion*>(layout.regions_on_device);
  args.num_regions = static_cast<int>(layout.regions.size());
  args.tiles_per_block = layout.tiles_per_block;
  args.to_pool = to_pool ? 1 : 0;
  DeviceGuard guard(layout.device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  for (int64_t start = 0; start < n; start += kMaxBlocksPerLaunch) {
    const int count = static_cast<int>(std::min<int64_t>(kMaxBlocksPerLaunch, n - start));
    if (aligned) {
      launch_sized<16>(args, layout, blocks + start, slots + start, count, s, config);
    } else {
      launch_sized<1>(args, layout, blocks + start, slots + start, count, s, config);
    }
  }
}

void memcpy_each(int device, const std::vector<uint64_t>& dsts, const std::vector<int>& dst_devices,
                 const std::vector<uint64_t>& srcs, const std::vector<int>& src_devices,
                 const std::vector<uint64_t>& sizes, uint64_t stream) {
  DeviceGuard guard(device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  for (size_t i = 0; i < dsts.size(); ++i) {
    void* dst = reinterpret_cast<void*>(dsts[i]);
    const void* src = reinterpret_cast<const void*>(srcs[i]);
    if (dst_devices[i] >= 0 && src_devices[i] >= 0 && dst_devices[i] != src_devices[i]) {
      CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_devices[i], src, src_devices[i], sizes[i], s));
    } else {
      CUDA_CHECK(cudaMemcpyAsync(dst, src, sizes[i], cudaMemcpyDefault, s));
    }
  }
}

void batch_copy(int device, const std::vector<uint64_t>& dsts, const std::vector<uint64_t>& srcs,
                const std::vector<uint64_t>& sizes, uint64_t stream) {
  if (dsts.empty()) return;
#if CUDART_VERSION >= 12080
  // The batched call refuses the legacy default stream; there the per-piece loop is the only way.
  if (stream != 0) {
    DeviceGuard guard(device);
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;
    std::vector<void*> dst_ptrs(dsts.size());
    std::vector<const void*> src_ptrs(srcs.size());
    std::vector<size_t> byte_counts(sizes.size());
    for (size_t i = 0; i < dsts.size(); ++i) {
      dst_ptrs[i] = reinterpret_cast<void*>(dsts[i]);
      src_ptrs[i] = reinterpret_cast<const void*>(srcs[i]);
      byte_counts[i] = static_cast<size_t>(sizes[i]);
    }
#if CUDART_VERSION >= 13000
    CUDA_CHECK(cudaMemcpyBatchAsync(dst_ptrs.data(), src_ptrs.data(), byte_counts.data(), dsts.size(), &attr,
                                    &attr_index, 1, reinterpret_cast<cudaStream_t>(stream)));
#else
    size_t fail_index = 0;
    CUDA_CHECK(cudaMemcpyBatchAsync(dst_ptrs.data(), const_cast<void**>(src_ptrs.data()), byte_counts.data(),
                                    dsts.size(), &attr, &attr_index, 1, &fail_index,
                                    reinterpret_cast<cudaStream_t>(stream)));
#endif
    return;
  }
#endif
  std::vector<int> unknown(dsts.size(), -1);
  memcpy_each(device, dsts, unknown, srcs, unknown, sizes, stream);
}

void memcpy_peer(uint64_t dst, int dst_device, uint64_t src, int src_device, int64_t bytes, uint64_t stream) {
  check_device(dst_device);
  check_device(src_device);
  DeviceGuard guard(src_device);
  CUDA_CHECK(cudaMemcpyPeerAsync(reinterpret_cast<void*>(dst), dst_device, reinterpret_cast<const void*>(src),
                                 src_device, static_cast<size_t>(bytes), reinterpret_cast<cudaStream_t>(stream)));
}


// ---------------------------------------------------------------------------------------------
// Persistent copier, host side.

struct PersistentCopier {
  int device = -1;
  PersistentMailbox* mailbox = nullptr;       // host address (the device uses the same, UVA)
  PersistentDeviceState* state = nullptr;     // device memory
  unsigned long long* segments = nullptr;     // device table
  cudaStream_t stream = nullptr;
  uint64_t next_seq = 1;
  bool running = false;
  uint64_t relaunches = 0;
  std::function<void()> launch;               // launches the kernel on `stream` (arguments captured)
  std::mutex mutex;
};

namespace {

// The kernel leaves after an idle spell; launch it again if it has (or is about to: a relaunch queued
// behind an instance that is still finishing starts after it, on the same stream). Caller holds mutex.
void ensure_running_locked(PersistentCopier& copier) {
  volatile unsigned long long* alive = &copier.mailbox->alive;
  if (*alive != 0) return;
  *alive = 1;
  DeviceGuard guard(copier.device);
  // Queued behind the instance that just left (same stream): reset the epoch it left at "exit".
  CUDA_CHECK(cudaMemsetAsync(&copier.state->epoch, 0, sizeof(unsigned long long), copier.stream));
  copier.launch();
  ++copier.relaunches;
}

template <int NREG, bool GLOBAL_REGIONS, int ALIGN>
void set_launcher(PersistentCopier& copier, const CopyArgs& args, const DeviceLayout& layout, uint64_t idle_ns) {
  InlineRegions<NREG> regions{};
  if constexpr (!GLOBAL_REGIONS) {
    for (size_t r = 0; r < layout.regions.size(); ++r) {
      const Region& src = layout.regions[r];
      regions.r[r] = DevRegion{src.base, src.block_stride, src.bytes, src.slot_offset, layout.tile_start[r], 0};
    }
  }
  PersistentCopier* c = &copier;
  copier.launch = [c, args, regions, idle_ns]() {
    kv_persistent_kernel<NREG, GLOBAL_REGIONS, ALIGN><<<kPersistentCtas, kPersistentThreads, 0, c->stream>>>(
        c->mailbox, c->state, args, regions, c->segments, idle_ns);
    CUDA_CHECK(cudaGetLastError());
  };
}

template <int ALIGN>
void set_launcher_aligned(PersistentCopier& copier, const CopyArgs& args, const DeviceLayout& layout, uint64_t idle_ns) {
  const size_t nreg = layout.regions.size();
  if (nreg <= 4) {
    set_launcher<4, false, ALIGN>(copier, args, layout, idle_ns);
  } else if (nreg <= 64) {
    set_launcher<64, false, ALIGN>(copier, args, layout, idle_ns);
  } else {
    set_launcher<1, true, ALIGN>(copier, args, layout, idle_ns);
  }
}

std::string persistent_state(const PersistentCopier& copier) {
  auto word = [](const unsigned long long& w) { return std::to_string(*reinterpret_cast<const volatile unsigned long long*>(&w)); };
  return "submitted " + std::to_string(copier.next_seq - 1) + ", done " + word(copier.mailbox->done) + ", alive " +
         word(copier.mailbox->alive) + ", launches " + std::to_string(copier.relaunches);
}

// The kernel may have idled out in the instant between a post and its last look at the ring:
// relaunch it if it has exited with request `seq` still undone. Cheap unless it has.
void relaunch_if_exited(PersistentCopier& copier, uint64_t seq) {
  if (*reinterpret_cast<volatile unsigned long long*>(&copier.mailbox->alive) != 0) return;
  std::lock_guard<std::mutex> lock(copier.mutex);
  if (*reinterpret_cast<volatile unsigned long long*>(&copier.mailbox->done) >= seq) return;
  KV_CHECK(copier.running, "the persistent copier was stopped before request " + std::to_string(seq) + " completed");
  ensure_running_locked(copier);
}

// A fault in the kernel (e.g. a bad address) surfaces on its stream.
void check_fault(PersistentCopier& copier) {
  cudaError_t err = cudaStreamQuery(copier.stream);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return;
  }
  CUDA_CHECK(err);
}

}  // namespace

int persistent_max_tiles() { return kPersistentCtas * (kPersistentThreads / 32); }

std::shared_ptr<PersistentCopier> persistent_start(const DeviceLayout& layout, int64_t slots_per_segment,
                                                   int64_t slot_bytes, const std::vector<uint64_t>& segments,
                                                   int64_t idle_us) {
  KV_CHECK(segments.size() <= static_cast<size_t>(kMaxSegments), "persistent_start: too many segments");
  KV_CHECK(idle_us > 0, "persistent_start: idle_us must be > 0");
  DeviceGuard guard(layout.device);
  auto copier = std::shared_ptr<PersistentCopier>(new PersistentCopier(), [](PersistentCopier* c) {
    if (c->mailbox != nullptr) {
      c->mailbox->stop = 1;
      if (c->stream != nullptr) (void)cudaStreamSynchronize(c->stream);
    }
    if (c->stream != nullptr) (void)cudaStreamDestroy(c->stream);
    if (c->segments != nullptr) (void)cudaFree(c->segments);
    if (c->state != nullptr) (void)cudaFree(c->state);
    if (c->mailbox != nullptr) (void)cudaFreeHost(c->mailbox);
    delete c;
  });
  copier->device = layout.device;
  void* host = nullptr;
  CUDA_CHECK(cudaHostAlloc(&host, sizeof(PersistentMailbox), cudaHostAllocMapped | cudaHostAllocPortable));
  copier->mailbox = static_cast<PersistentMailbox*>(host);
  std::memset(host, 0, sizeof(PersistentMailbox));
  void* table = nullptr;
  CUDA_CHECK(cudaMalloc(&table, kMaxSegments * sizeof(unsigned long long)));
  copier->segments = static_cast<unsigned long long*>(table);
  std::vector<unsigned long long> initial(kMaxSegments, 0);
  std::copy(segments.begin(), segments.end(), initial.begin());
  CUDA_CHECK(cudaMemcpy(table, initial.data(), initial.size() * sizeof(unsigned long long), cudaMemcpyHostToDevice));
  void* state = nullptr;
  CUDA_CHECK(cudaMalloc(&state, sizeof(PersistentDeviceState)));
  copier->state = static_cast<PersistentDeviceState*>(state);
  CUDA_CHECK(cudaMemset(state, 0, sizeof(PersistentDeviceState)));
  CUDA_CHECK(cudaStreamCreateWithFlags(&copier->stream, cudaStreamNonBlocking));
  CopyArgs args{};
  args.slots_per_segment = slots_per_segment;
  args.slot_bytes = slot_bytes;
  args.regions_global = reinterpret_cast<const DevRegion*>(layout.regions_on_device);
  args.num_regions = static_cast<int>(layout.regions.size());
  args.tiles_per_block = layout.tiles_per_block;
  bool aligned = layout.alignment == 16 && slot_bytes % 16 == 0;
  for (uint64_t base : segments) aligned = aligned && base % 16 == 0;
  // Segments added later are cudaMalloc'ed or IPC-mapped (256-byte aligned), so this choice holds.
  const uint64_t idle_ns = static_cast<uint64_t>(idle_us) * 1000;
  if (aligned) {
    set_launcher_aligned<16>(*copier, args, layout, idle_ns);
  } else {
    set_launcher_aligned<1>(*copier, args, layout, idle_ns);
  }
  copier->running = true;
  {
    std::lock_guard<std::mutex> lock(copier->mutex);
    ensure_running_locked(*copier);
  }
  return copier;
}

void persistent_set_segment(PersistentCopier& copier, int64_t index, uint64_t base) {
  KV_CHECK(index >= 0 && index < kMaxSegments, "persistent_set_segment: index out of range");
  DeviceGuard guard(copier.device);
  unsigned long long value = base;
  // Through the legacy stream, which does not wait for the copier's non-blocking stream: the resident
  // kernel reads the table afresh for every request.
  CUDA_CHECK(cudaMemcpy(copier.segments + index, &value, sizeof(value), cudaMemcpyHostToDevice));
}

uint64_t persistent_submit(PersistentCopier& copier, bool to_pool, const int32_t* blocks, const int32_t* slots, int n) {
  KV_CHECK(n >= 0 && n <= kPersistentMaxBlocks, "the persistent copier takes at most " +
                                                    std::to_string(kPersistentMaxBlocks) + " blocks per request, got " +
                                                    std::to_string(n) + "; use the 'kernel' method");
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(copier.mutex);
    KV_CHECK(copier.running, "the persistent copier is stopped");
    seq = copier.next_seq++;
  }
  // The ring entry may still be read by the kernel for the request kPersistentRing back.
  volatile unsigned long long* done = &copier.mailbox->done;
  for (uint64_t spins = 0; *done + kPersistentRing < seq; ++spins) {
    if ((spins & 0xFF) == 0xFF) relaunch_if_exited(copier, seq - kPersistentRing);
    if ((spins & 0xFFFF) == 0xFFFF) check_fault(copier);
  }
  std::lock_guard<std::mutex> lock(copier.mutex);
  volatile unsigned int* entry = copier.mailbox->ring[seq % kPersistentRing];
  entry[1] = static_cast<unsigned int>(n);
  entry[2] = to_pool ? 1u : 0u;
  for (int i = 0; i < n; ++i) {
    entry[3 + i] = static_cast<unsigned int>(blocks[i]);
    entry[3 + kPersistentMaxBlocks + i] = static_cast<unsigned int>(slots[i]);
  }
  // Both ends carry the sequence number, written last (see the request layout above).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  entry[kPersistentWords - 1] = static_cast<unsigned int>(seq);
  entry[0] = static_cast<unsigned int>(seq);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ensure_running_locked(copier);
  return seq;
}

bool persistent_done(PersistentCopier& copier, uint64_t seq) {
  if (*reinterpret_cast<volatile unsigned long long*>(&copier.mailbox->done) >= seq) return true;
  relaunch_if_exited(copier, seq);
  check_fault(copier);
  return false;
}

void persistent_wait(PersistentCopier& copier, uint64_t seq, double timeout_s) {
  volatile unsigned long long* done = &copier.mailbox->done;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t spins = 0; *done < seq; ++spins) {
    if ((spins & 0xFF) == 0xFF) relaunch_if_exited(copier, seq);
    if ((spins & 0xFFFF) == 0xFFFF) {
      check_fault(copier);
      if (timeout_s >= 0 &&
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
        throw KvError("persistent copy request " + std::to_string(seq) + " not done after " +
                          std::to_string(timeout_s) + " s (wait timeout_s); " + persistent_state(copier),
                      __FILE__, __LINE__);
      }
    }
  }
  std::atomic_thread_fence(std::memory_order_acquire);
}

void persistent_stop(PersistentCopier& copier) {
  {
    std::lock_guard<std::mutex> lock(copier.mutex);
    if (!copier.running) return;
    copier.running = false;
  }
  *reinterpret_cast<volatile unsigned long long*>(&copier.mailbox->stop) = 1;
  DeviceGuard guard(copier.device);
  CUDA_CHECK(cudaStreamSynchronize(copier.stream));
}

std::pair<int64_t, int64_t> persistent_last_timing(const PersistentCopier& copier) {
  // Several multiprocessors take part, so there is no single cycle count; only global-timer time.
  // Written just after `done` (one PCIe write later): read right as a wait returns, it can still
  // hold the previous request's figure.
  return {0, static_cast<int64_t>(*reinterpret_cast<volatile unsigned long long*>(&copier.mailbox->copy_ns))};
}

int64_t persistent_relaunches(const PersistentCopier& copier) { return static_cast<int64_t>(copier.relaunches); }

int clock_rate_khz(int device) {
  check_device(device);
  int khz = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  return khz;
}

}  // namespace specgen_kv::cuda_ops
