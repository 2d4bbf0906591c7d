// The attention mainloop shared by decode and prefill: one CTA of 4 warps holds a tile
// of M query rows in shared memory and streams KV tiles of BN keys from the paged cache
// (cp.async, multi-stage), computing S = Q K^T and O += P V on tensor cores
// (mma.sync m16n8k16) with an online softmax in registers.
//
// Warp layout: WM warps split the M rows (16 * MT each: MT m16 tiles per warp, so each
// K / V fragment read from shared memory feeds MT mmas), WN = 4 / WM warps split each KV
// tile's keys (KW each). Prefill uses WM = 4 and MT = 2 for D <= 128 (128 rows, every
// warp sees every key);
// decode packs a KV head's G * n query rows into 16 rows and uses WN = 4, so four warps
// stream disjoint keys and merge (m, l, O) through shared memory at the end.
// The kernels differ only in how they map rows and pick the KV tile range.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/attention_args.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/fp8_fragments.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/paged_loader.cuh"

// Experiment knob (off): fp8 caches compute S = Q K^T in fp16 whatever the query dtype: Q
// is converted once per tile (a bf16 query saturates past 65504) and each K pair converts
// with one F2FP, where bf16 takes the PRMT / shift / mask / HMUL2 sequence. On the H200 it
// gave llama3-8b fp8 decode +5-8% and gpt-oss nothing (docs/perf-notes/decode.md, sixth
// session): not worth the portable kernels' exact bf16 queries.
#ifndef PAGEDMHA_FP8_QK_F16
#define PAGEDMHA_FP8_QK_F16 0
#endif

namespace pagedmha::cuda {

template <int D_, class T_, class KV_, int WM_, int MT_ = 1, int KW_ = 0, bool FoldScale_ = false,
          int SmemKB_ = 110>
struct AttentionTraits {
  static constexpr int D = D_;
  using T = T_;    // query / output / mma operand type (bf16 or fp16)
  using KV = KV_;  // cache element type (T or fp8_e4m3)
  static constexpr bool kFp8 = !std::is_same<KV, T>::value;
  using QkT = std::conditional_t<kFp8 && PAGEDMHA_FP8_QK_F16 != 0, __half, T>;  // Q's type in shared memory
  static constexpr int kThreads = 128;
  static constexpr int WM = WM_;
  static constexpr int WN = 4 / WM;
  static constexpr int MT = MT_;  // m16 row tiles per warp
  static constexpr int M = 16 * MT * WM;
  // keys per warp per tile (KW_ = 0: 64 for one row tile, 32 with two (S then takes
  // 32 registers, not 64) or at D = 256; 16 when the warps split the keys)
  static constexpr int KW = KW_ != 0 ? KW_ : (WN == 1 ? ((D == 256 || MT == 2) ? 32 : 64) : 16);
  // The softmax scale rides on the FFMA feeding ex2 (one FMUL per logit less). Off for
  // decode, whose split-KV partials are kept bitwise to its tested rounding.
  static constexpr bool kFoldScale = FoldScale_;
  static constexpr int BN = KW * WN;                                // keys per tile
  static constexpr int kChunks = D / 8;                             // 16-byte chunks of a T row

  using Loader = PagedTileLoader<D, KV, BN, kThreads>;

  static constexpr int kQBytes = M * D * 2;
  static constexpr int kStageBytes = 2 * Loader::kTileBytes;  // K + V tiles in the cache dtype
  // Stages: as many as fit SmemKB_ (110: two CTAs per SM), 2..4 (2..8 for fp8, whose
  // stages are half the size: the same bytes in flight take twice the stages).
  static constexpr int kMaxStages = kFp8 ? 8 : 4;
  static constexpr int kStagesFit = (SmemKB_ * 1024 - kQBytes) / kStageBytes;
  static constexpr int kStages = kStagesFit < 2 ? 2 : (kStagesFit > kMaxStages ? kMaxStages : kStagesFit);
  static constexpr int kMainBytes = kQBytes + kStages * kStageBytes;

  // Epilogue (aliases the mainloop buffers): per-warp-column partial O in fp32, rows
  // padded by 8 floats against bank conflicts, then the row statistics.
  static constexpr int kOStride = D + 8;
  static constexpr int kEpiOBytes = WN * M * kOStride * 4;
  static constexpr int kUnionBytes = kMainBytes > kEpiOBytes ? kMainBytes : kEpiOBytes;
  static constexpr int kStatsBytes = (2 * WN * M + M) * 4 + 2 * M * 4 + 4 * 4 * 4;
  static constexpr int kSmemBytes = kUnionBytes + kStatsBytes;

