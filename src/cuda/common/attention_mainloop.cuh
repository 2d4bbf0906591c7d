// The attention mainloop shared by decode and prefill: one CTA of 4 warps holds a tile
// of M query rows in shared memory and streams KV tiles of BN keys from the paged cache
// (cp.async, multi-stage), computing S = Q K^T and O += P V on tensor cores
// (mma.sync m16n8k16) with an online softmax in registers.
//
// Warp layout: WM warps split the M rows (16 each), WN = 4 / WM warps split each KV
// tile's keys (KW each). Prefill uses WM = 4 (64 rows, every warp sees every key);
// decode packs a KV head's G * n query rows into 16 rows and uses WN = 4, so four warps
// stream disjoint keys and merge (m, l, O) through shared memory at the end.
// The kernels differ only in how they map rows and pick the KV tile range.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/attention_args.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/paged_loader.cuh"

namespace pagedmha::cuda {

template <int D_, class T_, class KV_, int WM_>
struct AttentionTraits {
  static constexpr int D = D_;
  using T = T_;    // query / output / mma operand type (bf16 or fp16)
  using KV = KV_;  // cache element type (T or fp8_e4m3)
  static constexpr bool kFp8 = !std::is_same<KV, T>::value;
  static constexpr int kThreads = 128;
  static constexpr int WM = WM_;
  static constexpr int WN = 4 / WM;
  static constexpr int M = 16 * WM;
  static constexpr int KW = WN == 1 ? (D == 256 ? 32 : 64) : 16;  // keys per warp per tile
  static constexpr int BN = KW * WN;                                // keys per tile
  static constexpr int kChunks = D / 8;                             // 16-byte chunks of a T row

  using Loader = PagedTileLoader<D, KV, BN, kThreads>;

  static constexpr int kQBytes = M * D * 2;
  static constexpr int kTileBytes = BN * D * 2;  // one K or V tile as T
  static constexpr int kStageBytes = 2 * Loader::kTileBytes;
  static constexpr int kConvBytes = kFp8 ? 2 * kTileBytes : 0;
  // Stages: as many as fit ~110 KB (two CTAs per SM), 2..4.
  static constexpr int kStagesFit = (110 * 1024 - kQBytes - kConvBytes) / kStageBytes;
  static constexpr int kStages = kStagesFit < 2 ? 2 : (kStagesFit > 4 ? 4 : kStagesFit);
  static constexpr int kMainBytes = kQBytes + kConvBytes + kStages * kStageBytes;

  // Epilogue (aliases the mainloop buffers): per-warp-column partial O in fp32, rows
  // padded by 8 floats against bank conflicts, then the row statistics.
  static constexpr int kOStride = D + 8;
  static constexpr int kEpiOBytes = WN * M * kOStride * 4;
  static constexpr int kUnionBytes = kMainBytes > kEpiOBytes ? kMainBytes : kEpiOBytes;
  static constexpr int kStatsBytes = (2 * WN * M + M) * 4 + 2 * M * 4 + 4 * 4 * 4;
  static constexpr int kSmemBytes = kUnionBytes + kStatsBytes;

