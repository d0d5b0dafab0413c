// The pool's block table: which KV block (by content hash) lives in which pool slot.
//
// Plain C++ with no CUDA, shared by the CPU and CUDA builds. Keys are 64-bit block hashes; slots are
// indices into the pool's slot space, which is cut into equal segments that can be switched on (the
// pool grew) and retired (the pool shrinks). Entries carry a reference count: a block is pinned while a
// copy into or out of its slot is in flight, and a pinned block is never evicted or moved. Eviction is
// least-recently-used among unpinned, complete blocks.
//
// Every public call is atomic (one mutex inside): the pool's give-back thread (csrc/pool_core.h)
// retires slots while the engine's threads look up, pin and store blocks.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace specgen_kv {

struct BlockTableStats {
  int64_t entries = 0;        // blocks held (complete or being stored)
  int64_t capacity = 0;       // slots switched on
  int64_t free = 0;           // slots switched on and empty
  int64_t pinned = 0;         // blocks with a copy in flight
  int64_t hits = 0;           // lookups that found a complete block
  int64_t misses = 0;         // lookups that found nothing
  int64_t stores = 0;         // blocks stored (store completed successfully)
  int64_t loads = 0;          // blocks handed out for loading
  int64_t evictions = 0;      // blocks dropped to make room or to shrink
  int64_t moves = 0;          // blocks relocated out of a shrinking range
};

// A block that must be copied from slot `from` to slot `to` before it is usable again (shrinking).
struct SlotMove {
  uint64_t key;
  int64_t from;
  int64_t to;
};

struct RetirePlan {
  std::vector<SlotMove> moves;      // copy these, then call finish_moves
  std::vector<uint64_t> evicted;    // dropped from the table
  int64_t busy = 0;                 // blocks in the range still pinned: retire again once they are released
};

struct AllocateResult {
  std::vector<int64_t> slots;       // per key: slot to store into, kAlreadyPresent, or kNoRoom
  std::vector<uint64_t> evicted;    // blocks dropped to make room
};

class BlockTable {
 public:
  static constexpr int64_t kAlreadyPresent = -1;
  static constexpr int64_t kNoRoom = -2;

  // Lookup results.
  static constexpr int kMiss = 0;
  static constexpr int kHit = 1;
  static constexpr int kPending = 2;

  explicit BlockTable(int64_t max_slots);

  int64_t max_slots() const { return static_cast<int64_t>(owner_.size()); }
  int64_t size() const;
  BlockTableStats stats() const;

  // Slots [lo, hi) become usable (a segment was added).
  void enable_slots(int64_t lo, int64_t hi);
  // Slots [lo, hi) stop taking new blocks, and their blocks stop being found (lookups miss them), so
  // no new load pins them. Disable every range of a shrink before retiring any, so that blocks moved
  // out of one range never land in another that is going away.
  void disable_slots(int64_t lo, int64_t hi);
  // Disables [lo, hi) (disable_slots), then: with relocate, their unpinned blocks move to free slots
  // elsewhere (or to the slots of older blocks, which are evicted) when they are more recently used than
  // what would be evicted to make room; every other unpinned block in the range is evicted.
  RetirePlan retire_slots(int64_t lo, int64_t hi, bool relocate);
  // Blocks (complete or in flight) whose slot is in [lo, hi).
  int64_t used_in_range(int64_t lo, int64_t hi) const;
  // The copies of moved blocks finished (ok) or failed (the blocks are dropped).
  void finish_moves(const uint64_t* keys, int64_t n, bool ok);

  // Reserve a slot for each key not yet held, evicting LRU blocks if needed. New blocks are pinned and
  // not readable until complete_store.
  AllocateResult allocate(const uint64_t* keys, int64_t n);
  // Stores finished: success makes the blocks readable; failure drops them.
  void complete_store(const uint64_t* keys, int64_t n, bool success);

  // kHit, kMiss or kPending (held but its store is still in flight). Counts toward the hit rate.
  int lookup(uint64_t key);
  // Like lookup, without counting toward the hit rate.
  int peek(uint64_t key) const;
  // How many leading keys are complete blocks. Counts hits for those and misses for the rest.
  int64_t lookup_prefix(const uint64_t* keys, int64_t n);
  // Pin the leading keys that are complete blocks (up to the first that is not), mark them recently
  // used and write their slots; how many were pinned. Unlike lookup_prefix + acquire, nothing can
  // leave the pool between the two.
  int64_t acquire_prefix(const uint64_t* keys, int64_t n, int64_t* slots_out);
  // Pin complete blocks for loading and mark them recently used; writes their slots.
  void acquire(const uint64_t* keys, int64_t n, int64_t* slots_out);
  // Unpin blocks pinned by acquire.
  void release(const uint64_t* keys, int64_t n);
  // Mark blocks recently used (keys not held are ignored).
  void touch(const uint64_t* keys, int64_t n);
  // Slot of a held block, or -1.
  int64_t slot_of(uint64_t key) const;
  // Drop unpinned blocks among keys; returns the ones dropped.
  std::vector<uint64_t> remove(const uint64_t* keys, int64_t n);
  // Drop every unpinned block; returns the ones dropped.
  std::vector<uint64_t> clear();

 private:
  struct Entry {
    int64_t slot;
    int32_t refs;
    bool ready;
    uint64_t tick;                         // last use, for comparing recency
    std::list<uint64_t>::iterator lru;     // position in lru_ (front = least recently used)
  };

  void disable_range(int64_t lo, int64_t hi);
  int64_t pop_free_slot();
  void free_slot(int64_t slot);
  void drop(std::unordered_map<uint64_t, Entry>::iterator it);
  void touch_entry(Entry& e, uint64_t key);
  // A complete block in a slot that is in use (not being retired): lookups find it, loads may pin it.
  bool readable(const Entry& e) const { return e.ready && enabled_[e.slot]; }
  // Least recently used block that can be evicted, outside retiring slots, starting the walk at
  // `*cursor` (front of the LRU list when null) and leaving it there; entries_.end() if none.
  std::unordered_map<uint64_t, Entry>::iterator evictable(uint64_t younger_than,
                                                          std::list<uint64_t>::iterator* cursor = nullptr);

  mutable std::mutex mu_;              // guards everything below
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;
  std::vector<uint64_t> owner_;        // key held by each slot (valid when used_[slot])
  std::vector<uint8_t> used_;
  std::vector<uint8_t> enabled_;
  std::vector<uint8_t> in_free_;
  std::vector<int64_t> free_;          // candidate free slots; disabled ones are skipped lazily
  int64_t capacity_ = 0;
  int64_t pinned_ = 0;
  uint64_t clock_ = 0;
  BlockTableStats counters_;
};

}  // namespace specgen_kv