  static_assert(D == 64 || D == 128 || D == 256, "head dim");
  static_assert(WM == 1 || WM == 2 || WM == 4, "warp layout");
  static_assert((MT == 1 || MT == 2) && M <= kThreads, "row tiles (one thread per row in setup)");
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
  __device__ char* stage(int s) const { return base + Tr::kQBytes + s * Tr::kStageBytes; }
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
  bool q_async = true;
  if constexpr (Tr::kFp8) {
    if (!a.q_fp8 && !std::is_same<typename Tr::QkT, T>::value) {
      // 16-bit queries into QkT (bf16 into fp16): 8 values per load.
      q_async = false;
      for (int idx = tid; idx < Tr::M * Tr::kChunks; idx += Tr::kThreads) {
        const int r = idx / Tr::kChunks, c = idx % Tr::kChunks;
        const RowDesc d = rows(r);
        uint4 out = make_uint4(0, 0, 0, 0);
        if (d.valid) {
          out = bf16x8_to_half_sat(
              __ldg(reinterpret_cast<const uint4*>(q + (d.qrow * a.q_row_stride + d.head * a.q_head_stride) * 2 + c * 16)));
        }
        *reinterpret_cast<uint4*>(sm.q() + swizzle<Tr::kChunks>(r, c)) = out;
      }
    }
    if (a.q_fp8) {
      // fp8 e4m3 queries (fp8 cache only): 16 values per load, converted exactly to QkT.
      q_async = false;
      for (int idx = tid; idx < Tr::M * (Tr::D / 16); idx += Tr::kThreads) {
        const int r = idx / (Tr::D / 16), c = idx % (Tr::D / 16);
        const RowDesc d = rows(r);
        uint4 out[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
        if (d.valid) {
          const uint4 raw = __ldg(reinterpret_cast<const uint4*>(q + d.qrow * a.q_row_stride +
                                                                 d.head * a.q_head_stride + c * 16));
          fp8x16_to<typename Tr::QkT>(raw, out);
        }
        *reinterpret_cast<uint4*>(sm.q() + swizzle<Tr::kChunks>(r, 2 * c)) = out[0];
        *reinterpret_cast<uint4*>(sm.q() + swizzle<Tr::kChunks>(r, 2 * c + 1)) = out[1];
      }
    }
  }
  if (q_async) {
    for (int idx = tid; idx < Tr::M * Tr::kChunks; idx += Tr::kThreads) {
      const int r = idx / Tr::kChunks, c = idx % Tr::kChunks;
      const RowDesc d = rows(r);
      const char* src = q;
      if (d.valid) src += (d.qrow * a.q_row_stride + d.head * a.q_head_stride) * 2 + c * 16;
      cp_async_16(smem_addr(sm.q() + swizzle<Tr::kChunks>(r, c)), src, d.valid);
    }
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
/// thread's two rows (g and g + 8) of each of the warp's MT m16 tiles.
template <class Tr>
struct WarpResult {
  float acc[Tr::MT][Tr::D / 8][4];
  SoftmaxRows sm[Tr::MT];
};

/// Streams KV tiles [tile_begin, tile_end) (tile t = keys [t * BN, (t + 1) * BN)) of KV
/// head `kv_head` through the pipeline. `pages` is the request's page-table row.
template <class Tr>
__device__ void attention_mainloop(const AttentionArgs& a, const AttentionSmem<Tr>& sm, const KeyRange& kr,
                                   int kv_head, const int32_t* pages, int tile_begin, int tile_end,
                                   WarpResult<Tr>& res) {
  using T = typename Tr::T;
  constexpr int D = Tr::D, KW = Tr::KW, BN = Tr::BN, kChunks = Tr::kChunks, kStages = Tr::kStages, MT = Tr::MT;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / Tr::WN, wn = warp % Tr::WN;
  const int g = lane >> 2, t = lane & 3;

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) res.acc[mt][i][e] = 0.0f;
    }
    res.sm[mt].init();
  }

  typename Tr::Loader loader(a, kv_head, pages, kr.lo, kr.hi, tile_begin);
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
    // Page ids in flight during the wait. With MT = 2 their registers are needed by the
    // accumulators, so they are read after the barrier (L1 hits after the first tiles).
    constexpr bool kEarlyPages = MT == 1;
    if (kEarlyPages && next < ntiles) loader.fetch_pages(tile_begin + next);
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile `it` visible to all; everyone is done with tile it - 1's stage
    if (!kEarlyPages && next < ntiles) loader.fetch_pages(tile_begin + next);
    if (next < ntiles) loader.issue(tile_begin + next, sm.stage(next % kStages));
    cp_async_commit();

    const uint32_t k_base = smem_addr(sm.stage(it % kStages));
    const uint32_t v_base = k_base + Tr::Loader::kTileBytes;

    // S = Q K^T over this warp's KW keys; each K fragment feeds the warp's MT row tiles.
    float s[MT][KW / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int i = 0; i < KW / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][i][e] = 0.0f;
      }
    }
    if constexpr (Tr::kFp8) {
      const auto q_frag = [&](int chunk, int mt, uint32_t(&qa)[4]) {
        q_fragment_fp8_order<kChunks>(qa, q_base, (wm * MT + mt) * 16 + (lane >> 2), chunk, lane);
      };
      qk_fp8<Tr>(s, q_frag, k_base, wn, lane);  // K fragments converted in registers
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ldmatrix_x4(qa[mt], q_base + swizzle<kChunks>((wm * MT + mt) * 16 + (lane & 15), 2 * kk + (lane >> 4)));
        }