  static_assert(D == 64 || D == 128 || D == 256, "head dim");
  static_assert(WM == 1 || WM == 2 || WM == 4, "warp layout");
  static_assert(KW % 16 == 0, "a warp's key slice feeds whole k16 steps of P V");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

/// Range of keys a CTA touches: [lo, hi) is loaded (everything else reads as zero and is
/// masked); inside [full_lo, full_hi) every valid row sees every key, so tiles there skip
/// the mask.
struct KeyRange {
  int lo, hi, full_lo, full_hi;
};

template <class Tr>
struct AttentionSmem {
  char* base;
  __device__ char* q() const { return base; }
  __device__ char* conv() const { return base + Tr::kQBytes; }
  __device__ char* stage(int s) const { return base + Tr::kQBytes + Tr::kConvBytes + s * Tr::kStageBytes; }
  __device__ float* o() const { return reinterpret_cast<float*>(base); }
  __device__ float* stat_m() const { return reinterpret_cast<float*>(base + Tr::kUnionBytes); }
  __device__ float* stat_l() const { return stat_m() + Tr::WN * Tr::M; }
  __device__ float* row_scale() const { return stat_l() + Tr::WN * Tr::M; }
  __device__ int* row_lo() const { return reinterpret_cast<int*>(row_scale() + Tr::M); }
  __device__ int* row_hi() const { return row_lo() + Tr::M; }
  __device__ int* reduce() const { return row_hi() + Tr::M; }  // [4 warps][4]
};

/// Reads the CTA's row descriptors, starts the Q copy (committed with the first KV
/// stage) and returns the key range. Ends with the block synchronised.
template <class Tr, class RowMap>
__device__ KeyRange setup_rows(const AttentionArgs& a, const AttentionSmem<Tr>& sm, const RowMap& rows) {
  using T = typename Tr::T;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int lo = INT_MAX, hi = INT_MIN, full_lo = INT_MIN, full_hi = INT_MAX;
  if (tid < Tr::M) {
    const RowDesc r = rows(tid);
    sm.row_lo()[tid] = r.valid ? r.lo : 0;
    sm.row_hi()[tid] = r.valid ? r.hi : 0;
    if (r.valid) {
      full_lo = r.lo;
      full_hi = r.hi;
      if (r.lo < r.hi) {
        lo = r.lo;
        hi = r.hi;
      }
    }
  }
  lo = __reduce_min_sync(0xffffffffu, lo);
  hi = __reduce_max_sync(0xffffffffu, hi);
  full_lo = __reduce_max_sync(0xffffffffu, full_lo);
  full_hi = __reduce_min_sync(0xffffffffu, full_hi);
  if (lane == 0) {
    int* red = sm.reduce() + 4 * warp;
    red[0] = lo;
    red[1] = hi;
    red[2] = full_lo;
    red[3] = full_hi;
  }
  // Q rows: zero-filled for invalid rows.
  const char* q = static_cast<const char*>(a.q);
  for (int idx = tid; idx < Tr::M * Tr::kChunks; idx += Tr::kThreads) {
    const int r = idx / Tr::kChunks, c = idx % Tr::kChunks;
    const RowDesc d = rows(r);
    const char* src = q;
    if (d.valid) src += (d.qrow * a.q_row_stride + d.head * a.q_head_stride) * 2 + c * 16;
    cp_async_16(smem_addr(sm.q() + swizzle<Tr::kChunks>(r, c)), src, d.valid);
  }
  __syncthreads();
  KeyRange kr{INT_MAX, INT_MIN, INT_MIN, INT_MAX};
  for (int w = 0; w < 4; ++w) {
    const int* red = sm.reduce() + 4 * w;
    kr.lo = min(kr.lo, red[0]);
    kr.hi = max(kr.hi, red[1]);
    kr.full_lo = max(kr.full_lo, red[2]);
    kr.full_hi = min(kr.full_hi, red[3]);
  }
  if (kr.lo >= kr.hi) kr.lo = kr.hi = 0;
  return kr;
}

/// Per-warp result of the mainloop: O (unnormalised) and the softmax state of the
/// thread's two rows (g and g + 8 of the warp's 16).
template <class Tr>
struct WarpResult {
  float acc[Tr::D / 8][4];
  SoftmaxRows sm;
};

/// Streams KV tiles [tile_begin, tile_end) (tile t = keys [t * BN, (t + 1) * BN)) of KV
/// head `kv_head` through the pipeline. `pages` is the request's page-table row.
template <class Tr>
__device__ void attention_mainloop(const AttentionArgs& a, const AttentionSmem<Tr>& sm, const KeyRange& kr,
                                   int kv_head, const int32_t* pages, int tile_begin, int tile_end,
                                   WarpResult<Tr>& res) {
  using T = typename Tr::T;
  constexpr int D = Tr::D, KW = Tr::KW, BN = Tr::BN, kChunks = Tr::kChunks, kStages = Tr::kStages;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / Tr::WN, wn = warp % Tr::WN;
  const int g = lane >> 2, t = lane & 3;

#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) res.acc[i][e] = 0.0f;
  }
  res.sm.init();

