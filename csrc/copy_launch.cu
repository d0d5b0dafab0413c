// Host side of the copy paths: the device layout the SM kernel reads, the kernel's launch
// configuration, and the copy-engine paths (batched, per piece, one bulk peer copy).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "copy_kernels.cuh"
#include "cuda_common.cuh"
#include "cuda_ops.h"

namespace specgen_kv::cuda_ops {
namespace {

template <int CAP, int NREG, bool GLOBAL_REGIONS, int ALIGN>
void launch_one(const CopyArgs& args, const DeviceLayout& layout, const int32_t* blocks, const int32_t* slots,
                int count, cudaStream_t stream, const KernelConfig& config) {
  InlineRegions<NREG> regions{};
  if constexpr (!GLOBAL_REGIONS) {
    for (size_t r = 0; r < layout.regions.size(); ++r) {
      const Region& src = layout.regions[r];
      regions.r[r] = DevRegion{src.base, src.block_stride, src.bytes, src.slot_offset, layout.tile_start[r], 0};
    }
  }
  InlinePairs<CAP> pairs;
  std::copy(blocks, blocks + count, pairs.block);
  std::copy(slots, slots + count, pairs.slot);
  CopyArgs a = args;
  a.count = count;
  const long long tiles = static_cast<long long>(count) * layout.tiles_per_block;
  const int warps_per_cta = std::max(1, std::min(kMaxThreadsPerCta / 32, config.warps_per_cta));
  const long long wanted = (tiles + warps_per_cta - 1) / warps_per_cta;
  const long long limit = static_cast<long long>(sm_count_cached(layout.device)) * std::max(1, config.ctas_per_sm);
  const int ctas = static_cast<int>(std::max(1LL, std::min(wanted, limit)));
  kv_copy_kernel<CAP, NREG, GLOBAL_REGIONS, ALIGN><<<ctas, warps_per_cta * 32, 0, stream>>>(a, regions, pairs);
  CUDA_CHECK(cudaGetLastError());
}

template <int CAP, int ALIGN>
void launch_with_regions(const CopyArgs& args, const DeviceLayout& layout, const int32_t* blocks, const int32_t* slots,
                         int count, cudaStream_t stream, const KernelConfig& config) {
  const size_t nreg = layout.regions.size();
  if (nreg <= 4) {
    launch_one<CAP, 4, false, ALIGN>(args, layout, blocks, slots, count, stream, config);
  } else if (nreg <= 64) {
    launch_one<CAP, 64, false, ALIGN>(args, layout, blocks, slots, count, stream, config);
  } else {
    launch_one<CAP, 1, true, ALIGN>(args, layout, blocks, slots, count, stream, config);
  }
}

template <int ALIGN>
void launch_sized(const CopyArgs& args, const DeviceLayout& layout, const int32_t* blocks, const int32_t* slots,
                  int count, cudaStream_t stream, const KernelConfig& config) {
  // The smallest parameter block that holds the batch: less to copy into every launch.
  if (count <= 16) {
    launch_with_regions<16, ALIGN>(args, layout, blocks, slots, count, stream, config);
  } else if (count <= 256) {
    launch_with_regions<256, ALIGN>(args, layout, blocks, slots, count, stream, config);
  } else {
    launch_with_regions<kMaxBlocksPerLaunch, ALIGN>(args, layout, blocks, slots, count, stream, config);
  }
}

template <int CAP, int ALIGN>
void launch_moves(const MoveArgs& args, int device, const int32_t* from, const int32_t* to, int count,
                  cudaStream_t stream, const KernelConfig& config) {
  InlinePairs<CAP> pairs;
  std::copy(from, from + count, pairs.block);
  std::copy(to, to + count, pairs.slot);
  MoveArgs a = args;
  a.count = count;
  const long long tiles = static_cast<long long>(count) * a.tiles_per_slot;
  const int warps_per_cta = std::max(1, std::min(kMaxThreadsPerCta / 32, config.warps_per_cta));
  const long long wanted = (tiles + warps_per_cta - 1) / warps_per_cta;
  const long long limit = static_cast<long long>(sm_count_cached(device)) * std::max(1, config.ctas_per_sm);
  const int ctas = static_cast<int>(std::max(1LL, std::min(wanted, limit)));
  kv_move_kernel<CAP, ALIGN><<<ctas, warps_per_cta * 32, 0, stream>>>(a, pairs);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

DeviceLayout make_device_layout(int device, const std::vector<Region>& regions) {
  check_device(device);
  DeviceLayout layout;
  layout.device = device;
  layout.regions = regions;
  bool aligned = true;
  int32_t tiles = 0;
  for (const Region& r : regions) {
    KV_CHECK(r.bytes > 0 && r.bytes < (int64_t{1} << 31), "a block region must hold 1 byte to 2 GiB, got " +
                                                               std::to_string(r.bytes));
    layout.tile_start.push_back(tiles);
    tiles += static_cast<int32_t>((r.bytes + kTileBytes - 1) / kTileBytes);
    aligned = aligned && r.base % 16 == 0 && r.block_stride % 16 == 0 && r.bytes % 16 == 0 && r.slot_offset % 16 == 0;
  }
  layout.tiles_per_block = tiles;
  layout.alignment = aligned ? 16 : 1;
  if (regions.size() > 64) {
    std::vector<DevRegion> table;
    for (size_t r = 0; r < regions.size(); ++r) {
      const Region& src = regions[r];
      table.push_back(DevRegion{src.base, src.block_stride, src.bytes, src.slot_offset, layout.tile_start[r], 0});
    }
    DeviceGuard guard(device);
    void* ptr = nullptr;
    CUDA_CHECK(cudaMalloc(&ptr, table.size() * sizeof(DevRegion)));
    layout.regions_on_device = reinterpret_cast<uint64_t>(ptr);
    CUDA_CHECK(cudaMemcpy(ptr, table.data(), table.size() * sizeof(DevRegion), cudaMemcpyHostToDevice));
  }
  return layout;
}

void free_device_layout(DeviceLayout& layout) {
  if (layout.regions_on_device != 0) {
    DeviceGuard guard(layout.device);
    (void)cudaFree(reinterpret_cast<void*>(layout.regions_on_device));
    layout.regions_on_device = 0;
  }
}

void launch_kernel_copy(const DeviceLayout& layout, const std::vector<uint64_t>& segments, int64_t slots_per_segment,
                        int64_t slot_bytes, bool to_pool, const int32_t* blocks, const int32_t* slots, int64_t n,
                        uint64_t stream, const KernelConfig& config) {
  KV_CHECK(segments.size() <= static_cast<size_t>(kMaxSegments),
           "the SM copy kernel takes at most " + std::to_string(kMaxSegments) + " pool segments, got " +
               std::to_string(segments.size()));
  if (n == 0) return;
  CopyArgs args{};
  bool aligned = layout.alignment == 16 && slot_bytes % 16 == 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    args.segments[s] = segments[s];
    aligned = aligned && segments[s] % 16 == 0;
  }
  args.slots_per_segment = slots_per_segment;
  args.slot_bytes = slot_bytes;
  args.regions_global = reinterpret_cast<const DevRegion*>(layout.regions_on_device);
  args.num_regions = static_cast<int>(layout.regions.size());
  args.tiles_per_block = layout.tiles_per_block;
  args.to_pool = to_pool ? 1 : 0;
  DeviceGuard guard(layout.device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  for (int64_t start = 0; start < n; start += kMaxBlocksPerLaunch) {
    const int count = static_cast<int>(std::min<int64_t>(kMaxBlocksPerLaunch, n - start));
    if (aligned) {
      launch_sized<16>(args, layout, blocks + start, slots + start, count, s, config);
    } else {
      launch_sized<1>(args, layout, blocks + start, slots + start, count, s, config);
    }
  }
}

void memcpy_each(int device, const std::vector<uint64_t>& dsts, const std::vector<int>& dst_devices,
                 const std::vector<uint64_t>& srcs, const std::vector<int>& src_devices,
                 const std::vector<uint64_t>& sizes, uint64_t stream) {
  DeviceGuard guard(device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  for (size_t i = 0; i < dsts.size(); ++i) {
    void* dst = reinterpret_cast<void*>(dsts[i]);
    const void* src = reinterpret_cast<const void*>(srcs[i]);
    if (dst_devices[i] >= 0 && src_devices[i] >= 0 && dst_devices[i] != src_devices[i]) {
      CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_devices[i], src, src_devices[i], sizes[i], s));
    } else {
      CUDA_CHECK(cudaMemcpyAsync(dst, src, sizes[i], cudaMemcpyDefault, s));
    }
  }
}

void batch_copy(int device, const std::vector<uint64_t>& dsts, const std::vector<uint64_t>& srcs,
                const std::vector<uint64_t>& sizes, uint64_t stream) {
  if (dsts.empty()) return;
#if CUDART_VERSION >= 12080
  // The batched call refuses the legacy default stream; there the per-piece loop is the only way.
  if (stream != 0) {
    DeviceGuard guard(device);
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;
    std::vector<void*> dst_ptrs(dsts.size());
    std::vector<const void*> src_ptrs(srcs.size());
    std::vector<size_t> byte_counts(sizes.size());
    for (size_t i = 0; i < dsts.size(); ++i) {
      dst_ptrs[i] = reinterpret_cast<void*>(dsts[i]);
      src_ptrs[i] = reinterpret_cast<const void*>(srcs[i]);
      byte_counts[i] = static_cast<size_t>(sizes[i]);
    }
#if CUDART_VERSION >= 13000
    CUDA_CHECK(cudaMemcpyBatchAsync(dst_ptrs.data(), src_ptrs.data(), byte_counts.data(), dsts.size(), &attr,
                                    &attr_index, 1, reinterpret_cast<cudaStream_t>(stream)));
#else
    size_t fail_index = 0;
    CUDA_CHECK(cudaMemcpyBatchAsync(dst_ptrs.data(), const_cast<void**>(src_ptrs.data()), byte_counts.data(),
                                    dsts.size(), &attr, &attr_index, 1, &fail_index,
                                    reinterpret_cast<cudaStream_t>(stream)));
#endif
    return;
  }
#endif
  std::vector<int> unknown(dsts.size(), -1);
  memcpy_each(device, dsts, unknown, srcs, unknown, sizes, stream);
}

void memcpy_peer(uint64_t dst, int dst_device, uint64_t src, int src_device, int64_t bytes, uint64_t stream) {
  check_device(dst_device);
  check_device(src_device);
  DeviceGuard guard(src_device);
  CUDA_CHECK(cudaMemcpyPeerAsync(reinterpret_cast<void*>(dst), dst_device, reinterpret_cast<const void*>(src),
                                 src_device, static_cast<size_t>(bytes), reinterpret_cast<cudaStream_t>(stream)));
}

void launch_slot_moves(int device, const std::vector<uint64_t>& segments, int64_t slots_per_segment,
                       int64_t slot_bytes, const int32_t* from, const int32_t* to, int64_t n, uint64_t stream,
                       const KernelConfig& config) {
  KV_CHECK(segments.size() <= static_cast<size_t>(kMaxSegments),
           "the SM move kernel takes at most " + std::to_string(kMaxSegments) + " pool segments, got " +
               std::to_string(segments.size()));
  if (n == 0) return;
  MoveArgs args{};
  bool aligned = slot_bytes % 16 == 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    args.segments[s] = segments[s];
    aligned = aligned && segments[s] % 16 == 0;
  }
  args.slots_per_segment = slots_per_segment;
  args.slot_bytes = slot_bytes;
  args.tiles_per_slot = static_cast<int>((slot_bytes + kTileBytes - 1) / kTileBytes);
  DeviceGuard guard(device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  for (int64_t start = 0; start < n; start += kMaxBlocksPerLaunch) {
    const int count = static_cast<int>(std::min<int64_t>(kMaxBlocksPerLaunch, n - start));
    if (aligned) {
      launch_moves<kMaxBlocksPerLaunch, 16>(args, device, from + start, to + start, count, s, config);
    } else {
      launch_moves<kMaxBlocksPerLaunch, 1>(args, device, from + start, to + start, count, s, config);
    }
  }
}

}  // namespace specgen_kv::cuda_ops
