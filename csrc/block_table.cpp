#include "block_table.h"

#include <algorithm>
#include <string>

#include "kv_common.h"

namespace specgen_kv {

BlockTable::BlockTable(int64_t max_slots) {
  KV_CHECK(max_slots >= 0, "BlockTable: max_slots must be >= 0, got " + std::to_string(max_slots));
  owner_.assign(max_slots, 0);
  used_.assign(max_slots, 0);
  enabled_.assign(max_slots, 0);
  in_free_.assign(max_slots, 0);
}

int64_t BlockTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(entries_.size());
}

BlockTableStats BlockTable::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  BlockTableStats s = counters_;
  s.entries = static_cast<int64_t>(entries_.size());
  s.capacity = capacity_;
  int64_t free_count = 0;
  for (int64_t slot : free_) {
    if (enabled_[slot] && !used_[slot]) ++free_count;
  }
  s.free = free_count;
  s.pinned = pinned_;
  return s;
}

void BlockTable::enable_slots(int64_t lo, int64_t hi) {
  std::lock_guard<std::mutex> lock(mu_);
  KV_CHECK(0 <= lo && lo <= hi && hi <= max_slots(),
           "enable_slots: range [" + std::to_string(lo) + ", " + std::to_string(hi) +
               ") is outside [0, " + std::to_string(max_slots()) + ")");
  // Pushed in reverse so that the range's slots are handed out in ascending order.
  for (int64_t slot = hi - 1; slot >= lo; --slot) {
    if (enabled_[slot]) continue;
    enabled_[slot] = 1;
    ++capacity_;
    if (!used_[slot] && !in_free_[slot]) {
      in_free_[slot] = 1;
      free_.push_back(slot);
    }
  }
}

int64_t BlockTable::pop_free_slot() {
  while (!free_.empty()) {
    int64_t slot = free_.back();
    free_.pop_back();
    in_free_[slot] = 0;
    if (enabled_[slot] && !used_[slot]) return slot;
  }
  return -1;
}

void BlockTable::free_slot(int64_t slot) {
  used_[slot] = 0;
  if (enabled_[slot] && !in_free_[slot]) {
    in_free_[slot] = 1;
    free_.push_back(slot);
  }
}

void BlockTable::drop(std::unordered_map<uint64_t, Entry>::iterator it) {
  if (it->second.refs > 0) --pinned_;
  free_slot(it->second.slot);
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

void BlockTable::touch_entry(Entry& e, uint64_t key) {
  e.tick = ++clock_;
  lru_.splice(lru_.end(), lru_, e.lru);
  (void)key;
}

std::unordered_map<uint64_t, BlockTable::Entry>::iterator BlockTable::evictable(uint64_t younger_than,
                                                                              std::list<uint64_t>::iterator* cursor) {
  auto pos = cursor != nullptr ? *cursor : lru_.begin();
  for (; pos != lru_.end(); ++pos) {
    auto it = entries_.find(*pos);
    const Entry& e = it->second;
    if (e.tick >= younger_than) break;  // the list is ordered by recency: nothing older follows
    if (e.refs == 0 && readable(e)) break;
  }
  if (cursor != nullptr) *cursor = pos;
  if (pos == lru_.end()) return entries_.end();
  auto it = entries_.find(*pos);
  return it->second.tick < younger_than ? it : entries_.end();
}

AllocateResult BlockTable::allocate(const uint64_t* keys, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  AllocateResult out;
  out.slots.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t key = keys[i];
    auto found = entries_.find(key);
    if (found != entries_.end()) {
      touch_entry(found->second, key);
      out.slots[i] = kAlreadyPresent;
      continue;
    }
    int64_t slot = pop_free_slot();
    if (slot < 0) {
      auto victim = evictable(UINT64_MAX);
      if (victim != entries_.end()) {
        out.evicted.push_back(victim->first);
        ++counters_.evictions;
        drop(victim);
        slot = pop_free_slot();
      }
    }
    if (slot < 0) {
      // No room now (everything pinned or no capacity): this key and the rest are not stored.
      for (int64_t j = i; j < n; ++j) out.slots[j] = kNoRoom;
      break;
    }
    used_[slot] = 1;
    owner_[slot] = key;
    lru_.push_back(key);
    Entry e{slot, 1, false, ++clock_, std::prev(lru_.end())};
    entries_.emplace(key, e);
    ++pinned_;
    out.slots[i] = slot;
  }
  return out;
}

