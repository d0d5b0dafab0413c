// Device memory one process allocates and another maps, shared by a file descriptor (CUDA's virtual
// memory management with POSIX file-descriptor handles). The evaluation's trusted reference runner
// allocates the buffers a candidate's call reads its inputs from and writes its outputs to, and
// passes the descriptor over its Unix socket; the candidate's runner maps it. Legacy CUDA IPC handles
// (cudaIpcGetMemHandle) cannot cross PID namespaces, and every runner has a PID namespace of its own;
// a descriptor crosses any boundary a socket does. specgen/eval/arena.py owns the documentation.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace specgen_arena {

struct ArenaError : std::runtime_error {
  explicit ArenaError(const std::string& what) : std::runtime_error(what) {}
};

struct Mapping {
  int fd;           // the exported descriptor (create), or -1 (open: the caller keeps its own)
  uint64_t ptr;     // device address in this process
  uint64_t size;    // bytes mapped (the request rounded up to the allocation granularity)
};

// Allocates at least `nbytes` on `device`, maps it here read-write and exports a descriptor.
Mapping create(int device, uint64_t nbytes);
// Maps the allocation behind `fd` (of `size` bytes, as create returned) on `device` here.
Mapping open(int device, int fd, uint64_t size);
// Unmaps a mapping of create or open and releases its handle.
void close(int device, uint64_t ptr, uint64_t size);
bool cuda_compiled();

}  // namespace specgen_arena
