// Launch helpers of the small elementwise kernel families (kvcache/, metadata/, debug/).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/launch.cuh"  // DeviceGuard

namespace pagedmha::cuda {

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

/// 64-bit ceil(a / b), usable on the device.
__host__ __device__ __forceinline__ int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Blocks for a grid-stride loop over `work` items: enough to fill the device several
/// times over, never more than the work needs. Depends only on `work` (a host size),
/// so a captured graph replays with the same grid.
inline unsigned grid_stride_blocks(int64_t work, int threads) {
  constexpr int64_t kMaxBlocks = 65536;  // 8+ waves of 256-thread blocks on 132 SMs
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(div_up(work, threads), kMaxBlocks)));
}

}  // namespace pagedmha::cuda