#pragma unroll
        for (int np = 0; np < KW / 16; ++np) {
          uint32_t kb[4];
          const int key = wn * KW + np * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(kb, k_base + swizzle<kChunks>(key, 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
            mma_16816<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
          }
        }
      }
    }

    // Soft-cap into log2 units, or (kFoldScale, scale > 0) leave the logits raw and fold
    // the scale into the softmax's FFMA; the branches are uniform (hoisted out of the
    // element loops). Masking below writes -inf, which any positive scale keeps.
    float fold = 1.0f;
    if (a.cap_log2 > 0.0f) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int i = 0; i < KW / 8; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][i][e] = a.cap_log2 * tanhf(s[mt][i][e] * a.cap_inner);
        }
      }
    } else if (Tr::kFoldScale && a.logit_scale_log2 > 0.0f) {
      fold = a.logit_scale_log2;
    } else {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int i = 0; i < KW / 8; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][i][e] *= a.logit_scale_log2;
        }
      }
    }
    const int key0 = (tile_begin + it) * BN + wn * KW;
    if (!(key0 >= kr.full_lo && key0 + KW <= kr.full_hi)) {
      // Boundary tile: the row bounds come from shared memory (no registers held
      // across the loop for them).
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r = (wm * MT + mt) * 16 + g;
        const int row_lo[2] = {sm.row_lo()[r], sm.row_lo()[r + 8]};
        const int row_hi[2] = {sm.row_hi()[r], sm.row_hi()[r + 8]};
        mask_keys(s[mt], key0, t, row_lo, row_hi);  // t: RowsInM::key reads only lane & 3
      }
    }

    // ftz: decode's split results are compared within an
    // ulp, not bitwise, across split counts, and a request's split count never depends on
    // the batch (decode/policy.h); prefill does not split keys.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) res.sm[mt].template update<KW / 8, D / 8, true>(s[mt], res.acc[mt], fold);

    // O += P V: P's C fragments are A fragments of the k16 steps over keys; each V
    // fragment feeds the warp's MT row tiles.
    if constexpr (Tr::kFp8) {
      pv_fp8<Tr>(res.acc, s, v_base, wn, lane);  // fp16 mma, even / odd dim layout
    } else {
      // P packed to 16-bit A fragments up front: half the registers of fp32 S while the
      // V fragments stream.
      uint32_t p[KW / 16][MT][4];
#pragma unroll
      for (int kk = 0; kk < KW / 16; ++kk) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) p_fragment<T>(p[kk][mt], s[mt], kk);
      }
#pragma unroll
      for (int kk = 0; kk < KW / 16; ++kk) {
        const uint32_t(&pa)[MT][4] = p[kk];
        const int key = wn * KW + kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_base + swizzle<kChunks>(key, 2 * dp + (lane >> 4)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<T>(res.acc[mt][2 * dp], pa[mt], vb[0], vb[1]);
            mma_16816<T>(res.acc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) res.sm[mt].finish();
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
  if (t == 0) {
#pragma unroll
    for (int mt = 0; mt < Tr::MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = (wm * Tr::MT + mt) * 16 + g + 8 * h;
        sm.stat_m()[wn * M + r] = res.sm[mt].m[h];
        sm.stat_l()[wn * M + r] = res.sm[mt].l[h];
      }
    }
  }
  __syncthreads();
  // Rescale to the row maximum over the warps that shared the row, then park O.
#pragma unroll
  for (int mt = 0; mt < Tr::MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = (wm * Tr::MT + mt) * 16 + g + 8 * h;
      float m_all = -INFINITY;
#pragma unroll
      for (int w = 0; w < WN; ++w) m_all = fmaxf(m_all, sm.stat_m()[w * M + r]);
      const float f = m_all == -INFINITY ? 0.0f : fast_exp2(res.sm[mt].m[h] - m_all);
      float* row = sm.o() + (wn * M + r) * Tr::kOStride;
      if constexpr (Tr::kFp8) {  // even / odd dim layout of pv_fp8
#pragma unroll
        for (int c = 0; c < D / 16; ++c) {
          float4 v = fp8_acc_dims(res.acc[mt], c, h);
          v.x *= f, v.y *= f, v.z *= f, v.w *= f;
          *reinterpret_cast<float4*>(row + 16 * c + 4 * t) = v;
        }
      } else {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
          *reinterpret_cast<float2*>(row + 8 * i + 2 * t) =
              make_float2(res.acc[mt][i][2 * h] * f, res.acc[mt][i][2 * h + 1] * f);
        }
      }
    }
  }
  if (tid < M) {
    float m_all, l_all;
    merge_warp_rows<WN>(sm.stat_m(), sm.stat_l(), M, tid, m_all, l_all);
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
    float scale, lse;
    finalize_softmax(m, l, a.sinks != nullptr ? a.sinks[d.head] * kLog2e : -INFINITY, a.bmm2_scale, scale, lse);
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