void BlockTable::complete_store(const uint64_t* keys, int64_t n, bool success) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) {
    auto it = entries_.find(keys[i]);
    KV_CHECK(it != entries_.end(), "complete_store: block " + std::to_string(keys[i]) +
                                       " has no store in flight (was it allocated?)");
    Entry& e = it->second;
    KV_CHECK(!e.ready && e.refs > 0,
             "complete_store: block " + std::to_string(keys[i]) + " was already stored");
    if (!success) {
      drop(it);
      continue;
    }
    e.ready = true;
    if (--e.refs == 0) --pinned_;
    ++counters_.stores;
  }
}

int BlockTable::lookup(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    ++counters_.misses;
    return kMiss;
  }
  if (!readable(it->second)) {
    // Being stored, or moved out of a retiring range: held, but not readable yet.
    if (!it->second.ready) return kPending;
    ++counters_.misses;
    return kMiss;
  }
  ++counters_.hits;
  return kHit;
}

int BlockTable::peek(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return kMiss;
  if (readable(it->second)) return kHit;
  return it->second.ready ? kMiss : kPending;
}

int64_t BlockTable::lookup_prefix(const uint64_t* keys, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t hits = 0;
  for (; hits < n; ++hits) {
    auto it = entries_.find(keys[hits]);
    if (it == entries_.end() || !readable(it->second)) break;
  }
  counters_.hits += hits;
  counters_.misses += n - hits;
  return hits;
}

int64_t BlockTable::acquire_prefix(const uint64_t* keys, int64_t n, int64_t* slots_out) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t held = 0;
  for (; held < n; ++held) {
    auto it = entries_.find(keys[held]);
    if (it == entries_.end() || !readable(it->second)) break;
    Entry& e = it->second;
    if (e.refs++ == 0) ++pinned_;
    touch_entry(e, keys[held]);
    slots_out[held] = e.slot;
  }
  counters_.loads += held;
  return held;
}

void BlockTable::acquire(const uint64_t* keys, int64_t n, int64_t* slots_out) {
  std::lock_guard<std::mutex> lock(mu_);
  // Check everything first so a failure pins nothing.
  for (int64_t i = 0; i < n; ++i) {
    auto it = entries_.find(keys[i]);
    KV_CHECK(it != entries_.end() && readable(it->second),
             "acquire: block " + std::to_string(keys[i]) +
                 (it == entries_.end()      ? " is not in the pool"
                  : !it->second.ready       ? " is still being stored"
                                            : " is in slots the pool is giving back"));
  }
  for (int64_t i = 0; i < n; ++i) {
    Entry& e = entries_.find(keys[i])->second;
    if (e.refs++ == 0) ++pinned_;
    touch_entry(e, keys[i]);
    slots_out[i] = e.slot;
  }
  counters_.loads += n;
}

void BlockTable::release(const uint64_t* keys, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) {
    auto it = entries_.find(keys[i]);
    KV_CHECK(it != entries_.end() && it->second.refs > 0 && it->second.ready,
             "release: block " + std::to_string(keys[i]) + " is not pinned for loading");
    if (--it->second.refs == 0) --pinned_;
  }
}

void BlockTable::touch(const uint64_t* keys, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) {
    auto it = entries_.find(keys[i]);
    if (it != entries_.end()) touch_entry(it->second, keys[i]);
  }
}

int64_t BlockTable::slot_of(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? -1 : it->second.slot;
}

std::vector<uint64_t> BlockTable::remove(const uint64_t* keys, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> removed;
  for (int64_t i = 0; i < n; ++i) {
    auto it = entries_.find(keys[i]);
    if (it == entries_.end() || it->second.refs > 0) continue;
    removed.push_back(keys[i]);
    drop(it);
  }
  return removed;
}

