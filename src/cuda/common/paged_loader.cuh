// Copies tiles of BN consecutive key positions of one KV head from a paged cache into
// shared memory with 16-byte cp.async. Each token is addressed through the page table:
// page_table[pos / P] * page_stride + (pos % P) * token_stride (64-bit), so any page
// size and NHD / HND / interleaved layouts work. Positions outside [lo, hi) are
// zero-filled without touching the page table or the cache. Tiles land swizzled in the
// cache's own dtype: fp8 stays fp8 in shared memory (half the bytes per stage) and the
// mainloop converts fragments in registers (fp8_fragments.cuh).
#pragma once

#include <cstdint>

#include "cuda/common/attention_args.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"

namespace pagedmha::cuda {

/// Byte offset of 16-byte chunk c of row r in a swizzled [rows][kChunks] tile: the chunk
/// index is XORed with r % 8 so that ldmatrix's 8 row addresses (and the copies) hit 8
/// distinct bank groups. Needs kChunks >= 8.
template <int kChunks>
__device__ __forceinline__ uint32_t swizzle(int r, int c) {
  return static_cast<uint32_t>((r * kChunks + (c ^ (r & 7))) * 16);
}

/// The same for rows of any 16-byte multiple >= 64 bytes (raw KV tiles: fp8 rows of
/// D = 64 are 4 chunks): with 4 chunks, two rows share a 128-byte line and the XOR uses
/// the row pair index, so 8 consecutive rows at one chunk still hit 8 bank groups.
template <int kChunks>
__device__ __forceinline__ uint32_t swizzle_rows(int r, int c) {
  static_assert(kChunks >= 8 || kChunks == 4, "row size");
  if constexpr (kChunks >= 8) {
    return swizzle<kChunks>(r, c);
  } else {
    return static_cast<uint32_t>((r * 4 + (c ^ ((r >> 1) & 3))) * 16);
  }
}

template <int D, class KV, int BN, int kThreads>
struct PagedTileLoader {
  static constexpr bool kFp8 = sizeof(KV) == 1;
  static constexpr int kRawChunks = D * static_cast<int>(sizeof(KV)) / 16;  // per token row
  static constexpr int kRowsPerPass = kThreads / kRawChunks;
  static constexpr int kRows = BN / kRowsPerPass;  // token rows each thread copies (K and V each)
  static constexpr int kTileBytes = BN * D * static_cast<int>(sizeof(KV));
  static_assert(kThreads % kRawChunks == 0 && BN % kRowsPerPass == 0, "tile split");

  const AttentionArgs& args;  // strides read from the kernel parameters: no registers held
  const char* k;
  const char* v;
  const int32_t* pages;
  int lo, hi;
  int chunk, row0;
  int page[kRows], tok[kRows];

  __device__ PagedTileLoader(const AttentionArgs& a, int kv_head, const int32_t* page_row, int key_lo, int key_hi)
      : args(a), pages(page_row), lo(key_lo), hi(key_hi) {
    constexpr int64_t es = sizeof(KV);
    chunk = threadIdx.x % kRawChunks;
    row0 = threadIdx.x / kRawChunks;
    k = static_cast<const char*>(a.k) + kv_head * a.k_head_stride * es + chunk * 16;
    v = static_cast<const char*>(a.v) + kv_head * a.v_head_stride * es + chunk * 16;
  }

  __device__ __forceinline__ bool in_range(int pos) const { return pos >= lo && pos < hi; }

  /// Loads the page ids of `tile` into registers (issued early to hide their latency).
  /// One division per tile: the thread's rows step by kRowsPerPass, so (col, tok) advance
  /// by subtraction (one step when page_size >= kRowsPerPass).
  __device__ __forceinline__ void fetch_pages(int tile) {
    const int page_size = args.page_size;
    int pos = tile * BN + row0;
    int col = pos / page_size;
    int tk = pos - col * page_size;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      page[i] = 0;
      tok[i] = 0;
      if (in_range(pos)) {
        page[i] = __ldg(pages + col);
        tok[i] = tk;
      }
      pos += kRowsPerPass;
      tk += kRowsPerPass;
      while (tk >= page_size) {
        tk -= page_size;
        ++col;
      }
    }
  }

  /// Starts the copies of `tile` (after fetch_pages(tile)) into K then V at `dst`.
  __device__ __forceinline__ void issue(int tile, char* dst) const {
    constexpr int64_t es = sizeof(KV);
    const uint32_t base = smem_addr(dst);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = row0 + i * kRowsPerPass;
      const bool valid = in_range(tile * BN + r);
      const uint32_t off = swizzle_rows<kRawChunks>(r, chunk);
      const int64_t p = page[i], t = tok[i];
      cp_async_16(base + off, k + (p * args.k_page_stride + t * args.k_token_stride) * es, valid);
      cp_async_16(base + kTileBytes + off, v + (p * args.v_page_stride + t * args.v_token_stride) * es, valid);
    }
  }
};

}  // namespace pagedmha::cuda
