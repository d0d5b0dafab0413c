// Device side of the SM copy: the kernel's argument layout, the tile copy helpers and the launched
// copy kernel. The persistent copier's kernel (persistent_copier.cu) reuses the same helpers, so the
// two paths move a tile the same way.
#pragma once

#include <cuda_runtime.h>

namespace specgen_kv::cuda_ops {

constexpr int kTileBytes = 4096;          // one warp moves one tile at a time
constexpr int kMaxSegments = 128;         // pool segments passed to the kernel by value
constexpr int kMaxBlocksPerLaunch = 2048; // block pairs passed to the kernel by value
constexpr int kMaxThreadsPerCta = 512;    // leaves each thread enough registers for all its loads in flight

struct DevRegion {
  unsigned long long base;
  long long block_stride;
  long long bytes;
  long long slot_offset;
  int tile_start;
  int pad;
};

struct CopyArgs {
  unsigned long long segments[kMaxSegments];
  long long slots_per_segment;
  long long slot_bytes;
  const DevRegion* regions_global;
  int num_regions;
  int tiles_per_block;
  int to_pool;
  int count;
};

template <int NREG>
struct InlineRegions {
  DevRegion r[NREG];
};

template <int CAP>
struct InlinePairs {
  int block[CAP];
  int slot[CAP];
};

// One warp copies n bytes (n <= kTileBytes). With 16-byte alignment each lane issues all of its
// loads before its first store, so kTileBytes / 512 loads per lane are in flight at once; the
// streaming cache hints keep the copied data from evicting the engine's working set from L2.
template <int ALIGN>
__device__ __forceinline__ void copy_tile(char* __restrict__ dst, const char* __restrict__ src, int n, int lane) {
  if constexpr (ALIGN == 16) {
    constexpr int kLoads = kTileBytes / (32 * 16);
    uint4 v[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      int i = (k * 32 + lane) * 16;
      if (i < n) v[k] = __ldcs(reinterpret_cast<const uint4*>(src + i));
    }
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      int i = (k * 32 + lane) * 16;
      if (i < n) __stcs(reinterpret_cast<uint4*>(dst + i), v[k]);
    }
  } else {
    for (int i = lane; i < n; i += 32) dst[i] = src[i];
  }
}

// Region holding a tile of a block: binary search over the regions' first tiles.
template <int NREG, bool GLOBAL_REGIONS>
__device__ __forceinline__ int find_region(const CopyArgs& args, const InlineRegions<NREG>& inline_regions, int tile) {
  int lo = 0, hi = args.num_regions - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    const int start = GLOBAL_REGIONS ? args.regions_global[mid].tile_start : inline_regions.r[mid].tile_start;
    if (start <= tile) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// One warp copies one 4 KiB tile of one block between the engine cache and a pool slot.
template <int ALIGN>
__device__ __forceinline__ void copy_block_tile(const DevRegion& region, int tile, long long block,
                                                unsigned long long segment_base, long long slot_in_segment,
                                                long long slot_bytes, int to_pool, int lane) {
  const long long offset = static_cast<long long>(tile - region.tile_start) * kTileBytes;
  const int n = static_cast<int>(min(static_cast<long long>(kTileBytes), region.bytes - offset));
  char* cache = reinterpret_cast<char*>(region.base) + block * region.block_stride + offset;
  char* pool = reinterpret_cast<char*>(segment_base) + slot_in_segment * slot_bytes + region.slot_offset + offset;
  if (to_pool) {
    copy_tile<ALIGN>(pool, cache, n, lane);
  } else {
    copy_tile<ALIGN>(cache, pool, n, lane);
  }
}

// The parameters are __grid_constant__ so that indexing them with run-time values (block pairs,
// regions, segments) reads the parameter bank in place instead of copying it to local memory first.
//
// Grid-stride over (block pair, tile) work items, one warp per tile: a single block is spread over
// many warps and multiprocessors, and a large batch keeps every multiprocessor busy.
template <int CAP, int NREG, bool GLOBAL_REGIONS, int ALIGN>
__global__ void __launch_bounds__(kMaxThreadsPerCta)
    kv_copy_kernel(const __grid_constant__ CopyArgs args, const __grid_constant__ InlineRegions<NREG> inline_regions,
                   const __grid_constant__ InlinePairs<CAP> pairs) {
  const int lane = threadIdx.x & 31;
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const long long num_warps = (static_cast<long long>(gridDim.x) * blockDim.x) >> 5;
  const long long total = static_cast<long long>(args.count) * args.tiles_per_block;
  for (long long t = warp; t < total; t += num_warps) {
    const int pair = static_cast<int>(t / args.tiles_per_block);
    const int tile = static_cast<int>(t - static_cast<long long>(pair) * args.tiles_per_block);
    const int lo = find_region<NREG, GLOBAL_REGIONS>(args, inline_regions, tile);
    const DevRegion& region = GLOBAL_REGIONS ? args.regions_global[lo] : inline_regions.r[lo];
    const long long slot = pairs.slot[pair];
    const long long segment = slot / args.slots_per_segment;
    copy_block_tile<ALIGN>(region, tile, pairs.block[pair], args.segments[segment], slot - segment * args.slots_per_segment,
                           args.slot_bytes, args.to_pool, lane);
  }
}

// Pool slot -> pool slot, for the blocks a shrink moves out of the segments it gives back: whole
// slots (contiguous in their segment), pairs.block[i] = source slot, pairs.slot[i] = destination slot.
struct MoveArgs {
  unsigned long long segments[kMaxSegments];
  long long slots_per_segment;
  long long slot_bytes;
  int tiles_per_slot;
  int count;
};

template <int CAP, int ALIGN>
__global__ void __launch_bounds__(kMaxThreadsPerCta)
    kv_move_kernel(const __grid_constant__ MoveArgs args, const __grid_constant__ InlinePairs<CAP> pairs) {
  const int lane = threadIdx.x & 31;
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const long long num_warps = (static_cast<long long>(gridDim.x) * blockDim.x) >> 5;
  const long long total = static_cast<long long>(args.count) * args.tiles_per_slot;
  for (long long t = warp; t < total; t += num_warps) {
    const int pair = static_cast<int>(t / args.tiles_per_slot);
    const long long offset = (t - static_cast<long long>(pair) * args.tiles_per_slot) * kTileBytes;
    const int n = static_cast<int>(min(static_cast<long long>(kTileBytes), args.slot_bytes - offset));
    const long long from = pairs.block[pair], to = pairs.slot[pair];
    const long long from_segment = from / args.slots_per_segment, to_segment = to / args.slots_per_segment;
    const char* src = reinterpret_cast<const char*>(args.segments[from_segment]) +
                      (from - from_segment * args.slots_per_segment) * args.slot_bytes + offset;
    char* dst = reinterpret_cast<char*>(args.segments[to_segment]) +
                (to - to_segment * args.slots_per_segment) * args.slot_bytes + offset;
    copy_tile<ALIGN>(dst, src, n, lane);
  }
}

}  // namespace specgen_kv::cuda_ops
