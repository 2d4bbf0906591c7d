// The producer warpgroup of the Hopper kernels: loads each query tile's Q once and
// streams its K / V tiles (last key tile first, the consumers' order: K0 K1 V0 K2 V1 ...)
// into the swizzled rings, signalling the consumers through mbarriers. Three ways in,
// chosen once per launch (policy.h, kv_tma_ok / q_tma_ok):
//   * TMA: producer warp 0, one lane per box (a page, or a tile of a page), page ids
//     read in parallel; the rows of V's last page past the request's length are copied
//     by hand so that what lies there (anything) never meets a zero probability;
//   * cp.async gather (page size 1, odd sizes or strides): all 128 threads, one 16-byte
//     chunk at a time through the page table, zero-filling keys outside the tile's span;
//   * fp8 caches: cp.async of the raw e4m3 tile into a staging slot, then all 128
//     threads convert it (exactly) into the 16-bit stage.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/hopper/params.cuh"
#include "cuda/hopper/sm90.cuh"

namespace pagedmha::cuda::sm90 {

template <class Pol, class T, class KV>
struct Producer {
  static constexpr int D = Pol::kHeadDim, BN = Pol::kBlockN, BM = Pol::kBlockM, S = Pol::kStages;
  static constexpr int kPanels = D / 64;
  static constexpr int kChunks = D / 8;  // 16-byte chunks of a 16-bit row
  static constexpr bool kFp8 = Pol::kFp8Kv;

  const Sm90Params& p;
  const SmemLayout<Pol> sm;  // by value: a reference would put it in local memory
  int tid;  // 0..127

  __device__ void run() {
    PipeState<S> ks, vs;
    uint32_t q_phase = 0;
    const int total = *p.count * p.a.num_kv_heads * p.head_groups;
    for (int item = blockIdx.x; item < total; item += gridDim.x) {
      const QueryTile t = query_tile(p.space, p.list, item, p.a.num_kv_heads, p.head_groups, p.a.group, p.pack);
      const int n = t.keys.end - t.keys.begin;
      if (n <= 0) continue;  // the consumers write zeros without reading anything
      wait(sm.q_empty(), q_phase ^ 1);
      load_q(t);
      q_phase ^= 1;
      const int32_t* pages = p.a.page_table + int64_t{t.b} * p.a.page_table_row_stride;
      if constexpr (kFp8) {
        convert_kv_all(t, pages, n, ks, vs);
      } else {
        for (int x = 0; x < 2 * n; ++x) {
          int j;
          bool is_v;
          kv_order(x, n, j, is_v);
          if (is_v) {
            load_kv(t, pages, t.keys.end - 1 - j, true, vs.slot, vs.phase);
            vs.advance();
          } else {
            load_kv(t, pages, t.keys.end - 1 - j, false, ks.slot, ks.phase);
            ks.advance();
          }
        }
      }
    }
  }

  // ---- Q ---------------------------------------------------------------------------

