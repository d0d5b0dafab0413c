// The digest's sign of element i: the top bit of splitmix64's output for state seed + (i + 1) * gamma.
// The same function on the host and the device, and in specgen/eval/digest.py's torch fallback, so
// every path gives one digest.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DIGEST_HD __host__ __device__ __forceinline__
#else
#define DIGEST_HD inline
#endif

namespace specgen_digest {

DIGEST_HD uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// +1.0 or -1.0.
DIGEST_HD double sign_of(uint64_t i, uint64_t seed) {
  const uint64_t h = splitmix64(seed + (i + 1) * 0x9E3779B97F4A7C15ULL);
  return (h >> 63) ? -1.0 : 1.0;
}

}  // namespace specgen_digest
