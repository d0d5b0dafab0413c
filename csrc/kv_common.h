// Shared definitions of the KV-block transfer extension: the error type every failure becomes, and
// the description of where one KV block lives in the engine's cache and in a pool slot.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace specgen_kv {

// Every failure in the extension is a KvError whose message starts with "file:line:", so a Python
// traceback names the C++ or CUDA call that failed, not only the binding that called it.
class KvError : public std::runtime_error {
 public:
  KvError(const std::string& what, const char* file, int line)
      : std::runtime_error(short_path(file) + ":" + std::to_string(line) + ": " + what) {}

 private:
  // __FILE__ is an absolute build path; keep it from the source folder on so messages stay short.
  static std::string short_path(const char* file) {
    std::string path(file);
    for (const char* root : {"csrc/", "bindings/"}) {
      auto pos = path.rfind(root);
      if (pos != std::string::npos) return path.substr(pos);
    }
    return path;
  }
};

// One contiguous piece of a KV block: for engine block b it starts at base + b * block_stride in the
// engine's cache and at slot_offset inside a pool slot. A block is one or more regions (a layer's page,
// or a layer's K and V halves when they live in separate places).
struct Region {
  uint64_t base = 0;          // address of block 0's piece in the engine's cache
  int64_t block_stride = 0;   // bytes between consecutive blocks' pieces
  int64_t bytes = 0;          // size of the piece
  int64_t slot_offset = 0;    // where the piece goes inside a pool slot
};

// How a copy is carried out. Auto picks the SM kernel for small pieces and the copy engines for large ones;
// Persistent (opt-in, see Transfer::start_persistent) hands a few blocks to an already running CTA.
enum class Method : int { Auto = 0, Kernel = 1, Batch = 2, Memcpy = 3, Persistent = 4 };

}  // namespace specgen_kv

#define KV_CHECK(cond, msg)                                                  \
  do {                                                                       \
    if (!(cond)) throw ::specgen_kv::KvError((msg), __FILE__, __LINE__);     \
  } while (0)