  __device__ void load_q(const QueryTile& t) {
    const int rows = p.space.tokens * p.pack;
    if (p.tma_q) {
      if (tid == 0) {
        expect_tx(sm.q_full(), static_cast<uint32_t>(rows * 128 * kPanels));
#pragma unroll
        for (int c = 0; c < kPanels; ++c) {
          tma_load_3d(&p.tm_q, sm.q_full(), sm.q() + c * BM * 128, c * 64, t.head0, static_cast<int>(t.q_row0),
                      kEvictFirst);
        }
        arrive(sm.q_full());
      }
      return;
    }
    // Row r of the tile: token r / pack, head head0 + r % pack; rows past the tile's
    // tokens are zero.
    const char* q = static_cast<const char*>(p.a.q);
    const int esize = p.a.q_fp8 ? 1 : 2;
    if (!p.a.q_fp8) {
#pragma unroll 1
      for (int idx = tid; idx < BM * kChunks; idx += 128) {
        const int r = idx / kChunks, c = idx % kChunks;
        const int tok = r / p.pack;
        const bool valid = r < rows && tok < t.n_tok;
        const char* src = q;
        if (valid) {
          src += (int64_t{t.q_row0 + tok} * p.a.q_row_stride + int64_t{t.head0 + r % p.pack} * p.a.q_head_stride) * esize +
                 c * 16;
        }
        cp_async_16(smem_addr(sm.q() + tile_offset(BM, r, c)), src, valid);
      }
      cp_async_arrive(sm.q_full());
    } else {
      // fp8 e4m3 queries: 16 values per load, converted exactly to T.
#pragma unroll 1
      for (int idx = tid; idx < BM * (D / 16); idx += 128) {
        const int r = idx / (D / 16), c = idx % (D / 16);
        const int tok = r / p.pack;
        uint4 out[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
        if (r < rows && tok < t.n_tok) {
          const uint4 raw_q = __ldg(reinterpret_cast<const uint4*>(
              q + int64_t{t.q_row0 + tok} * p.a.q_row_stride + int64_t{t.head0 + r % p.pack} * p.a.q_head_stride + c * 16));
          fp8x16_to<T>(raw_q, out);
        }
        *reinterpret_cast<uint4*>(sm.q() + tile_offset(BM, r, 2 * c)) = out[0];
        *reinterpret_cast<uint4*>(sm.q() + tile_offset(BM, r, 2 * c + 1)) = out[1];
      }
      fence_async_smem();
      arrive(sm.q_full());
    }
  }

  // ---- 16-bit K / V ----------------------------------------------------------------

  __device__ void load_kv(const QueryTile& t, const int32_t* pages, int tile, bool is_v, int slot, uint32_t phase) {
    uint64_t* full = is_v ? sm.v_full(slot) : sm.k_full(slot);
    uint64_t* empty = is_v ? sm.v_empty(slot) : sm.k_empty(slot);
    char* dst = is_v ? sm.v(slot) : sm.k(slot);
    const int key0 = tile * BN;
    const int a = key0 > t.keys.span_lo ? key0 : t.keys.span_lo;
    const int e = key0 + BN < t.keys.span_hi ? key0 + BN : t.keys.span_hi;
    if (p.tma_kv) {
      if (tid < 32) {
        wait(empty, phase ^ 1);
        load_kv_tma(t, pages, key0, a, e, is_v, dst, full);
      }
    } else {
      wait(empty, phase ^ 1);
      gather(t, pages, key0, a, e, is_v, dst, 2, kChunks);
      cp_async_arrive(full);
    }
  }

  /// Warp 0: boxes of R rows at keys u * R for the units overlapping [a, e), one lane
  /// per box (page ids read in parallel); V's unit holding keys past L copied by hand.
  __device__ void load_kv_tma(const QueryTile& t, const int32_t* pages, int key0, int a, int e, bool is_v,
                              char* dst, uint64_t* full) {
    const int lane = tid;
    const int R = p.kv_box_rows, P = p.a.page_size;
    const int u0 = a / R, u1 = (e - 1) / R;
    const int tail = (is_v && t.L % R != 0) ? (t.L - 1) / R : -1;  // unit holding keys past L
    const int u = u0 + lane;
    const bool mine = u <= u1 && u != tail;
    const int pos = u * R;
    int page = 0;
    if (mine) page = __ldg(pages + pos / P);
    const uint32_t bytes = __reduce_add_sync(0xffffffffu, mine ? static_cast<uint32_t>(R * 128 * kPanels) : 0u);
    if (lane == 0 && bytes > 0) expect_tx(full, bytes);
    __syncwarp();
    if (mine) {
      const CUtensorMap* map = is_v ? &p.tm_v : &p.tm_k;
#pragma unroll
      for (int c = 0; c < kPanels; ++c) {
        tma_load_4d(map, full, dst + c * BN * 128 + (pos - key0) * 128, c * 64, t.kv_head, static_cast<int>(pos % P),
                    page, kEvictLast);
      }
    }
    if (tail >= u0 && tail <= u1) {
      // Keys [max(tail * R, a), min(L, e)) by hand; the rest of the unit keeps what the
      // stage held (finite: earlier V rows or the zeros written at start).
      const int r0 = tail * R > a ? tail * R : a;
      const int r1 = t.L < e ? t.L : e;
      gather_rows(t, pages, key0, r0, r1, p.a.v, dst, lane, 32);
      fence_async_smem();
    }
    __syncwarp();
    if (lane == 0) arrive(full);
  }

  /// Plain loads of keys [r0, r1) (16-bit) into the swizzled tile, `threads` threads.
  __device__ void gather_rows(const QueryTile& t, const int32_t* pages, int key0, int r0, int r1,
                              const void* cache, char* dst, int thread, int threads) const {
    const int P = p.a.page_size;
    const int64_t ps = p.a.v_page_stride, ts = p.a.v_token_stride, hs = p.a.v_head_stride;
    const char* base = static_cast<const char*>(cache) + int64_t{t.kv_head} * hs * 2;
    const int rows = r1 - r0;
#pragma unroll 1
    for (int idx = thread; idx < rows * kChunks; idx += threads) {
      const int r = idx / kChunks, c = idx % kChunks;
      const int pos = r0 + r;
      const int64_t page = __ldg(pages + pos / P);
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(base + (page * ps + (pos % P) * ts) * 2 + c * 16));
      *reinterpret_cast<uint4*>(dst + tile_offset(BN, pos - key0, c)) = x;
    }
  }

