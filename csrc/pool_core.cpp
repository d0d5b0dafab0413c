#include "pool_core.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "cuda_ops.h"
#include "kv_common.h"

namespace specgen_kv {

namespace {

constexpr size_t kHostAlignment = 4096;

double ms_since(double start_s) { return (monotonic_s() - start_s) * 1e3; }

}  // namespace

double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

PoolCore::PoolCore(std::shared_ptr<Transfer> transfer, int64_t max_segments, int64_t slots_per_segment,
                   int64_t headroom_bytes, int64_t max_bytes, std::vector<int> devices)
    : transfer_(std::move(transfer)),
      table_(max_segments * slots_per_segment),
      max_segments_(max_segments),
      slots_per_segment_(slots_per_segment),
      headroom_bytes_(headroom_bytes),
      max_bytes_(max_bytes),
      devices_(std::move(devices)) {
  KV_CHECK(transfer_ != nullptr, "PoolCore: no transfer");
  KV_CHECK(max_segments > 0 && slots_per_segment > 0, "PoolCore: max_segments and slots_per_segment must be > 0");
  KV_CHECK(transfer_->max_segments() == max_segments && transfer_->slots_per_segment() == slots_per_segment,
           "PoolCore: the transfer was built for another segment layout");
}

PoolCore::~PoolCore() {
  try {
    close();
  } catch (...) {
    // A destructor must not throw; memory left behind goes with the process.
  }
}

int64_t PoolCore::acquire_prefix(const uint64_t* keys, int64_t n, int64_t* slots_out) {
  const int64_t held = table_.acquire_prefix(keys, n, slots_out);
  if (held < n) {
    std::lock_guard<std::mutex> lock(mu_);
    late_misses_ += n - held;
  }
  return held;
}

uint64_t PoolCore::track(std::shared_ptr<CopyEvent> event, std::vector<uint64_t> keys, bool store) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_copy_++;
  copies_.emplace(id, Tracked{std::move(event), std::move(keys), store});
  return id;
}

bool PoolCore::finish(uint64_t id) {
  Tracked copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = copies_.find(id);
    if (it == copies_.end()) return false;  // finished already (by a give-back waiting for it, or another thread)
    copy = std::move(it->second);
    copies_.erase(it);
  }
  const auto n = static_cast<int64_t>(copy.keys.size());
  if (copy.store) {
    table_.complete_store(copy.keys.data(), n, true);
  } else {
    table_.release(copy.keys.data(), n);
  }
  return true;
}

int64_t PoolCore::poll() {
  std::vector<uint64_t> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, copy] : copies_) {
      if (copy.event->done()) done.push_back(id);
    }
  }
  for (uint64_t id : done) finish(id);
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(copies_.size());
}

void PoolCore::wait_all() {
  std::vector<std::pair<uint64_t, std::shared_ptr<CopyEvent>>> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, copy] : copies_) waiting.emplace_back(id, copy.event);
  }
  for (const auto& [id, event] : waiting) {
    event->wait();
    finish(id);
  }
}

void PoolCore::set_headroom(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  headroom_bytes_ = bytes;
}

int64_t PoolCore::capacity_locked() const {
  int64_t total = 0;
  for (const auto& [index, segment] : segments_) total += segment.nbytes;
  return total;
}

int64_t PoolCore::capacity_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_locked();
}

int64_t PoolCore::device_room(int device) const {
  int64_t room = max_bytes_ >= 0 ? max_bytes_ - capacity_locked() : INT64_MAX;
  if (device != kHostDevice) room = std::min(room, cuda_ops::mem_get_info(device).first - headroom_bytes_);
  return room;
}

std::pair<int64_t, uint64_t> PoolCore::add_segment(uint64_t address, int device, int64_t nbytes, bool owned) {
  KV_CHECK(nbytes >= segment_bytes(), "add_segment: a segment of " + std::to_string(nbytes) +
                                          " bytes is smaller than this pool's segments (" +
                                          std::to_string(segment_bytes()) + " bytes)");
  std::lock_guard<std::mutex> lock(mu_);
  KV_CHECK(!closed_, "add_segment: the pool is closed");
  int64_t index = 0;
  while (index < max_segments_ && segments_.count(index)) ++index;
  KV_CHECK(index < max_segments_,
           "the pool already holds max_segments=" + std::to_string(max_segments_) + " segments");
  transfer_->set_segment(index, address);
  const auto [lo, hi] = slot_range(index);
  table_.enable_slots(lo, hi);
  const uint64_t serial = next_serial_++;
  segments_[index] = PoolSegment{index, serial, address, device, nbytes, owned};
  ++grows_;
  return {index, serial};
}

