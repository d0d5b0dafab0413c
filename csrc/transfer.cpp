#include "transfer.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

namespace specgen_kv {

CopyEvent::~CopyEvent() { cuda_ops::event_release(event_); }

bool CopyEvent::done() const {
  if (copier_) return cuda_ops::persistent_done(*copier_, seq_);
  return event_ == 0 || cuda_ops::event_query(event_);
}

void CopyEvent::wait(double timeout_s) const {
  if (copier_) {
    cuda_ops::persistent_wait(*copier_, seq_, timeout_s);
  } else if (event_ != 0 && !cuda_ops::event_wait(event_, timeout_s)) {
    throw KvError("copy not done after " + std::to_string(timeout_s) + " s (wait timeout_s)", __FILE__, __LINE__);
  }
}

Transfer::Transfer(int device, std::vector<Region> regions, int64_t num_blocks, int64_t slot_bytes,
                   int64_t slots_per_segment, int64_t max_segments)
    : device_(device),
      regions_(std::move(regions)),
      num_blocks_(num_blocks),
      slot_bytes_(slot_bytes),
      slots_per_segment_(slots_per_segment),
      max_segments_(max_segments),
      segments_(max_segments > 0 ? max_segments : 0, 0),
      segment_devices_(max_segments > 0 ? max_segments : 0, -1) {
  KV_CHECK(device >= -1, "Transfer: device must be -1 (host memory) or a CUDA device index, got " +
                             std::to_string(device));
  KV_CHECK(!regions_.empty(), "Transfer: a block layout needs at least one region");
  KV_CHECK(num_blocks > 0, "Transfer: num_blocks must be > 0, got " + std::to_string(num_blocks));
  KV_CHECK(slots_per_segment > 0, "Transfer: slots_per_segment must be > 0, got " + std::to_string(slots_per_segment));
  KV_CHECK(max_segments > 0, "Transfer: max_segments must be > 0, got " + std::to_string(max_segments));
  KV_CHECK(num_blocks <= INT32_MAX && slots_per_segment * max_segments <= INT32_MAX,
           "Transfer: block and slot indices must fit in 32 bits");
  for (size_t r = 0; r < regions_.size(); ++r) {
    const Region& region = regions_[r];
    KV_CHECK(region.base != 0 && region.bytes > 0 && region.block_stride >= 0,
             "Transfer: region " + std::to_string(r) + " is empty or has no address");
    KV_CHECK(region.slot_offset >= 0 && region.slot_offset + region.bytes <= slot_bytes,
             "Transfer: region " + std::to_string(r) + " (" + std::to_string(region.bytes) + " bytes at slot offset " +
                 std::to_string(region.slot_offset) + ") does not fit in a slot of " + std::to_string(slot_bytes) +
                 " bytes");
    block_bytes_ += region.bytes;
    const int where = cuda_ops::pointer_device(region.base);
    KV_CHECK(where == device,
             "Transfer: region " + std::to_string(r) + " lives on " +
                 (where < 0 ? std::string("host memory") : "CUDA device " + std::to_string(where)) +
                 " but the transfer was created for " +
                 (device < 0 ? std::string("host memory") : "CUDA device " + std::to_string(device)));
  }
  if (device_ >= 0) device_layout_ = cuda_ops::make_device_layout(device_, regions_);
}

Transfer::~Transfer() {
  try {
    stop_persistent();
  } catch (...) {
    // Destructors must not throw; a failed stop leaves the kernel to end with the process.
  }
  cuda_ops::free_device_layout(device_layout_);
  if (move_stream_ != 0) {
    try {
      cuda_ops::stream_destroy(device_, move_stream_);
    } catch (...) {
    }
  }
}

void Transfer::start_persistent(int64_t idle_us) {
  KV_CHECK(device_ >= 0, "start_persistent: the persistent copier needs a CUDA device (this transfer works on host memory)");
  if (persistent_) return;
  std::lock_guard<std::mutex> lock(segments_mu_);
  persistent_ = cuda_ops::persistent_start(device_layout_, slots_per_segment_, slot_bytes_, segments_, idle_us);
}

int64_t Transfer::persistent_launches() const {
  KV_CHECK(persistent_ != nullptr, "persistent_launches: the persistent copier is not running");
  return cuda_ops::persistent_relaunches(*persistent_);
}

void Transfer::stop_persistent() {
  if (!persistent_) return;
  cuda_ops::persistent_stop(*persistent_);
  persistent_.reset();
}

std::pair<int64_t, int64_t> Transfer::persistent_last_timing() const {
  KV_CHECK(persistent_ != nullptr, "persistent_last_timing: the persistent copier is not running");
  return cuda_ops::persistent_last_timing(*persistent_);
}

void Transfer::set_segment(int64_t index, uint64_t base) {
  std::lock_guard<std::mutex> lock(segments_mu_);
  KV_CHECK(index >= 0 && index < max_segments_, "set_segment: segment index " + std::to_string(index) +
                                                    " is outside [0, " + std::to_string(max_segments_) + ")");
  segments_[index] = base;
  segment_devices_[index] = base == 0 ? -1 : cuda_ops::pointer_device(base);
  if (persistent_) cuda_ops::persistent_set_segment(*persistent_, index, base);
  if (device_ < 0 && base != 0) {
    KV_CHECK(segment_devices_[index] < 0, "set_segment: segment " + std::to_string(index) +
                                              " is device memory but this transfer works on host memory");
  }
  if (device_ >= 0 && segment_devices_[index] >= 0 && segment_devices_[index] != device_) {
    KV_CHECK(cuda_ops::enable_peer_access(device_, segment_devices_[index]),
             "set_segment: CUDA device " + std::to_string(device_) + " cannot access device " +
                 std::to_string(segment_devices_[index]) + "'s memory directly (no peer access between them)");
  }
}

Method Transfer::resolve(Method method) const {
  if (method != Method::Auto) return method;
  if (device_ < 0) return Method::Memcpy;
  const int64_t average = block_bytes_ / static_cast<int64_t>(regions_.size());
  return average >= batch_min_bytes ? Method::Batch : Method::Kernel;
}

void Transfer::check_pairs(const int64_t* blocks, const int64_t* slots, int64_t n) const {
  for (int64_t i = 0; i < n; ++i) {
    KV_CHECK(blocks[i] >= 0 && blocks[i] < num_blocks_, "engine block id " + std::to_string(blocks[i]) +
                                                            " at position " + std::to_string(i) + " is outside [0, " +
                                                            std::to_string(num_blocks_) + ")");
    const int64_t segment = slots[i] / slots_per_segment_;
    KV_CHECK(slots[i] >= 0 && segment < max_segments_,
             "pool slot " + std::to_string(slots[i]) + " at position " + std::to_string(i) + " is outside [0, " +
                 std::to_string(max_segments_ * slots_per_segment_) + ")");
    KV_CHECK(segments_[segment] != 0, "pool slot " + std::to_string(slots[i]) + " at position " + std::to_string(i) +
                                          " is in segment " + std::to_string(segment) + ", which has no memory");
  }
}

uint64_t Transfer::slot_address(int64_t slot) const {
  const int64_t segment = slot / slots_per_segment_;
  return segments_[segment] + static_cast<uint64_t>((slot - segment * slots_per_segment_) * slot_bytes_);
}

void Transfer::host_copy(bool to_pool, const int64_t* blocks, const int64_t* slots, int64_t n) const {
  for (int64_t i = 0; i < n; ++i) {
    char* slot = reinterpret_cast<char*>(slot_address(slots[i]));
    for (const Region& r : regions_) {
      char* cache = reinterpret_cast<char*>(r.base + static_cast<uint64_t>(blocks[i] * r.block_stride));
      if (to_pool) {
        std::memcpy(slot + r.slot_offset, cache, static_cast<size_t>(r.bytes));
      } else {
        std::memcpy(cache, slot + r.slot_offset, static_cast<size_t>(r.bytes));
      }
    }
  }
}

void Transfer::piece_lists(bool to_pool, const int64_t* blocks, const int64_t* slots, int64_t n,
                           std::vector<uint64_t>& dsts, std::vector<int>& dst_devices, std::vector<uint64_t>& srcs,
                           std::vector<int>& src_devices, std::vector<uint64_t>& sizes) const {
  const size_t pieces = static_cast<size_t>(n) * regions_.size();
  dsts.reserve(pieces);
  srcs.reserve(pieces);
  sizes.reserve(pieces);
  dst_devices.reserve(pieces);
  src_devices.reserve(pieces);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t slot = slot_address(slots[i]);
    const int pool_device = segment_devices_[slots[i] / slots_per_segment_];
    for (const Region& r : regions_) {
      const uint64_t cache = r.base + static_cast<uint64_t>(blocks[i] * r.block_stride);
      const uint64_t pool = slot + static_cast<uint64_t>(r.slot_offset);
      dsts.push_back(to_pool ? pool : cache);
      srcs.push_back(to_pool ? cache : pool);
      dst_devices.push_back(to_pool ? pool_device : device_);
      src_devices.push_back(to_pool ? device_ : pool_device);
      sizes.push_back(static_cast<uint64_t>(r.bytes));
    }
  }
}

