// digest.h's device path for a build without nvcc: refused with a clear error (the host path serves).
#include "digest.h"

namespace specgen_digest {

void device_digest(int, uint64_t, int64_t, DType, uint64_t, uint64_t, uint64_t) {
  throw DigestError("device_digest: this build of specgen's digest extension has no CUDA support (nvcc was not "
                    "found when it was built; install the CUDA toolkit and reinstall specgen)",
                    __FILE__, __LINE__);
}

bool cuda_compiled() { return false; }

}  // namespace specgen_digest
