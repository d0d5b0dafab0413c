// Everything that touches the CUDA runtime. When CMake finds nvcc, cuda_ops.cu implements the runtime
// calls (devices, memory, peer access, IPC, events, streams), copy_launch.cu the device layout, the SM
// kernel's launch and the copy-engine paths, and persistent_copier.cu the persistent copier;
// cuda_ops_stub.cpp implements the same functions for a CPU-only build (they report no devices and
// refuse device work with a clear error). The rest of the extension is plain C++ on top of this.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kv_common.h"

namespace specgen_kv::cuda_ops {

// Built with CUDA at all (a CUDA build still runs on a machine without a GPU, on host memory).
bool compiled();
// CUDA runtime version the extension was built against (e.g. 13000), 0 without CUDA.
int runtime_version();
// Devices usable now; 0 when no driver or no GPU is present (never an error).
int device_count();
// Device a pointer belongs to, or -1 for host memory or memory CUDA does not know.
int pointer_device(uint64_t ptr);
int multiprocessor_count(int device);
std::pair<int64_t, int64_t> mem_get_info(int device);  // (free, total) bytes

uint64_t device_alloc(int device, int64_t bytes);
void device_free(int device, uint64_t ptr);
// Frees several allocations of one device in one call (each cudaFree synchronizes the device).
void device_free_many(int device, const std::vector<uint64_t>& ptrs);
void device_memset(int device, uint64_t ptr, int value, int64_t bytes);

// Lets `device` read and write `peer`'s memory directly; false when the hardware cannot.
bool enable_peer_access(int device, int peer);
bool can_access_peer(int device, int peer);

// CUDA IPC: a 64-byte handle another process opens to map the same device memory.
std::string ipc_export(int device, uint64_t ptr);
uint64_t ipc_open(int device, const std::string& handle);
void ipc_close(int device, uint64_t ptr);

// Events. Handles are opaque integers; each belongs to the device it was created on.
uint64_t event_acquire(int device);
void event_release(uint64_t event);
void event_record(uint64_t event, uint64_t stream);
bool event_query(uint64_t event);
void event_synchronize(uint64_t event);
// Waits up to timeout_s (< 0: no limit); false if the event is still pending then.
bool event_wait(uint64_t event, double timeout_s);
// `stream` waits for the work queued so far on `after` (both on `device`).
void stream_wait_stream(int device, uint64_t stream, uint64_t after);
void stream_synchronize(int device, uint64_t stream);
// A stream of this process's own on `device` that does not synchronize with the legacy default stream.
uint64_t stream_create(int device);
void stream_destroy(int device, uint64_t stream);

// Knobs of the SM copy kernel (defaults are tuned on H200; the benchmark sweeps them).
struct KernelConfig {
  int warps_per_cta = 4;
  int ctas_per_sm = 8;
};

// Device-side description of a block layout, built once per layout (regions uploaded when there are
// too many to pass as kernel parameters).
struct DeviceLayout {
  int device = -1;
  std::vector<Region> regions;
  std::vector<int32_t> tile_start;   // first 4 KiB tile of each region inside one block
  int32_t tiles_per_block = 0;
  int alignment = 1;                 // 16 when every address and size allows 16-byte accesses
  uint64_t regions_on_device = 0;    // device copy of the regions when they do not fit in parameters
};

DeviceLayout make_device_layout(int device, const std::vector<Region>& regions);
void free_device_layout(DeviceLayout& layout);

// Copy n blocks between the engine cache (described by layout) and pool slots (segment bases, slots
// per segment, slot size) with the SM kernel, queued on `stream`.
void launch_kernel_copy(const DeviceLayout& layout, const std::vector<uint64_t>& segments,
                        int64_t slots_per_segment, int64_t slot_bytes, bool to_pool,
                        const int32_t* blocks, const int32_t* slots, int64_t n, uint64_t stream,
                        const KernelConfig& config);
// Copy whole pool slots from[i] -> to[i] with the SM kernel (a shrink's moves), queued on `stream`.
void launch_slot_moves(int device, const std::vector<uint64_t>& segments, int64_t slots_per_segment,
                       int64_t slot_bytes, const int32_t* from, const int32_t* to, int64_t n, uint64_t stream,
                       const KernelConfig& config);

// Copy engines: one batched call (cudaMemcpyBatchAsync where the runtime has it), or one
// cudaMemcpyPeerAsync/cudaMemcpyAsync per piece.
void batch_copy(int device, const std::vector<uint64_t>& dsts, const std::vector<uint64_t>& srcs,
                const std::vector<uint64_t>& sizes, uint64_t stream);
void memcpy_each(int device, const std::vector<uint64_t>& dsts, const std::vector<int>& dst_devices,
                 const std::vector<uint64_t>& srcs, const std::vector<int>& src_devices,
                 const std::vector<uint64_t>& sizes, uint64_t stream);
// Persistent copier: a few resident CTAs polling a request ring in pinned host memory, for small copies
// whose latency a kernel launch would dominate. Requests are not ordered with any stream.
constexpr int kPersistentMaxBlocks = 14;
struct PersistentCopier;
int persistent_max_tiles();
// The kernel exits after idle_us without a request and is relaunched by the next one.
std::shared_ptr<PersistentCopier> persistent_start(const DeviceLayout& layout, int64_t slots_per_segment,
                                                   int64_t slot_bytes, const std::vector<uint64_t>& segments,
                                                   int64_t idle_us);
void persistent_set_segment(PersistentCopier& copier, int64_t index, uint64_t base);
uint64_t persistent_submit(PersistentCopier& copier, bool to_pool, const int32_t* blocks, const int32_t* slots, int n);
bool persistent_done(PersistentCopier& copier, uint64_t seq);
// timeout_s < 0 waits without limit.
void persistent_wait(PersistentCopier& copier, uint64_t seq, double timeout_s);
void persistent_stop(PersistentCopier& copier);
// (0, global-timer nanoseconds) the copier spent on its last request, from seeing it to done.
std::pair<int64_t, int64_t> persistent_last_timing(const PersistentCopier& copier);
int64_t persistent_relaunches(const PersistentCopier& copier);
int clock_rate_khz(int device);

// One contiguous copy (the bulk peer copy the benchmark compares with).
void memcpy_peer(uint64_t dst, int dst_device, uint64_t src, int src_device, int64_t bytes, uint64_t stream);

}  // namespace specgen_kv::cuda_ops
