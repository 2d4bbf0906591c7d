// Paged K / V caches through TMA (host and device): page and box arithmetic, the layout
// test that decides TMA against a cp.async gather (the one place for every Hopper
// kernel), and the tensor maps.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/problem.h"
#include "cuda/hopper/kv_boxes.h"
#include "cuda/hopper/tensor_map.h"
#include "pagedmha/variant.h"  // PAGEDMHA_HD

namespace pagedmha::cuda::sm90 {

/// Key positions of a request to page-table columns and rows in their page, and to TMA
/// boxes of box_rows keys (a power of two that divides the page size and the tile:
/// kv_tma_ok). Shifts where the page size is a power of two (every TMA layout up to a
/// page of one tile, and the usual page sizes): the producer maps rows and boxes to pages
/// for every tile, and a 32-bit division is a chain of ~20 dependent instructions (with
/// them the producer warps were the kernel's limit: docs/perf-notes/prefill-sm90.md).
struct PageGeometry {
  int page_size, page_shift;  // page_shift: log2(page_size), -1 when not a power of two
  int box_rows, box_shift;    // TMA boxes (box_rows 0 on the gather path)

  static PageGeometry make(int page_size, int box_rows) {
    PageGeometry g{page_size, log2_exact(page_size), box_rows, box_rows > 0 ? log2_exact(box_rows) : 0};
    return g;
  }
  static int log2_exact(int x) {
    int k = 0;
    while ((1 << k) < x) ++k;
    return (1 << k) == x ? k : -1;
  }
  __device__ __forceinline__ int col(int pos) const { return page_shift >= 0 ? pos >> page_shift : pos / page_size; }
  __device__ __forceinline__ int row(int pos) const {
    return page_shift >= 0 ? pos & (page_size - 1) : pos % page_size;
  }
  /// The box holding key `pos`, and the first key of box u.
  __device__ __forceinline__ int box(int pos) const { return pos >> box_shift; }
  __device__ __forceinline__ int box_key(int u) const { return u << box_shift; }
};

/// Whether K / V tiles can be loaded with TMA boxes of kv_box_rows rows: a page size the
/// box rule allows (kv_boxes.h kv_box_layout_ok), 16-byte aligned base and strides, and
/// coordinates that fit the tensor map's 32-bit dims. Otherwise the producer gathers rows
/// with cp.async.
inline bool kv_tma_ok(int page_size, int block_n, const void* k, const void* v, int64_t page_stride_bytes_k,
                      int64_t token_stride_bytes_k, int64_t head_stride_bytes_k, int64_t page_stride_bytes_v,
                      int64_t token_stride_bytes_v, int64_t head_stride_bytes_v, int64_t num_pages) {
  if (!kv_box_layout_ok(page_size, block_n)) return false;
  const auto a16 = [](int64_t x) { return x > 0 && x % 16 == 0 && x < (int64_t{1} << 40); };
  if (!a16(page_stride_bytes_k) || !a16(token_stride_bytes_k) || !a16(head_stride_bytes_k)) return false;
  if (!a16(page_stride_bytes_v) || !a16(token_stride_bytes_v) || !a16(head_stride_bytes_v)) return false;
  if (reinterpret_cast<uintptr_t>(k) % 16 != 0 || reinterpret_cast<uintptr_t>(v) % 16 != 0) return false;
  return num_pages > 0 && num_pages < (int64_t{1} << 31);
}

template <class T>
constexpr CUtensorMapDataType tensor_map_dtype() {
  return std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

/// K / V tensor maps: [pages][page_size][Hkv][D] with boxes of [kv_box_rows][64] of one
/// head (16-bit, 128-byte swizzle) or [kv_box_rows][D] bytes (fp8: unswizzled, or with
/// fp8_swizzled the swizzle of the raw tiles' fragment reads, common/paged_loader.cuh
/// swizzle_rows: 128-byte rows at D = 128, 64-byte rows at D = 64). `geo` is set either
/// way. With item_heads = n > 1 a row is n adjacent heads' rows, n D elements (the
/// decode's items of two KV heads, decode_sm90/policy.h kItemHeads): the head
/// coordinate counts groups of n, and the cache's heads must be adjacent (head stride D)
/// and a multiple of n. False when the layout does not allow TMA or the driver refuses
/// the maps.
template <int D, class T, bool kFp8>
bool kv_tensor_maps(const detail::KvCacheDesc& kv, int block_n, CUtensorMap& tm_k, CUtensorMap& tm_v,
                    PageGeometry& geo, bool fp8_swizzled = false, int item_heads = 1) {
  const int64_t es = kFp8 ? 1 : 2;
  geo = PageGeometry::make(kv.page_size, kv_box_rows(kv.page_size, block_n));
  if (!kv_heads_adjacent(kv.num_kv_heads, kv.k.head_stride, kv.v.head_stride, D, item_heads)) return false;
  const int row = D * item_heads;  // elements of a box row
  if (!kv_tma_ok(kv.page_size, block_n, kv.k.data, kv.v.data, kv.k.page_stride * es, kv.k.token_stride * es,
                 kv.k.head_stride * es, kv.v.page_stride * es, kv.v.token_stride * es, kv.v.head_stride * es,
                 kv.num_pages)) {
    return false;
  }
  CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  if (kFp8) {
    swizzle = !fp8_swizzled ? CU_TENSOR_MAP_SWIZZLE_NONE
              : row == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
              : row == 64   ? CU_TENSOR_MAP_SWIZZLE_64B
                            : CU_TENSOR_MAP_SWIZZLE_NONE;
    if (fp8_swizzled && swizzle == CU_TENSOR_MAP_SWIZZLE_NONE) return false;  // rows wider than a swizzle span
  }
  const uint64_t dims[4] = {uint64_t(row), uint64_t(kv.num_kv_heads / item_heads), uint64_t(kv.page_size),
                            uint64_t(kv.num_pages)};
  const uint32_t box[4] = {kFp8 ? uint32_t(row) : 64u, 1, uint32_t(geo.box_rows), 1};
  const uint64_t ks[3] = {uint64_t(kv.k.head_stride * item_heads * es), uint64_t(kv.k.token_stride * es),
                          uint64_t(kv.k.page_stride * es)};
  const uint64_t vs[3] = {uint64_t(kv.v.head_stride * item_heads * es), uint64_t(kv.v.token_stride * es),
                          uint64_t(kv.v.page_stride * es)};
  const CUtensorMapDataType dt = kFp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : tensor_map_dtype<T>();
  return encode_tensor_map(&tm_k, dt, 4, kv.k.data, dims, ks, box, swizzle) &&
         encode_tensor_map(&tm_v, dt, 4, kv.v.data, dims, vs, box, swizzle);
}

}  // namespace pagedmha::cuda::sm90