int64_t PoolCore::grow(int64_t nbytes, int device) {
  std::lock_guard<std::mutex> grow_lock(grow_mu_);
  std::vector<int> targets = devices_;
  if (device != kAnyDevice) {
    KV_CHECK(std::find(devices_.begin(), devices_.end(), device) != devices_.end(),
             "grow: device " + std::to_string(device) + " is not one of this pool's devices");
    targets = {device};
  }
  const int64_t seg = segment_bytes();
  int64_t added = 0;
  bool progress = true;
  while (progress && (nbytes < 0 || added + seg <= nbytes)) {
    progress = false;
    std::vector<std::pair<int64_t, int>> rooms;   // spread over the devices with the most room first
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_ || static_cast<int64_t>(segments_.size()) >= max_segments_) break;
      for (int target : targets) rooms.emplace_back(device_room(target), target);
    }
    std::sort(rooms.begin(), rooms.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [room, target] : rooms) {
      if (nbytes >= 0 && added + seg > nbytes) break;
      if (room < seg) continue;
      uint64_t address = 0;
      if (target == kHostDevice) {
        address = reinterpret_cast<uint64_t>(std::aligned_alloc(kHostAlignment, static_cast<size_t>(seg)));
        if (address == 0) continue;
      } else {
        try {
          address = cuda_ops::device_alloc(target, seg);
        } catch (const KvError&) {
          continue;  // another process took the memory between the check and the allocation
        }
      }
      try {
        add_segment(address, target, seg, true);
      } catch (...) {
        free_owned({PoolSegment{0, 0, address, target, seg, true}});
        throw;
      }
      added += seg;
      progress = true;
      break;   // the rooms changed with this allocation: rank the devices again
    }
  }
  return added;
}

std::vector<PoolSegment> PoolCore::segments() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<PoolSegment> out;
  for (const auto& [index, segment] : segments_) out.push_back(segment);
  return out;
}

PoolCounters PoolCore::counters() const {
  PoolCounters out;
  out.table = table_.stats();
  std::lock_guard<std::mutex> lock(mu_);
  std::map<int, int64_t> by_device;
  for (const auto& [index, segment] : segments_) {
    out.capacity_bytes += segment.nbytes;
    by_device[segment.device] += segment.nbytes;
  }
  out.bytes_by_device.assign(by_device.begin(), by_device.end());
  out.segments = static_cast<int64_t>(segments_.size());
  out.grows = grows_;
  out.shrinks = shrinks_;
  out.late_misses = late_misses_;
  out.inflight = static_cast<int64_t>(copies_.size());
  return out;
}

ReleaseReport PoolCore::shrink(int64_t nbytes, int device, double timeout_s, bool relocate, bool include_lent) {
  std::lock_guard<std::mutex> shrink_lock(shrink_mu_);
  ReleaseReport total;
  total.began_s = monotonic_s();
  while (total.freed_bytes < nbytes) {
    std::vector<PoolSegment> victims;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<std::pair<int64_t, PoolSegment>> candidates;   // (blocks held, segment)
      for (const auto& [index, segment] : segments_) {
        if (device != kAnyDevice && segment.device != device) continue;
        if (!segment.owned && !include_lent) continue;
        const auto [lo, hi] = slot_range(index);
        candidates.emplace_back(table_.used_in_range(lo, hi), segment);
      }
      // Fewest blocks first: least data to move or lose.
      std::stable_sort(candidates.begin(), candidates.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      int64_t chosen = 0;
      for (const auto& [used, segment] : candidates) {
        if (total.freed_bytes + chosen >= nbytes) break;
        victims.push_back(segment);
        chosen += segment.nbytes;
      }
    }
    if (victims.empty()) break;
    ReleaseReport step = release(std::move(victims), timeout_s, relocate);
    total.freed_bytes += step.freed_bytes;
    total.lent.insert(total.lent.end(), step.lent.begin(), step.lent.end());
    total.retire_ms += step.retire_ms;
    total.wait_ms += step.wait_ms;
    total.free_ms += step.free_ms;
    total.passes += step.passes;
    if (step.timed_out) {
      total.timed_out = true;
      total.busy = step.busy;
      break;
    }
  }
  total.ended_s = monotonic_s();
  return total;
}

ReleaseReport PoolCore::release_segment(int64_t index, double timeout_s, bool relocate) {
  std::lock_guard<std::mutex> shrink_lock(shrink_mu_);
  PoolSegment segment;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segments_.find(index);
    KV_CHECK(it != segments_.end(), "the pool has no segment " + std::to_string(index));
    segment = it->second;
  }
  return release({segment}, timeout_s, relocate);
}

