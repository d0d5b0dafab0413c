// The output digest of the evaluation (specgen/eval/digest.py): sum over a tensor's elements of
// x_i * s_i in double, where s_i = +1 or -1 is a hash of (i, seed). One pass over the tensor, no
// weight tensor written or read, on the host or on a CUDA device. The API is free of CUDA headers so
// the bindings and a build without nvcc compile without them.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace specgen_digest {

// Element types the digest reads natively; anything else is converted by the caller.
enum class DType : int { F32 = 0, F64 = 1, F16 = 2, BF16 = 3 };

// Every failure is a DigestError whose message starts with "file:line:".
class DigestError : public std::runtime_error {
 public:
  DigestError(const std::string& what, const char* file, int line)
      : std::runtime_error(short_path(file) + ":" + std::to_string(line) + ": " + what) {}

 private:
  static std::string short_path(const char* file) {
    std::string path(file);
    for (const char* root : {"csrc/", "bindings/"}) {
      auto pos = path.rfind(root);
      if (pos != std::string::npos) return path.substr(pos);
    }
    return path;
  }
};

// The digest of n elements at host address `data`.
double host_digest(uint64_t data, int64_t n, DType dtype, uint64_t seed);

// Adds the digest of n elements at address `data` of CUDA device `device` into the double at `out` on
// the same device, queued on `stream` (a cudaStream_t as an integer; 0 is the legacy default stream).
// Nothing waits; the caller's current device is left as it was.
void device_digest(int device, uint64_t data, int64_t n, DType dtype, uint64_t seed, uint64_t out,
                   uint64_t stream);

// True when this build carries the CUDA path.
bool cuda_compiled();

}  // namespace specgen_digest

#define DIGEST_CHECK(cond, msg)                                                        \
  do {                                                                                 \
    if (!(cond)) throw ::specgen_digest::DigestError((msg), __FILE__, __LINE__);       \
  } while (0)
