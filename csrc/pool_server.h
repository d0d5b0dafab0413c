// The pool's give-back thread: a native thread of the pool's process that takes resize and stats
// requests from the pool's control agent (specgen/kv/pool_agent.py, a process of its own) over a
// Unix SOCK_SEQPACKET socket and answers them from PoolCore, so no Python thread of the engine's
// process stands between a profiler's request and the memory being freed.
//
// The records are fixed-size and native-endian (both ends are on one host); pool_agent.py mirrors
// them with `struct` and checks their sizes against POOL_REQUEST_BYTES / POOL_REPLY_BYTES.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "pool_core.h"

namespace specgen_kv {

enum PoolOp : int64_t { kOpResize = 1, kOpStats = 2 };
constexpr int64_t kNoTarget = INT64_MIN;   // a resize without a target (stats only)
constexpr int kReplyDevices = 8;           // bytes_by_device entries carried (more are summed into the last)
constexpr int kReplyMessage = 240;

struct PoolRequest {
  int64_t op;
  int64_t seq;
  int64_t target_bytes;
};

enum PoolStatus : int64_t { kOk = 0, kTimedOut = 1, kFailed = 2 };

struct PoolReply {
  int64_t seq;
  int64_t status;                   // PoolStatus; message says why when not kOk
  // Counters (PoolCounters, its table's included).
  int64_t capacity_bytes, segments, grows, shrinks, late_misses, inflight;
  int64_t entries, capacity_blocks, pinned, hits, misses, stores, loads, evictions, moves;
  int64_t ndevices;
  int64_t devices[kReplyDevices];
  int64_t device_bytes[kReplyDevices];
  // The resize: when the thread had the request, and the give-back's phases (ReleaseReport).
  double received_s, began_s, ended_s, retire_ms, wait_ms, free_ms;
  int64_t passes, freed_bytes, added_bytes;
  char message[kReplyMessage];
};

static_assert(sizeof(PoolRequest) == 24, "PoolRequest layout");
static_assert(sizeof(PoolReply) == 8 * (2 + 6 + 9 + 1 + 2 * kReplyDevices + 6 + 3) + kReplyMessage, "PoolReply layout");

class PoolServer {
 public:
  // Serves `core` on `fd` (one end of a SOCK_SEQPACKET pair; the server owns and closes it). A
  // shrink waits at most shrink_timeout_s for copies that pin blocks.
  PoolServer(std::shared_ptr<PoolCore> core, int fd, double shrink_timeout_s);
  ~PoolServer();
  PoolServer(const PoolServer&) = delete;
  PoolServer& operator=(const PoolServer&) = delete;

  // Stop serving: the agent sees the socket close and exits. Idempotent.
  void stop();
  int64_t served() const;
  // The last reply sent (all zeros before the first): where a resize's time went, for benchmarks.
  PoolReply last_reply() const;

 private:
  void run();
  PoolReply answer(const PoolRequest& request, double received_s);

  std::shared_ptr<PoolCore> core_;
  int fd_;
  double shrink_timeout_s_;
  std::thread thread_;
  mutable std::mutex mu_;   // served_, last_
  int64_t served_ = 0;
  PoolReply last_{};
};

}  // namespace specgen_kv
