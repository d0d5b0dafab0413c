// Persistent copier: a few resident CTAs that take small copies from a ring in pinned host memory.
// A launched kernel's latency has a floor (the launch itself, a few microseconds of GPU time, plus
// the host's launch call); CTAs that are already running only have to notice the request (one PCIe
// read) and copy. A single CTA is not enough: one multiprocessor keeps too few peer reads in flight
// (one CTA took 7 us for a 64 KiB block), so the copy is spread over kPersistentCtas of them, one
// warp per 4 KiB tile. It is for latency-bound fetches of a few blocks; large batches go through the
// launched kernel, which spreads over every multiprocessor.
//
// The request ring, the kernel that serves it and the host side that posts to it live in this one
// file: the request layout below is a protocol between the two ends.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "copy_kernels.cuh"
#include "cuda_common.cuh"
#include "cuda_ops.h"

namespace specgen_kv::cuda_ops {
namespace {

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

}  // namespace

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

}  // namespace specgen_kv::cuda_ops