ReleaseReport PoolCore::release(std::vector<PoolSegment> pending, double timeout_s, bool relocate) {
  // Every chosen segment stops taking blocks before any is retired, so no block moves into a segment
  // that is going too, and the blocks that move go in one batched copy.
  ReleaseReport report;
  report.began_s = monotonic_s();
  for (const PoolSegment& segment : pending) {
    const auto [lo, hi] = slot_range(segment.index);
    table_.disable_slots(lo, hi);
  }
  const double deadline = report.began_s + timeout_s;
  std::vector<PoolSegment> released;
  double started = report.began_s;
  while (!pending.empty()) {
    ++report.passes;
    // Retire: hot blocks get slots elsewhere, the rest are evicted; pinned blocks stay for a later pass.
    std::vector<uint64_t> keys;
    std::vector<int64_t> from, to;
    int64_t busy = 0;
    for (const PoolSegment& segment : pending) {
      const auto [lo, hi] = slot_range(segment.index);
      RetirePlan plan = table_.retire_slots(lo, hi, relocate);
      busy += plan.busy;
      for (const SlotMove& move : plan.moves) {
        keys.push_back(move.key);
        from.push_back(move.from);
        to.push_back(move.to);
      }
    }
    if (!keys.empty()) {
      // The moved blocks are pinned and unreadable until finish_moves; their old slots are in
      // disabled ranges only this give-back frees (shrink_mu_), so no lock is needed for the copy.
      try {
        transfer_->move_slots(from.data(), to.data(), static_cast<int64_t>(from.size()), 0)->wait();
      } catch (...) {
        table_.finish_moves(keys.data(), static_cast<int64_t>(keys.size()), false);
        throw;
      }
      table_.finish_moves(keys.data(), static_cast<int64_t>(keys.size()), true);
    }
    std::vector<PoolSegment> still;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const PoolSegment& segment : pending) {
        const auto [lo, hi] = slot_range(segment.index);
        // Empty and taking no blocks: nothing can copy into or out of it from here on.
        if (table_.used_in_range(lo, hi) == 0) {
          transfer_->set_segment(segment.index, 0);
          segments_.erase(segment.index);
          ++shrinks_;
          released.push_back(segment);
        } else {
          still.push_back(segment);
        }
      }
    }
    pending.swap(still);
    report.retire_ms += ms_since(started);
    if (pending.empty()) break;
    if (monotonic_s() > deadline) {
      report.timed_out = true;
      report.busy = busy;
      break;
    }
    // Blocks in these segments are pinned by copies in flight: wait for those copies and finish
    // them (their pins drop), without any lock held.
    const double wait_start = monotonic_s();
    std::vector<std::pair<uint64_t, std::shared_ptr<CopyEvent>>> waiting;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, copy] : copies_) waiting.emplace_back(id, copy.event);
    }
    if (waiting.empty()) {
      // Pinned by an acquire whose copy is not submitted yet: it will be in a moment.
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (const auto& [id, event] : waiting) {
      const double left = deadline - monotonic_s();
      if (left <= 0) break;
      try {
        event->wait(left);
      } catch (const KvError&) {
        break;   // not done in time: the deadline check above names what is still pinned
      }
      finish(id);
    }
    started = monotonic_s();
    report.wait_ms += (started - wait_start) * 1e3;
  }
  // All together and without any lock: cudaFree waits for the device's work in flight.
  const double free_start = monotonic_s();
  std::vector<PoolSegment> owned;
  for (const PoolSegment& segment : released) {
    report.freed_bytes += segment.nbytes;
    if (segment.owned) {
      owned.push_back(segment);
    } else {
      report.lent.push_back(segment.serial);
    }
  }
  free_owned(owned);
  report.free_ms = ms_since(free_start);
  report.ended_s = monotonic_s();
  return report;
}

void PoolCore::free_owned(const std::vector<PoolSegment>& owned) {
  std::map<int, std::vector<uint64_t>> by_device;
  for (const PoolSegment& segment : owned) {
    if (segment.device == kHostDevice) {
      std::free(reinterpret_cast<void*>(segment.address));
    } else {
      by_device[segment.device].push_back(segment.address);
    }
  }
  for (const auto& [device, addresses] : by_device) cuda_ops::device_free_many(device, addresses);
}

std::vector<uint64_t> PoolCore::close() {
  std::lock_guard<std::mutex> shrink_lock(shrink_mu_);
  std::lock_guard<std::mutex> grow_lock(grow_mu_);
  wait_all();
  std::vector<PoolSegment> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    for (const auto& [index, segment] : segments_) {
      transfer_->set_segment(index, 0);
      all.push_back(segment);
    }
    segments_.clear();
  }
  std::vector<PoolSegment> owned;
  std::vector<uint64_t> lent;
  for (const PoolSegment& segment : all) {
    if (segment.owned) {
      owned.push_back(segment);
    } else {
      lent.push_back(segment.serial);
    }
  }
  free_owned(owned);
  return lent;
}

}  // namespace specgen_kv