  /// All 128 threads: 16-byte cp.async of every chunk of the tile's BN rows, keys outside
  /// [a, e) zero-filled without touching the page table. `row_chunks` chunks of
  /// `esize`-byte elements per row; the destination is the swizzled 16-bit tile (esize 2)
  /// or the dense raw fp8 slot (esize 1, rows of D bytes).
  __device__ void gather(const QueryTile& t, const int32_t* pages, int key0, int a, int e, bool is_v,
                         char* dst, int esize, int row_chunks) const {
    const void* cache = is_v ? p.a.v : p.a.k;
    const int P = p.a.page_size;
    const int64_t ps = is_v ? p.a.v_page_stride : p.a.k_page_stride;
    const int64_t ts = is_v ? p.a.v_token_stride : p.a.k_token_stride;
    const int64_t hs = is_v ? p.a.v_head_stride : p.a.k_head_stride;
    const char* base = static_cast<const char*>(cache) + int64_t{t.kv_head} * hs * esize;
    const int rows_per_pass = 128 / row_chunks;
    const int c = tid % row_chunks;
#pragma unroll 2
    for (int r = tid / row_chunks; r < BN; r += rows_per_pass) {
      const int pos = key0 + r;
      const bool valid = pos >= a && pos < e;
      const char* src = base;
      if (valid) {
        const int64_t page = __ldg(pages + pos / P);
        src += (page * ps + (pos % P) * ts) * esize + c * 16;
      }
      const uint32_t off = esize == 2 ? tile_offset(BN, r, c) : static_cast<uint32_t>(r * D + c * 16);
      cp_async_16(smem_addr(dst + off), src, valid);
    }
  }

  // ---- fp8 K / V ---------------------------------------------------------------------

  /// The item's 2n K / V tiles through the two staging slots: element x + 1 is in flight
  /// while element x converts into its stage.
  __device__ void convert_kv_all(const QueryTile& t, const int32_t* pages, int n, PipeState<S>& ks,
                                 PipeState<S>& vs) {
    issue_raw(t, pages, n, 0);
    cp_async_commit();
    for (int x = 0; x < 2 * n; ++x) {
      if (x + 1 < 2 * n) {
        issue_raw(t, pages, n, x + 1);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      named_sync(kBarProducer, 128);  // every thread's raw chunks of element x have landed
      int j;
      bool is_v;
      kv_order(x, n, j, is_v);
      const int slot = is_v ? vs.slot : ks.slot;
      wait(is_v ? sm.v_empty(slot) : sm.k_empty(slot), (is_v ? vs.phase : ks.phase) ^ 1);
      const char* src = sm.raw(x & 1);
      char* dst = is_v ? sm.v(slot) : sm.k(slot);
      for (int idx = tid; idx < BN * (D / 16); idx += 128) {
        const int r = idx / (D / 16), c = idx % (D / 16);
        uint4 out[2];
        fp8x16_to<T>(*reinterpret_cast<const uint4*>(src + r * D + c * 16), out);
        *reinterpret_cast<uint4*>(dst + tile_offset(BN, r, 2 * c)) = out[0];
        *reinterpret_cast<uint4*>(dst + tile_offset(BN, r, 2 * c + 1)) = out[1];
      }
      fence_async_smem();
      arrive(is_v ? sm.v_full(slot) : sm.k_full(slot));
      named_sync(kBarProducer, 128);  // slot x & 1 may be refilled
      if (is_v) {
        vs.advance();
      } else {
        ks.advance();
      }
    }
  }

  /// cp.async of element x's raw e4m3 tile (dense rows of D bytes) into slot x & 1.
  __device__ void issue_raw(const QueryTile& t, const int32_t* pages, int n, int x) const {
    int j;
    bool is_v;
    kv_order(x, n, j, is_v);
    const int key0 = (t.keys.end - 1 - j) * BN;
    const int a = key0 > t.keys.span_lo ? key0 : t.keys.span_lo;
    const int e = key0 + BN < t.keys.span_hi ? key0 + BN : t.keys.span_hi;
    gather(t, pages, key0, a, e, is_v, sm.raw(x & 1), 1, D / 16);
  }
};

}  // namespace pagedmha::cuda::sm90