std::shared_ptr<CopyEvent> Transfer::copy(bool to_pool, const int64_t* blocks, const int64_t* slots, int64_t n,
                                          uint64_t stream, std::optional<uint64_t> after, Method method) {
  std::lock_guard<std::mutex> lock(segments_mu_);
  check_pairs(blocks, slots, n);
  if (device_ < 0) {
    KV_CHECK(method != Method::Persistent, "method persistent needs a CUDA device (this transfer works on host memory)");
    host_copy(to_pool, blocks, slots, n);
    return std::make_shared<CopyEvent>();
  }
  if (method == Method::Persistent) {
    KV_CHECK(persistent_ != nullptr, "method persistent: start the persistent copier first (start_persistent)");
    KV_CHECK(!after.has_value(), "method persistent: the persistent copier is not ordered with streams, so it cannot "
                                 "wait for `after`; use the kernel method for stream-ordered copies");
    std::vector<int32_t> b(blocks, blocks + n), s(slots, slots + n);
    const uint64_t seq = cuda_ops::persistent_submit(*persistent_, to_pool, b.data(), s.data(), static_cast<int>(n));
    return std::make_shared<CopyEvent>(persistent_, seq);
  }
  if (after.has_value()) cuda_ops::stream_wait_stream(device_, stream, *after);
  switch (resolve(method)) {
    case Method::Kernel: {
      std::vector<int32_t> b(blocks, blocks + n), s(slots, slots + n);
      cuda_ops::launch_kernel_copy(device_layout_, segments_, slots_per_segment_, slot_bytes_, to_pool, b.data(),
                                   s.data(), n, stream, kernel_config);
      break;
    }
    case Method::Batch:
    case Method::Memcpy: {
      std::vector<uint64_t> dsts, srcs, sizes;
      std::vector<int> dst_devices, src_devices;
      piece_lists(to_pool, blocks, slots, n, dsts, dst_devices, srcs, src_devices, sizes);
      if (resolve(method) == Method::Batch) {
        cuda_ops::batch_copy(device_, dsts, srcs, sizes, stream);
      } else {
        cuda_ops::memcpy_each(device_, dsts, dst_devices, srcs, src_devices, sizes, stream);
      }
      break;
    }
    case Method::Auto:
    case Method::Persistent:
      break;  // resolve() never returns Auto; Persistent returned above
  }
  const uint64_t event = cuda_ops::event_acquire(device_);
  try {
    cuda_ops::event_record(event, stream);
  } catch (...) {
    cuda_ops::event_release(event);
    throw;
  }
  return std::make_shared<CopyEvent>(event);
}

