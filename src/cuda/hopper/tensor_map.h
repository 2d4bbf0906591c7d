// Host: TMA tensor maps through the driver's cuTensorMapEncodeTiled, reached with
// cudaGetDriverEntryPointByVersion (no link-time dependency on libcuda).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace pagedmha::cuda::sm90 {

/// A tiled tensor map of `rank` dims (dims[0] contiguous; strides_bytes[i] is the stride
/// of dims[i + 1]) with boxes of `box` elements, the given swizzle (the box's inner
/// dimension at most the swizzle's span in bytes), zero fill outside. Returns false (never throws) when the driver refuses it: the caller then
/// loads with cp.async instead.
bool encode_tensor_map(CUtensorMap* map, CUtensorMapDataType dtype, int rank, const void* base, const uint64_t* dims,
                       const uint64_t* strides_bytes, const uint32_t* box,
                       CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B);

}  // namespace pagedmha::cuda::sm90
