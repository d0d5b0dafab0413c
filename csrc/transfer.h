// Batched copies of KV blocks between an engine's paged cache and pool slots.
//
// A Transfer is bound to one engine cache layout (its regions) and a pool made of equal segments of
// `slots_per_segment` slots of `slot_bytes` each. On a GPU it copies with an SM kernel that reads or
// writes peer memory directly (small pieces) or with the copy engines (large pieces); on host memory
// (device -1) it copies with memcpy. Every copy is queued on the caller's stream, optionally after the
// work already queued on another stream (the engine's compute stream), and returns a CopyEvent.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "cuda_ops.h"
#include "kv_common.h"

namespace specgen_kv {

// Completion of one submitted copy. Host copies are complete when the call returns.
class CopyEvent {
 public:
  CopyEvent() = default;
  explicit CopyEvent(uint64_t cuda_event) : event_(cuda_event) {}
  CopyEvent(std::shared_ptr<cuda_ops::PersistentCopier> copier, uint64_t seq)
      : copier_(std::move(copier)), seq_(seq) {}
  ~CopyEvent();
  CopyEvent(const CopyEvent&) = delete;
  CopyEvent& operator=(const CopyEvent&) = delete;

  bool done() const;
  // Blocks until the copy is complete; with timeout_s >= 0, raises after that many seconds.
  void wait(double timeout_s = -1.0) const;

 private:
  uint64_t event_ = 0;
  std::shared_ptr<cuda_ops::PersistentCopier> copier_;  // keeps the request ring alive while waited on
  uint64_t seq_ = 0;
};

class Transfer {
 public:
  Transfer(int device, std::vector<Region> regions, int64_t num_blocks, int64_t slot_bytes, int64_t slots_per_segment,
           int64_t max_segments);
  ~Transfer();
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  // Segment `index` now lives at `base` (0 removes it). The caller guarantees no copy in flight uses it.
  void set_segment(int64_t index, uint64_t base);

  // Copy n blocks: engine block blocks[i] <-> pool slot slots[i] (to_pool: engine -> pool).
  std::shared_ptr<CopyEvent> copy(bool to_pool, const int64_t* blocks, const int64_t* slots, int64_t n,
                                  uint64_t stream, std::optional<uint64_t> after, Method method);
  // Copy whole pool slots from[i] -> to[i] (used to move blocks out of a shrinking segment). On a GPU,
  // through the copy engines in batched calls, on `stream` or (0) on a stream of the transfer's own.
  std::shared_ptr<CopyEvent> move_slots(const int64_t* from, const int64_t* to, int64_t n, uint64_t stream);

  // The method Auto resolves to for this layout.
  Method resolve(Method method) const;

  // Start / stop the persistent copier (one resident CTA on this device) that serves Method::Persistent.
  // It leaves the GPU after idle_us without a request and comes back with the next one.
  void start_persistent(int64_t idle_us = 200);
  void stop_persistent();
  bool persistent_running() const { return persistent_ != nullptr; }
  // (SM cycles, global-timer ns) the persistent copier spent on its last request (seeing it -> done).
  std::pair<int64_t, int64_t> persistent_last_timing() const;
  // Launches of the persistent kernel so far (the first, then one after each idle exit).
  int64_t persistent_launches() const;

  int device() const { return device_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t slots_per_segment() const { return slots_per_segment_; }
  int64_t max_segments() const { return max_segments_; }
  int64_t block_bytes() const { return block_bytes_; }
  const std::vector<Region>& regions() const { return regions_; }
  std::vector<uint64_t> segments() const {
    std::lock_guard<std::mutex> lock(segments_mu_);
    return segments_;
  }

  cuda_ops::KernelConfig kernel_config;
  // Under Auto, layouts whose pieces average at least this many bytes use the copy engines.
  int64_t batch_min_bytes = int64_t{1} << 20;

 private:
  void check_pairs(const int64_t* blocks, const int64_t* slots, int64_t n) const;
  uint64_t slot_address(int64_t slot) const;
  void host_copy(bool to_pool, const int64_t* blocks, const int64_t* slots, int64_t n) const;
  void piece_lists(bool to_pool, const int64_t* blocks, const int64_t* slots, int64_t n, std::vector<uint64_t>& dsts,
                   std::vector<int>& dst_devices, std::vector<uint64_t>& srcs, std::vector<int>& src_devices,
                   std::vector<uint64_t>& sizes) const;

  int device_;
  std::vector<Region> regions_;
  int64_t num_blocks_;
  int64_t slot_bytes_;
  int64_t slots_per_segment_;
  int64_t max_segments_;
  int64_t block_bytes_ = 0;
  // The pool's give-back thread removes segments while other threads copy: set_segment and every
  // copy take this lock around their use of the segment table.
  mutable std::mutex segments_mu_;
  std::vector<uint64_t> segments_;
  std::vector<int> segment_devices_;
  cuda_ops::DeviceLayout device_layout_;
  std::shared_ptr<cuda_ops::PersistentCopier> persistent_;
  std::once_flag move_stream_once_;
  uint64_t move_stream_ = 0;   // created on the first move
};

}  // namespace specgen_kv
