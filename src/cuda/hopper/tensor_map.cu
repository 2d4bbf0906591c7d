#include "cuda/hopper/tensor_map.h"

#include <cuda_runtime.h>

// Experiment knob: the L2 promotion of every tensor map's loads, in bytes (0: none; 64,
// 128 the default, 256). For fp8 D = 64 decode (64-byte rows, two KV heads per line) 64
// bytes was -12% at gpt-oss 128 x 32k and +17% at 64 x 4k (H100, 2026-12-06:
// docs/perf-notes/decode-fp8.md, last section); 256 slower on most shapes.
#ifndef PAGEDMHA_TMA_L2_PROMOTION
#define PAGEDMHA_TMA_L2_PROMOTION 128
#endif

namespace pagedmha::cuda::sm90 {
namespace {

constexpr CUtensorMapL2promotion kL2Promotion = PAGEDMHA_TMA_L2_PROMOTION == 0    ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                                                : PAGEDMHA_TMA_L2_PROMOTION == 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                                                : PAGEDMHA_TMA_L2_PROMOTION == 256 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                                                                                   : CU_TENSOR_MAP_L2_PROMOTION_L2_128B;

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // not sticky; clear it
      return static_cast<EncodeTiled>(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

}  // namespace

bool encode_tensor_map(CUtensorMap* map, CUtensorMapDataType dtype, int rank, const void* base, const uint64_t* dims,
                       const uint64_t* strides_bytes, const uint32_t* box, CUtensorMapSwizzle swizzle) {
  const EncodeTiled fn = encoder();
  if (fn == nullptr) return false;
  cuuint64_t d[5], st[4];
  cuuint32_t b[5], es[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    es[i] = 1;
    if (i + 1 < rank) st[i] = strides_bytes[i];
  }
  return fn(map, dtype, static_cast<cuuint32_t>(rank), const_cast<void*>(base), d, st, b, es,
            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
            kL2Promotion,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace pagedmha::cuda::sm90
