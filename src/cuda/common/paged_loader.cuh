// Copies tiles of BN consecutive key positions of one KV head from a paged cache into
// shared memory with 16-byte cp.async. Each token is addressed through the page table:
// page_table[pos / P] * page_stride + (pos % P) * token_stride (64-bit), so any page
// size and NHD / HND / interleaved layouts work. Each warp copies a run of BN / 4
// consecutive keys per tile (4 to 32 keys by configuration). When the page size is a
// multiple of the run, or a 32-key run spans two 16-token pages, the warp looks each page
// up once per tile and steps its row addresses by additions; other page sizes (1, 3, 8
// with 16-key runs, 48, ...) take one page id per row. Positions outside [lo, hi) are
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
  static constexpr int kWarps = kThreads / 32;
  // Each warp copies one run of kRun consecutive keys per tile, kRowsPerPass rows per pass
  // (a pass is 512 contiguous-per-row bytes: coalesced within each token row).
  static constexpr int kRun = BN / kWarps;
  static constexpr int kRowsPerPass = 32 / kRawChunks;
  static constexpr int kRows = kRun / kRowsPerPass;  // token rows each thread copies (K and V each)
  static constexpr int kTileBytes = BN * D * static_cast<int>(sizeof(KV));
  static_assert(kRawChunks <= 32 && 32 % kRawChunks == 0, "a token row within one warp pass");
  static_assert(BN % kWarps == 0 && kRun % kRowsPerPass == 0 && BN <= 0xffff, "tile split");

  const AttentionArgs& args;  // strides read from the kernel parameters: no registers held
  const char* k;
  const char* v;
  const int32_t* pages;
  int lo, hi;
  int chunk, row0;  // the thread's 16-byte chunk and first row within the tile
  // Run path: a warp's run lies in one page (page_size % kRun == 0) or in kRunPages
  // whole pages (kRun % page_size == 0, page_size a multiple of kRowsPerPass: 16 for the
  // 32-key runs). The page column and in-page token of the run's first key for the next
  // tile are advanced by addition.
  static constexpr int kRunPages = kRun >= 32 ? kRun / 16 : 1;
  int col, tk;
  // Per tile: (BN / P) << 16 | BN % P (both <= BN), -1 on the general path: one register.
  int adv;
  int run_page[kRunPages];

  __device__ PagedTileLoader(const AttentionArgs& a, int kv_head, const int32_t* page_row, int key_lo, int key_hi,
                             int first_tile)
      : args(a), pages(page_row), lo(key_lo), hi(key_hi) {
    constexpr int64_t es = sizeof(KV);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    chunk = lane % kRawChunks;
    row0 = warp * kRun + lane / kRawChunks;
    k = static_cast<const char*>(a.k) + kv_head * a.k_head_stride * es + chunk * 16;
    v = static_cast<const char*>(a.v) + kv_head * a.v_head_stride * es + chunk * 16;
    const int P = a.page_size;
    const bool run_path = P % kRun == 0 || (kRun % P == 0 && kRun / P <= kRunPages && P % kRowsPerPass == 0);
    // One division per work item; tiles then advance by BN keys.
    const int pos = first_tile * BN + warp * kRun;
    col = pos / P;
    tk = pos - col * P;
    adv = run_path ? (BN / P) << 16 | (BN % P) : -1;
  }

  __device__ __forceinline__ bool in_range(int pos) const { return pos >= lo && pos < hi; }
  __device__ __forceinline__ bool run_path() const { return adv >= 0; }

  /// Loads the run's page ids of `tile` into registers (issued early to hide their
  /// latency). Tiles must be fetched in order from `first_tile`, each once, before its
  /// issue(). The general path reads its page ids in issue(): holding one per row
  /// across the pipeline wait costs registers the D = 256 tiles do not have.
  __device__ __forceinline__ void fetch_pages(int tile) {
    if (run_path()) {
      // A page's entry is read only when its part of the run meets [lo, hi).
      const int first = tile * BN + (threadIdx.x >> 5) * kRun;
#pragma unroll
      for (int q = 0; q < kRunPages; ++q) {
        const int b = first + q * args.page_size, e = min(b + args.page_size, first + kRun);
        run_page[q] = b < e && b < hi && e > lo ? __ldg(pages + col + q) : 0;
      }
    }
  }

  /// Starts the copies of `tile` (after fetch_pages(tile)) into K then V at `dst`.
  __device__ __forceinline__ void issue(int tile, char* dst) {
    const uint32_t base = smem_addr(dst);
    const bool interior = tile * BN >= lo && tile * BN + BN <= hi;
    if (run_path()) {
      if (interior) {
        issue_run<false>(tile, base);
      } else {
        issue_run<true>(tile, base);
      }
      tk += adv & 0xffff;
      col += adv >> 16;
      if (tk >= args.page_size) {
        tk -= args.page_size;
        ++col;
      }
    } else {
      issue_rows(tile, base);
    }
  }

 private:
  template <bool kCheck>
  __device__ __forceinline__ void issue_run(int tile, uint32_t base) const {
    constexpr int64_t es = sizeof(KV);
    const int sub = row0 - (threadIdx.x >> 5) * kRun;  // row within the run's first pass
    const int64_t t0 = tk + sub;
    const char* kp = k + (run_page[0] * args.k_page_stride + t0 * args.k_token_stride) * es;
    const char* vp = v + (run_page[0] * args.v_page_stride + t0 * args.v_token_stride) * es;
    const int64_t k_step = kRowsPerPass * args.k_token_stride * es;
    const int64_t v_step = kRowsPerPass * args.v_token_stride * es;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = row0 + i * kRowsPerPass;
      if constexpr (kRunPages > 1) {
        // Page q starts at run row q * P (tk is 0 when pages are shorter than the run).
#pragma unroll
        for (int q = 1; q < kRunPages; ++q) {
          if (i * kRowsPerPass == q * args.page_size) {
            kp = k + (run_page[q] * args.k_page_stride + sub * args.k_token_stride) * es;
            vp = v + (run_page[q] * args.v_page_stride + sub * args.v_token_stride) * es;
          }
        }
      }
      const bool valid = !kCheck || in_range(tile * BN + r);
      const uint32_t off = swizzle_rows<kRawChunks>(r, chunk);
      cp_async_16(base + off, kp, valid);
      cp_async_16(base + kTileBytes + off, vp, valid);
      kp += k_step;
      vp += v_step;
    }
  }

  __device__ __forceinline__ void issue_rows(int tile, uint32_t base) const {
    constexpr int64_t es = sizeof(KV);
    const int P = args.page_size;
    int pos = tile * BN + row0;
    int c = pos / P;  // one division per tile; rows then step by kRowsPerPass
    int t = pos - c * P;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const bool valid = in_range(pos);
      const int64_t p = valid ? __ldg(pages + c) : 0;
      const uint32_t off = swizzle_rows<kRawChunks>(row0 + i * kRowsPerPass, chunk);
      cp_async_16(base + off, k + (p * args.k_page_stride + t * args.k_token_stride) * es, valid);
      cp_async_16(base + kTileBytes + off, v + (p * args.v_page_stride + t * args.v_token_stride) * es, valid);
      pos += kRowsPerPass;
      t += kRowsPerPass;
      while (t >= P) {
        t -= P;
        ++c;
      }
    }
  }
};

}  // namespace pagedmha::cuda