std::vector<uint64_t> BlockTable::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> removed;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->second.refs == 0) {
      removed.push_back(it->first);
      drop(it);
    }
    it = next;
  }
  return removed;
}

int64_t BlockTable::used_in_range(int64_t lo, int64_t hi) const {
  std::lock_guard<std::mutex> lock(mu_);
  KV_CHECK(0 <= lo && lo <= hi && hi <= max_slots(), "used_in_range: range outside the slot space");
  int64_t count = 0;
  for (int64_t slot = lo; slot < hi; ++slot) count += used_[slot];
  return count;
}

void BlockTable::disable_slots(int64_t lo, int64_t hi) {
  std::lock_guard<std::mutex> lock(mu_);
  disable_range(lo, hi);
}

void BlockTable::disable_range(int64_t lo, int64_t hi) {
  KV_CHECK(0 <= lo && lo <= hi && hi <= max_slots(),
           "disable_slots: range [" + std::to_string(lo) + ", " + std::to_string(hi) +
               ") is outside [0, " + std::to_string(max_slots()) + ")");
  for (int64_t slot = lo; slot < hi; ++slot) {
    if (enabled_[slot]) {
      enabled_[slot] = 0;
      --capacity_;
    }
  }
}

RetirePlan BlockTable::retire_slots(int64_t lo, int64_t hi, bool relocate) {
  std::lock_guard<std::mutex> lock(mu_);
  disable_range(lo, hi);
  RetirePlan plan;
  // Candidates: unpinned complete blocks in the range, most recently used first, so the hottest
  // blocks get the free slots elsewhere.
  std::vector<std::pair<uint64_t, uint64_t>> candidates;  // (tick, key)
  for (int64_t slot = lo; slot < hi; ++slot) {
    if (!used_[slot]) continue;
    const Entry& e = entries_.find(owner_[slot])->second;
    if (e.refs > 0) {
      ++plan.busy;
    } else {
      candidates.emplace_back(e.tick, owner_[slot]);
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  // Candidates come hottest first and victims coldest first, so one walk of the LRU list serves the
  // whole range: restarting it per candidate re-skipped the range's own (disabled) blocks each time,
  // quadratic in the range's size.
  auto cursor = lru_.begin();
  for (const auto& [tick, key] : candidates) {
    auto it = entries_.find(key);
    int64_t dst = relocate ? pop_free_slot() : -1;
    if (relocate && dst < 0) {
      auto victim = evictable(tick, &cursor);
      if (victim != entries_.end()) {
        ++cursor;  // the victim's list node goes away with it
        plan.evicted.push_back(victim->first);
        ++counters_.evictions;
        drop(victim);
        dst = pop_free_slot();
      }
    }
    if (dst < 0) {
      // Everything elsewhere is hotter (or pinned): this block is the one to lose.
      if (cursor != lru_.end() && *cursor == key) ++cursor;
      plan.evicted.push_back(key);
      ++counters_.evictions;
      drop(it);
      continue;
    }
    Entry& e = it->second;
    int64_t from = e.slot;
    free_slot(from);
    used_[dst] = 1;
    owner_[dst] = key;
    e.slot = dst;
    e.ready = false;  // not readable until its data has been copied
    e.refs = 1;
    ++pinned_;
    ++counters_.moves;
    plan.moves.push_back({key, from, dst});
  }
  return plan;
}

void BlockTable::finish_moves(const uint64_t* keys, int64_t n, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  // Check everything first so a bad key changes nothing.
  for (int64_t i = 0; i < n; ++i) {
    auto it = entries_.find(keys[i]);
    KV_CHECK(it != entries_.end() && !it->second.ready && it->second.refs == 1,
             "finish_moves: block " + std::to_string(keys[i]) + " has no move in flight");
  }
  for (int64_t i = 0; i < n; ++i) {
    auto it = entries_.find(keys[i]);
    if (!ok) {
      drop(it);
      continue;
    }
    it->second.ready = true;
    it->second.refs = 0;
    --pinned_;
  }
}

}  // namespace specgen_kv
