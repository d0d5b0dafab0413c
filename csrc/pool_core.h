// The remote KV pool's state and its give-back, in C++: the block table, the segments of pool memory
// and the copies in flight that pin blocks.
//
// Why C++: a profiler waiting for the pool's memory must not wait for the interpreter. The give-back
// (choose segments, retire their slots, move the hot blocks, wait for the copies that pin blocks,
// free the memory) runs here without Python, either called from Python with the interpreter
// released or from the pool's give-back thread (pool_server.h), while the engine's Python threads
// keep storing and loading. specgen/kv/pool.py is the Python face of this class.
//
// Promises kept: a block a copy is reading or writing is never freed or rewritten (it is pinned from
// the table's acquire/allocate until its copy is finished here); a block that left the pool between
// a lookup and a load is a miss, never another block's bytes.
//
// Locks, always taken in this order: shrink_mu_ (one give-back or close at a time), grow_mu_ (one
// grow at a time), mu_ (segments, copies in flight, counters), then the table's and the transfer's
// own locks. No lock is held while waiting for a copy or for cudaFree.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "block_table.h"
#include "transfer.h"

namespace specgen_kv {

constexpr int kHostDevice = -1;      // segments in host memory
constexpr int kAnyDevice = -1000;    // shrink: choose segments on any device

struct PoolSegment {
  int64_t index = 0;     // position in the slot space: slots [index * slots_per_segment, ...)
  uint64_t serial = 0;   // unique over the pool's life (an index is reused after a give-back)
  uint64_t address = 0;
  int device = kHostDevice;
  int64_t nbytes = 0;
  bool owned = false;    // allocated here (freed here), or lent by another process (closed by Python)
};

struct PoolCounters {
  BlockTableStats table;
  int64_t capacity_bytes = 0;
  int64_t segments = 0;
  int64_t grows = 0;
  int64_t shrinks = 0;
  int64_t late_misses = 0;   // blocks a lookup found that were gone by their load
  int64_t inflight = 0;      // copies not finished yet
  std::vector<std::pair<int, int64_t>> bytes_by_device;
};

// Where one give-back's time went, and what it did.
struct ReleaseReport {
  int64_t freed_bytes = 0;
  std::vector<uint64_t> lent;   // serials of lent segments retired: their owner-side mapping is for Python to close
  double began_s = 0.0;         // CLOCK_MONOTONIC seconds (Python's time.perf_counter on Linux)
  double ended_s = 0.0;
  double retire_ms = 0.0;       // retiring slots and moving blocks
  double wait_ms = 0.0;         // waiting for copies in flight that pin blocks
  double free_ms = 0.0;         // cudaFree / free
  int64_t passes = 0;
  bool timed_out = false;       // blocks were still pinned at the deadline (what was empty is freed)
  int64_t busy = 0;             // how many, when timed out
};

double monotonic_s();

class PoolCore {
 public:
  // max_bytes < 0: no cap (GPU pools are sized by headroom); devices: where grow may allocate.
  PoolCore(std::shared_ptr<Transfer> transfer, int64_t max_segments, int64_t slots_per_segment, int64_t headroom_bytes,
           int64_t max_bytes, std::vector<int> devices);
  ~PoolCore();
  PoolCore(const PoolCore&) = delete;
  PoolCore& operator=(const PoolCore&) = delete;

  BlockTable& table() { return table_; }
  Transfer& transfer() { return *transfer_; }
  int64_t segment_bytes() const { return slots_per_segment_ * transfer_->slot_bytes(); }
  // GPU memory grow leaves free on a device (read at each grow).
  void set_headroom(int64_t bytes);

  // Pin the leading blocks still in the pool for a load (late misses counted); how many.
  int64_t acquire_prefix(const uint64_t* keys, int64_t n, int64_t* slots_out);
  // A copy was submitted on blocks pinned by acquire (load) or allocate (store): the pool finishes it
  // (unpins, or makes stored blocks readable) when asked or when a give-back waits for it. Its id.
  uint64_t track(std::shared_ptr<CopyEvent> event, std::vector<uint64_t> keys, bool store);
  // Finish copy `id` if not finished yet (its event must be complete); whether this call finished it.
  bool finish(uint64_t id);
  // Finish the copies whose events completed; how many are still in flight.
  int64_t poll();
  // Wait for every copy in flight now and finish them.
  void wait_all();

  // Take up to nbytes more (all that is allowed when < 0) in whole segments on `device` (kAnyDevice:
  // those with the most room first); bytes added.
  int64_t grow(int64_t nbytes, int device);
  // Add memory allocated elsewhere (owned: this pool frees it); (index, serial).
  std::pair<int64_t, uint64_t> add_segment(uint64_t address, int device, int64_t nbytes, bool owned);
  // Give back at least nbytes in whole segments (fewest blocks first) on `device` (or kAnyDevice);
  // lent segments only when include_lent. Waits at most timeout_s for copies that pin blocks.
  ReleaseReport shrink(int64_t nbytes, int device, double timeout_s, bool relocate, bool include_lent);
  ReleaseReport release_segment(int64_t index, double timeout_s, bool relocate);

  PoolCounters counters() const;
  std::vector<PoolSegment> segments() const;
  int64_t capacity_bytes() const;
  // Wait for copies, free owned segments; the serials of lent ones (for Python to close).
  std::vector<uint64_t> close();

 private:
  ReleaseReport release(std::vector<PoolSegment> victims, double timeout_s, bool relocate);
  int64_t device_room(int device) const;   // caller holds mu_
  int64_t capacity_locked() const;
  std::pair<int64_t, int64_t> slot_range(int64_t index) const {
    return {index * slots_per_segment_, (index + 1) * slots_per_segment_};
  }
  void free_owned(const std::vector<PoolSegment>& owned);

  struct Tracked {
    std::shared_ptr<CopyEvent> event;
    std::vector<uint64_t> keys;
    bool store;
  };

  std::shared_ptr<Transfer> transfer_;
  BlockTable table_;
  int64_t max_segments_;
  int64_t slots_per_segment_;
  int64_t headroom_bytes_;
  int64_t max_bytes_;
  std::vector<int> devices_;

  std::mutex shrink_mu_;
  std::mutex grow_mu_;
  mutable std::mutex mu_;
  std::map<int64_t, PoolSegment> segments_;   // by index
  std::map<uint64_t, Tracked> copies_;        // by id
  uint64_t next_copy_ = 1;
  uint64_t next_serial_ = 1;
  int64_t grows_ = 0;
  int64_t shrinks_ = 0;
  int64_t late_misses_ = 0;
  bool closed_ = false;
};

}  // namespace specgen_kv