  const int r0 = wm * 16 + g;
  const int row_lo[2] = {sm.row_lo()[r0], sm.row_lo()[r0 + 8]};
  const int row_hi[2] = {sm.row_hi()[r0], sm.row_hi()[r0 + 8]};

  typename Tr::Loader loader(a, kv_head, pages, kr.lo, kr.hi);
  const int ntiles = tile_end - tile_begin;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ntiles) {
      loader.fetch_pages(tile_begin + s);
      loader.issue(tile_begin + s, sm.stage(s));
    }
    cp_async_commit();
  }

  const uint32_t q_base = smem_addr(sm.q());
  for (int it = 0; it < ntiles; ++it) {
    const int next = it + kStages - 1;
    if (next < ntiles) loader.fetch_pages(tile_begin + next);  // page ids in flight during the wait
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile `it` visible to all; everyone is done with tile it - 1's stage
    if (next < ntiles) loader.issue(tile_begin + next, sm.stage(next % kStages));
    cp_async_commit();

    const char* tile = sm.stage(it % kStages);
    if constexpr (Tr::kFp8) {
      loader.template dequantize<T, kChunks>(tile, sm.conv(), Tr::kTileBytes);
      __syncthreads();
      tile = sm.conv();
    }
    const uint32_t k_base = smem_addr(tile);
    const uint32_t v_base = k_base + (Tr::kFp8 ? Tr::kTileBytes : Tr::Loader::kTileBytes);

    // S = Q K^T over this warp's KW keys.
    float s[KW / 8][4];
#pragma unroll
    for (int i = 0; i < KW / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4];
      ldmatrix_x4(qa, q_base + swizzle<kChunks>(wm * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
      for (int np = 0; np < KW / 16; ++np) {
        uint32_t kb[4];
        const int key = wn * KW + np * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(kb, k_base + swizzle<kChunks>(key, 2 * kk + ((lane >> 3) & 1)));
        mma_16816<T>(s[2 * np], qa, kb[0], kb[1]);
        mma_16816<T>(s[2 * np + 1], qa, kb[2], kb[3]);
      }
    }

    // Scale (and soft-cap) into log2 units, then mask outside each row's visible keys.
    const int key0 = (tile_begin + it) * BN + wn * KW;
    const bool need_mask = !(key0 >= kr.full_lo && key0 + KW <= kr.full_hi);
#pragma unroll
    for (int i = 0; i < KW / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[i][e];
        x = a.cap_log2 > 0.0f ? a.cap_log2 * tanhf(x * a.cap_inner) : x * a.logit_scale_log2;
        if (need_mask) {
          const int key = key0 + i * 8 + 2 * t + (e & 1);
          const int h = e >> 1;
          if (key < row_lo[h] || key >= row_hi[h]) x = -INFINITY;
        }
        s[i][e] = x;
      }
    }

    res.sm.template update<KW / 8, D / 8>(s, res.acc);

    // O += P V: P's C fragments are A fragments of the k16 steps over keys.
#pragma unroll
    for (int kk = 0; kk < KW / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      const int key = wn * KW + kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, v_base + swizzle<kChunks>(key, 2 * dp + (lane >> 4)));
        mma_16816<T>(res.acc[2 * dp], pa, vb[0], vb[1]);
        mma_16816<T>(res.acc[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();
  res.sm.finish();
  __syncthreads();  // the pipeline buffers become the epilogue's
}

/// Merges the warps' results through shared memory and writes every valid row with
/// `Out`: out.finish_row(r, m, l) (called once per row by one thread, log2 units; the
/// value returned multiplies the row's O) and out.store8(r, c, v) (8 fp32 values of
/// columns [8c, 8c + 8)).
template <class Tr, class Out>
__device__ void attention_epilogue(const AttentionSmem<Tr>& sm, WarpResult<Tr>& res, const Out& out) {
  constexpr int D = Tr::D, M = Tr::M, WN = Tr::WN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = wm * 16 + g;
  if (t == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sm.stat_m()[wn * M + r0 + 8 * h] = res.sm.m[h];
      sm.stat_l()[wn * M + r0 + 8 * h] = res.sm.l[h];
    }
  }
  __syncthreads();
  // Rescale to the row maximum over the warps that shared the row, then park O.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < WN; ++w) m_all = fmaxf(m_all, sm.stat_m()[w * M + r0 + 8 * h]);
    const float f = m_all == -INFINITY ? 0.0f : fast_exp2(res.sm.m[h] - m_all);
    float* row = sm.o() + (wn * M + r0 + 8 * h) * Tr::kOStride;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      *reinterpret_cast<float2*>(row + 8 * i + 2 * t) = make_float2(res.acc[i][2 * h] * f, res.acc[i][2 * h + 1] * f);
    }
  }
  if (tid < M) {
    float m_all = -INFINITY, l_all = 0.0f;
#pragma unroll
    for (int w = 0; w < WN; ++w) m_all = fmaxf(m_all, sm.stat_m()[w * M + tid]);
    if (m_all != -INFINITY) {
#pragma unroll
      for (int w = 0; w < WN; ++w) l_all += sm.stat_l()[w * M + tid] * fast_exp2(sm.stat_m()[w * M + tid] - m_all);
    }
    sm.row_scale()[tid] = out.finish_row(tid, m_all, l_all);
  }
  __syncthreads();
  for (int idx = tid; idx < M * (D / 8); idx += Tr::kThreads) {
    const int r = idx / (D / 8), c = idx % (D / 8);
    if (!out.row_valid(r)) continue;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = 0.0f;
#pragma unroll
    for (int w = 0; w < WN; ++w) {
      const float4* p = reinterpret_cast<const float4*>(sm.o() + (w * M + r) * Tr::kOStride + 8 * c);
      const float4 x = p[0], y = p[1];
      v[0] += x.x, v[1] += x.y, v[2] += x.z, v[3] += x.w;
      v[4] += y.x, v[5] += y.y, v[6] += y.z, v[7] += y.w;
    }
    const float f = sm.row_scale()[r];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] *= f;
    out.store8(r, c, v);
  }
}

