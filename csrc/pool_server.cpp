#include "pool_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <string>

namespace specgen_kv {

namespace {

void fill_counters(const PoolCounters& c, PoolReply& r) {
  r.capacity_bytes = c.capacity_bytes;
  r.segments = c.segments;
  r.grows = c.grows;
  r.shrinks = c.shrinks;
  r.late_misses = c.late_misses;
  r.inflight = c.inflight;
  r.entries = c.table.entries;
  r.capacity_blocks = c.table.capacity;
  r.pinned = c.table.pinned;
  r.hits = c.table.hits;
  r.misses = c.table.misses;
  r.stores = c.table.stores;
  r.loads = c.table.loads;
  r.evictions = c.table.evictions;
  r.moves = c.table.moves;
  r.ndevices = 0;
  for (const auto& [device, bytes] : c.bytes_by_device) {
    if (r.ndevices < kReplyDevices) {
      r.devices[r.ndevices] = device;
      r.device_bytes[r.ndevices] = bytes;
      ++r.ndevices;
    } else {
      r.device_bytes[kReplyDevices - 1] += bytes;
    }
  }
}

void set_message(PoolReply& r, const std::string& text) {
  const size_t n = std::min(text.size(), static_cast<size_t>(kReplyMessage - 1));
  std::memcpy(r.message, text.data(), n);
  r.message[n] = '\0';
}

}  // namespace

PoolServer::PoolServer(std::shared_ptr<PoolCore> core, int fd, double shrink_timeout_s)
    : core_(std::move(core)), fd_(fd), shrink_timeout_s_(shrink_timeout_s) {
  KV_CHECK(core_ != nullptr, "PoolServer: no pool");
  KV_CHECK(fd_ >= 0, "PoolServer: invalid socket fd " + std::to_string(fd_));
  thread_ = std::thread([this] { run(); });
}

PoolServer::~PoolServer() { stop(); }

void PoolServer::stop() {
  if (!thread_.joinable()) return;
  ::shutdown(fd_, SHUT_RDWR);   // the blocked recv returns 0; the agent reads end-of-file
  thread_.join();
  ::close(fd_);
}

int64_t PoolServer::served() const {
  std::lock_guard<std::mutex> lock(mu_);
  return served_;
}

PoolReply PoolServer::last_reply() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

PoolReply PoolServer::answer(const PoolRequest& request, double received_s) {
  PoolReply reply{};
  reply.seq = request.seq;
  reply.received_s = received_s;
  try {
    if (request.op == kOpResize && request.target_bytes != kNoTarget) {
      const int64_t capacity = core_->capacity_bytes();
      const int64_t target = std::max<int64_t>(0, request.target_bytes);
      if (target < capacity) {
        // Give back at least what is asked: never keep more than the target. Lent segments are for
        // their Python owner to close, so only memory this pool allocated is given back here.
        ReleaseReport r = core_->shrink(capacity - target, kAnyDevice, shrink_timeout_s_, true, false);
        reply.began_s = r.began_s;
        reply.ended_s = r.ended_s;
        reply.retire_ms = r.retire_ms;
        reply.wait_ms = r.wait_ms;
        reply.free_ms = r.free_ms;
        reply.passes = r.passes;
        reply.freed_bytes = r.freed_bytes;
        if (r.timed_out) {
          reply.status = kTimedOut;
          set_message(reply, std::to_string(r.busy) + " blocks still had copies in flight after " +
                                 std::to_string(shrink_timeout_s_) + " s (shrink_timeout_s)");
        }
      } else if (target > capacity) {
        reply.began_s = monotonic_s();
        reply.added_bytes = core_->grow(target - capacity, kAnyDevice);
        reply.ended_s = monotonic_s();
      }
    } else if (request.op != kOpResize && request.op != kOpStats) {
      reply.status = kFailed;
      set_message(reply, "unknown request op " + std::to_string(request.op));
    }
  } catch (const std::exception& exc) {
    reply.status = kFailed;
    set_message(reply, exc.what());
  }
  fill_counters(core_->counters(), reply);
  return reply;
}

void PoolServer::run() {
  while (true) {
    PoolRequest request{};
    const ssize_t got = ::recv(fd_, &request, sizeof(request), 0);
    if (got == 0) return;                       // the agent closed its end, or stop()
    if (got < 0) {
      if (errno == EINTR) continue;
      return;
    }
    const double received_s = monotonic_s();
    PoolReply reply{};
    if (got != static_cast<ssize_t>(sizeof(request))) {
      reply.status = kFailed;
      set_message(reply, "request of " + std::to_string(got) + " bytes; expected " + std::to_string(sizeof(request)));
    } else {
      reply = answer(request, received_s);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++served_;
      last_ = reply;
    }
    if (::send(fd_, &reply, sizeof(reply), MSG_NOSIGNAL) < 0) return;
  }
}

}  // namespace specgen_kv
