// cuda_ops.h for a build without nvcc: no devices, and any device work is refused with a clear error.
// Host-memory copies never reach this file (transfer.cpp does them itself), so this build serves
// vLLM's CPU engine and CI with the same API as the CUDA build.
#include <string>

#include "cuda_ops.h"

namespace specgen_kv::cuda_ops {
namespace {

[[noreturn]] void no_cuda(const char* what, const char* file, int line) {
  throw KvError(std::string(what) + ": this build of the KV-transfer extension has no CUDA support (nvcc was not "
                                    "found when it was built; install the CUDA toolkit and reinstall specgen)",
                file, line);
}

}  // namespace

#define NO_CUDA(what) no_cuda(what, __FILE__, __LINE__)

bool compiled() { return false; }
int runtime_version() { return 0; }
int device_count() { return 0; }
int pointer_device(uint64_t) { return -1; }
int multiprocessor_count(int) { NO_CUDA("multiprocessor_count"); }
std::pair<int64_t, int64_t> mem_get_info(int) { NO_CUDA("mem_get_info"); }
uint64_t device_alloc(int, int64_t) { NO_CUDA("device_alloc"); }
void device_free(int, uint64_t) { NO_CUDA("device_free"); }
void device_free_many(int, const std::vector<uint64_t>&) { NO_CUDA("device_free_many"); }
void device_memset(int, uint64_t, int, int64_t) { NO_CUDA("device_memset"); }
bool enable_peer_access(int, int) { NO_CUDA("enable_peer_access"); }
bool can_access_peer(int, int) { NO_CUDA("can_access_peer"); }
std::string ipc_export(int, uint64_t) { NO_CUDA("ipc_export"); }
uint64_t ipc_open(int, const std::string&) { NO_CUDA("ipc_open"); }
void ipc_close(int, uint64_t) { NO_CUDA("ipc_close"); }
uint64_t event_acquire(int) { NO_CUDA("event_acquire"); }
void event_release(uint64_t) {}
void event_record(uint64_t, uint64_t) { NO_CUDA("event_record"); }
bool event_query(uint64_t) { return true; }
void event_synchronize(uint64_t) {}
bool event_wait(uint64_t, double) { return true; }
void stream_wait_stream(int, uint64_t, uint64_t) { NO_CUDA("stream_wait_stream"); }
void stream_synchronize(int, uint64_t) { NO_CUDA("stream_synchronize"); }
uint64_t stream_create(int) { NO_CUDA("stream_create"); }
void stream_destroy(int, uint64_t) { NO_CUDA("stream_destroy"); }
DeviceLayout make_device_layout(int, const std::vector<Region>&) { NO_CUDA("make_device_layout"); }
void free_device_layout(DeviceLayout&) {}
void launch_kernel_copy(const DeviceLayout&, const std::vector<uint64_t>&, int64_t, int64_t, bool, const int32_t*,
                        const int32_t*, int64_t, uint64_t, const KernelConfig&) {
  NO_CUDA("launch_kernel_copy");
}
void launch_slot_moves(int, const std::vector<uint64_t>&, int64_t, int64_t, const int32_t*, const int32_t*, int64_t,
                       uint64_t, const KernelConfig&) {
  NO_CUDA("launch_slot_moves");
}
void batch_copy(int, const std::vector<uint64_t>&, const std::vector<uint64_t>&, const std::vector<uint64_t>&,
                uint64_t) {
  NO_CUDA("batch_copy");
}
void memcpy_each(int, const std::vector<uint64_t>&, const std::vector<int>&, const std::vector<uint64_t>&,
                 const std::vector<int>&, const std::vector<uint64_t>&, uint64_t) {
  NO_CUDA("memcpy_each");
}
void memcpy_peer(uint64_t, int, uint64_t, int, int64_t, uint64_t) { NO_CUDA("memcpy_peer"); }
struct PersistentCopier {};
int persistent_max_tiles() { return 0; }
std::shared_ptr<PersistentCopier> persistent_start(const DeviceLayout&, int64_t, int64_t, const std::vector<uint64_t>&,
                                                   int64_t) {
  NO_CUDA("persistent_start");
}
void persistent_set_segment(PersistentCopier&, int64_t, uint64_t) { NO_CUDA("persistent_set_segment"); }
uint64_t persistent_submit(PersistentCopier&, bool, const int32_t*, const int32_t*, int) { NO_CUDA("persistent_submit"); }
bool persistent_done(PersistentCopier&, uint64_t) { return true; }
void persistent_wait(PersistentCopier&, uint64_t, double) {}
void persistent_stop(PersistentCopier&) {}
std::pair<int64_t, int64_t> persistent_last_timing(const PersistentCopier&) { return {0, 0}; }
int64_t persistent_relaunches(const PersistentCopier&) { return 0; }
int clock_rate_khz(int) { NO_CUDA("clock_rate_khz"); }

}  // namespace specgen_kv::cuda_ops