std::shared_ptr<CopyEvent> Transfer::move_slots(const int64_t* from, const int64_t* to, int64_t n, uint64_t stream) {
  std::lock_guard<std::mutex> lock(segments_mu_);
  std::vector<int64_t> zeros(static_cast<size_t>(n), 0);
  check_pairs(zeros.data(), from, n);
  check_pairs(zeros.data(), to, n);
  if (device_ < 0) {
    for (int64_t i = 0; i < n; ++i) {
      std::memmove(reinterpret_cast<void*>(slot_address(to[i])), reinterpret_cast<const void*>(slot_address(from[i])),
                   static_cast<size_t>(slot_bytes_));
    }
    return std::make_shared<CopyEvent>();
  }
  // A shrink moves up to a whole segment's blocks (thousands) while a profiler waits for the memory.
  // One cudaMemcpyAsync per slot put thousands of calls on the host, and the copy engines, even
  // batched, pay a fixed cost per piece (a 1 GiB give-back of 64 KiB slots took ~35 ms on H200):
  // the SM kernel moves them in one launch per 2,048 slots. It runs on a stream of the transfer's own
  // (the moved blocks are complete and unpinned, their new slots free: nothing to order after).
  if (stream == 0) {
    std::call_once(move_stream_once_, [this] { move_stream_ = cuda_ops::stream_create(device_); });
    stream = move_stream_;
  }
  std::vector<int32_t> f(from, from + n), t(to, to + n);
  cuda_ops::launch_slot_moves(device_, segments_, slots_per_segment_, slot_bytes_, f.data(), t.data(), n, stream,
                              kernel_config);
  const uint64_t event = cuda_ops::event_acquire(device_);
  try {
    cuda_ops::event_record(event, stream);
  } catch (...) {
    cuda_ops::event_release(event);
    throw;
  }
  return std::make_shared<CopyEvent>(event);
}

}  // namespace specgen_kv
