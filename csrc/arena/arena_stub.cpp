// arena.h for a build without nvcc: refused with a clear error (the CPU's arena is a memfd).
#include "arena.h"

namespace specgen_arena {

static const char* kNoCuda =
    "this build of specgen's arena extension has no CUDA support (nvcc was not found when it was built; "
    "install the CUDA toolkit and reinstall specgen)";

Mapping create(int, uint64_t) { throw ArenaError(kNoCuda); }
Mapping open(int, int, uint64_t) { throw ArenaError(kNoCuda); }
void close(int, uint64_t, uint64_t) { throw ArenaError(kNoCuda); }
bool cuda_compiled() { return false; }

}  // namespace specgen_arena