/// Final output of a row: normalises, counts the sink once, writes o (as T) and lse.
template <class T, class RowMap>
struct DirectOut {
  const AttentionArgs& a;
  const RowMap& rows;

  __device__ bool row_valid(int r) const { return rows(r).valid; }

  __device__ float finish_row(int r, float m, float l) const {
    const RowDesc d = rows(r);
    if (!d.valid) return 0.0f;
    float scale = 0.0f, lse = -INFINITY;
    if (a.sinks != nullptr) {
      const float sink = a.sinks[d.head] * kLog2e;
      const float mm = fmaxf(m, sink);
      if (mm != -INFINITY) {
        const float w = fast_exp2(m - mm);  // 0 when the row saw no key
        const float z = l * w + fast_exp2(sink - mm);
        scale = a.bmm2_scale * w / z;
        lse = (mm + __log2f(z)) * kLn2;
      }
    } else if (l > 0.0f) {
      scale = a.bmm2_scale / l;
      lse = (m + __log2f(l)) * kLn2;
    }
    if (a.lse != nullptr) a.lse[d.qrow * a.lse_row_stride + d.head * a.lse_head_stride] = lse;
    return scale;
  }

  __device__ void store8(int r, int c, const float (&v)[8]) const {
    const RowDesc d = rows(r);
    T* o = static_cast<T*>(a.out) + d.qrow * a.out_row_stride + d.head * a.out_head_stride;
    *reinterpret_cast<uint4*>(o + 8 * c) = pack8<T>(v);
  }
};

}  // namespace pagedmha::cuda
