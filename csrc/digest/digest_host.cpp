// The digest of host memory: one loop, double accumulation (csrc/digest/digest.h).
#include <cstring>

#include "digest.h"
#include "sign_hash.h"

namespace specgen_digest {
namespace {

// Half and bfloat16 to float, exactly (both are prefixes of wider formats).
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1Fu) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // zero
  } else {         // subnormal: normalize
    exponent = 113u;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

template <typename T, typename Load>
double sum_signed(const T* x, int64_t n, uint64_t seed, Load load) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(load(x[i])) * sign_of(static_cast<uint64_t>(i), seed);
  return total;
}

}  // namespace

double host_digest(uint64_t data, int64_t n, DType dtype, uint64_t seed) {
  DIGEST_CHECK(n >= 0, "host_digest: negative element count");
  DIGEST_CHECK(n == 0 || data != 0, "host_digest: null data pointer");
  switch (dtype) {
    case DType::F32:
      return sum_signed(reinterpret_cast<const float*>(data), n, seed, [](float v) { return v; });
    case DType::F64:
      return sum_signed(reinterpret_cast<const double*>(data), n, seed, [](double v) { return v; });
    case DType::F16:
      return sum_signed(reinterpret_cast<const uint16_t*>(data), n, seed, half_to_float);
    case DType::BF16:
      return sum_signed(reinterpret_cast<const uint16_t*>(data), n, seed, bf16_to_float);
  }
  throw DigestError("host_digest: unknown dtype", __FILE__, __LINE__);
}

}  // namespace specgen_digest
