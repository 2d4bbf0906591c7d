// The query rows of a Hopper decode work item in a consumer warp's mma.sync tiles (policy.h
// kRows), two layouts with one interface for DecodeWarp (kernel.cuh):
//   RowTileM<Pol, T, MT>: 16 MT rows as the M of MT m16n8k16 tiles, S = Q K^T and
//     O += P V, each K / V fragment read once for all MT (G q_len up to 16, or 32 with
//     MT = 2; at G = 4 or 8 and one tile it is 3/4 or 1/2 padding rows);
//   RowTileN<Pol, T>: 8 rows as its N (operand swap), S^T = K Q^T and O^T += V^T P^T with
//     the keys, then the dims, as M: no padding at G q_len = 8, half the mma, exponentials
//     and accumulators of RowTileM. P^T's B fragments come from S^T's accumulators by an
//     8x8 register transpose (movmatrix) per 8 keys. With two KV heads per item (fp8
//     D = 64, policy.h kItemHeads) MT = 2 tiles, one per head over its half of the row.
// Each gives: Frag (the softmax layout, online_softmax.cuh), the row tiles MT (one
// softmax state each), the fragment counts NS (S), NA (O) and NQ (Q registers per k16
// step) per tile, the thread's rows row(mt, h), the lanes that hold a row's statistics,
// and load_q / qk / pv / to_buffer (the mask: online_softmax.cuh's mask_keys<Frag>).
// fp8 caches stay raw in the ring and are converted in registers (common/fp8_fragments.cuh),
// S in QkT (policy.h kQkF16), P and V in fp16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/attention_args.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/fp8_fragments.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/decode/decode_kernel.cuh"
#include "cuda/hopper/sm90.cuh"

namespace pagedmha::cuda::sm90 {

/// Byte offset of 16-byte chunk c of row r in a stage's K or V tile.
template <class Pol>
__device__ __forceinline__ uint32_t ring_offset(int r, int c) {
  if constexpr (Pol::kFp8) {
    return swizzle_rows<Pol::kChunks>(r, c);
  } else {
    return tile_offset(Pol::kTileKeys, r, c);
  }
}

/// Common to both layouts: dims, the S type, and a query row's 32-bit words of Q.
template <class Pol, class T>
struct RowTileBase {
  static constexpr int D = Pol::kHeadDim, KW = Pol::KW, TK = Pol::kTileKeys;
  using QkT = std::conditional_t<Pol::kQkF16, __half, T>;
  using PvT = std::conditional_t<Pol::kFp8, __half, T>;  // P and V (fp8: fp16, fp8_fragments.cuh)

  /// Accumulator fragments set to zero (S before Q K^T, O at an item's start).
  template <int N>
  __device__ static void zero(float (&x)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[i][e] = 0.0f;
    }
  }

  /// Q of row `r` (zero when padding) for k16 step kk: the pairs of k 2t, 2t + 1 (w = 0)
  /// and 2t + 8, 2t + 9 (w = 1): dims 16 kk + 2t and + 8 (m16n8k16), or 16 kk + 4t and
  /// + 2 in qk_fp8's order; in the query's dtype (to_qk converts).
  struct QRow {
    const uint32_t* q;
    bool valid;
    __device__ QRow(const AttentionArgs& a, const RowDesc& d)
        : q(reinterpret_cast<const uint32_t*>(static_cast<const T*>(a.q) +
                                              (d.valid ? d.qrow * a.q_row_stride + int64_t{d.head} * a.q_head_stride
                                                       : 0))),
          valid(d.valid) {}
    __device__ uint32_t operator()(int kk, int w, int t4) const {
      const int off = Pol::kFp8 ? 2 * t4 + w : t4 + 4 * w;
      return valid ? __ldg(q + kk * 8 + off) : 0u;
    }
  };

  /// Q registers as the mma's operand: a bf16 query rounded to fp16 where S is computed in
  /// fp16 (separate from the loads, which may be issued an item ahead).
  template <int MT, int NQ>
  __device__ static void to_qk(uint32_t (&q)[MT][D / 16][NQ]) {
    if constexpr (!std::is_same<QkT, T>::value) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
          for (int e = 0; e < NQ; ++e) q[mt][kk][e] = bf16x2_to_half_sat(q[mt][kk][e]);
        }
      }
    }
  }
};

template <class Pol, class T, int kTiles = 1>
struct RowTileM : RowTileBase<Pol, T> {
  using B = RowTileBase<Pol, T>;
  using typename B::QkT;
  using typename B::QRow;
  using Frag = RowsInM;
  static constexpr int D = B::D, KW = B::KW, TK = B::TK;
  static constexpr int MT = kTiles, kRows = 16 * MT, NS = KW / 8, NA = D / 8, NQ = 4;
  // The fp8 fragments' view of the warp's tile (D, KW, QkT): MT m16 row tiles.
  struct Fp8Tile : B {
    static constexpr int MT = kTiles;
  };

  __device__ static int row(int mt, int h, int lane) { return (lane >> 2) + 8 * h + 16 * mt; }
  __device__ static bool holds_stats(int lane) { return (lane & 3) == 0; }

  /// Q of rows 16 mt + g and + 8 as A fragments (in T: to_qk before the mma).
  template <class Rows>
  __device__ static void load_q(const AttentionArgs& a, const Rows& rows, int lane, uint32_t (&q)[MT][D / 16][NQ]) {
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const QRow r0(a, rows(16 * mt + g)), r1(a, rows(16 * mt + g + 8));
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        q[mt][kk][0] = r0(kk, 0, t4);
        q[mt][kk][1] = r1(kk, 0, t4);
        q[mt][kk][2] = r0(kk, 1, t4);
        q[mt][kk][3] = r1(kk, 1, t4);
      }
    }
  }

  /// S = Q K^T over the warp tile's KW keys.
  __device__ static void qk(const uint32_t (&q)[MT][D / 16][NQ], uint32_t k_base, int warp, int lane,
                            float (&s)[MT][NS][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) B::zero(s[mt]);
    if constexpr (Pol::kFp8) {
      const auto q_frag = [&](int chunk, int mt, uint32_t(&f)[4]) {
#pragma unroll
        for (int e = 0; e < 4; ++e) f[e] = q[mt][chunk][e];
      };
      qk_fp8<Fp8Tile>(s, q_frag, k_base, warp, lane);
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < KW / 16; ++np) {
          uint32_t kb[4];
          const int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(kb, k_base + tile_offset(TK, warp * KW + key, 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<T>(s[mt][2 * np], q[mt][kk], kb[0], kb[1]);
            mma_16816<T>(s[mt][2 * np + 1], q[mt][kk], kb[2], kb[3]);
          }
        }
      }
    }
  }

  /// O += P V with P the tile's probabilities (fp8: accumulators in pv_fp8's even / odd
  /// dim layout).
  __device__ static void pv(const float (&s)[MT][NS][4], uint32_t v_base, int warp, int lane,
                            float (&acc)[MT][NA][4]) {
    if constexpr (Pol::kFp8) {
      pv_fp8<Fp8Tile>(acc, s, v_base, warp, lane);
    } else {
#pragma unroll
      for (int kk = 0; kk < KW / 16; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) p_fragment<T>(pa[mt], s[mt], kk);
        const int key = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_base + tile_offset(TK, warp * KW + key, 2 * dp + (lane >> 4)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<T>(acc[mt][2 * dp], pa[mt], vb[0], vb[1]);
            mma_16816<T>(acc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
  }

  /// buf[row][dim] (row stride Pol::kOStride) = (kAdd: +=) acc * f[h] for the thread's
  /// rows: in the m16n8 layout acc[i][2h], acc[i][2h + 1] are dims 8i + 2t, + 1; in
  /// pv_fp8's (i = 2c + e) acc[2c][2h + e], acc[2c + 1][2h + e] are 16c + 4t + 2e, + 1.
  template <bool kAdd>
  __device__ static void to_buffer(float* buf, const float (&acc)[MT][NA][4], const float (&f)[MT][2], int lane) {
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < NA; ++i) {
          const float(&c)[NA][4] = acc[mt];
          const float2 z = Pol::kFp8 ? make_float2(c[i & ~1][2 * h + (i & 1)], c[i | 1][2 * h + (i & 1)])
                                     : make_float2(c[i][2 * h], c[i][2 * h + 1]);
          // Pair and lane offsets apart, so the stores keep constant offsets.
          const int pair = Pol::kFp8 ? 16 * (i >> 1) + 2 * (i & 1) : 8 * i;
          float2* x = reinterpret_cast<float2*>(buf + (16 * mt + g + 8 * h) * Pol::kOStride + pair +
                                                (Pol::kFp8 ? 4 : 2) * t4);
          if constexpr (kAdd) {
            const float2 y = *x;
            *x = make_float2(y.x + z.x * f[mt][h], y.y + z.y * f[mt][h]);
          } else {
            *x = make_float2(z.x * f[mt][h], z.y * f[mt][h]);
          }
        }
      }
    }
  }
};

template <class Pol, class T>
struct RowTileN : RowTileBase<Pol, T> {
  using B = RowTileBase<Pol, T>;
  using typename B::PvT;
  using typename B::QkT;
  using typename B::QRow;
  using Frag = RowsInN;
  // MT: the item's KV heads (policy.h kItemHeads), one 8-row tile each over its D-dim
  // part of the ring's rows (fp8: kRaw 16-byte chunks a row, head mt's from mt D / 16;
  // 16-bit: head mt's chunks from mt D / 8).
  static constexpr int D = B::D, KW = B::KW, TK = B::TK, kRaw = Pol::kChunks;
  static constexpr int MT = Pol::kItemHeads, kRows = 8, NS = KW / 16, NA = D / 16, NQ = 2;

  __device__ static int row(int mt, int h, int lane) { return 8 * mt + 2 * (lane & 3) + h; }
  __device__ static bool holds_stats(int lane) { return lane < 4; }

  /// Q of row g of each tile as B fragments (k: dims, n: rows; in T: to_qk before the
  /// mma).
  template <class Rows>
  __device__ static void load_q(const AttentionArgs& a, const Rows& rows, int lane, uint32_t (&q)[MT][D / 16][NQ]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const QRow r(a, rows(8 * mt + (lane >> 2)));
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        q[mt][kk][0] = r(kk, 0, lane & 3);
        q[mt][kk][1] = r(kk, 1, lane & 3);
      }
    }
  }

  /// S^T = K Q^T over the warp tile's KW keys: s[mt][i] holds keys 16i + g (e = 0, 1) and
  /// 16i + g + 8 (e = 2, 3) of rows 2t (even e) and 2t + 1 (odd e) of tile mt.
  __device__ static void qk(const uint32_t (&qm)[MT][D / 16][NQ], uint32_t k_base, int warp, int lane,
                            float (&sm)[MT][NS][4]) {
    if constexpr (Pol::kFp8) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint32_t(&q)[D / 16][NQ] = qm[mt];
        float(&s)[NS][4] = sm[mt];
        B::zero(s);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk += 2) {
#pragma unroll
          for (int i = 0; i < NS; ++i) {
            uint32_t b[2][2][2];
            k_fragments_fp8<QkT, kRaw>(b, k_base, warp * KW + 16 * i, mt * (D / 16) + kk, lane);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const uint32_t ka[4] = {b[j][0][0], b[j][1][0], b[j][0][1], b[j][1][1]};
              mma_16816<QkT>(s[i], ka, q[kk + j][0], q[kk + j][1]);
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint32_t(&q)[D / 16][NQ] = qm[mt];
        float(&s)[NS][4] = sm[mt];
        B::zero(s);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
          for (int i = 0; i < NS; ++i) {
            // Matrices: keys 0-7 / 8-15 of dims 16 kk .. + 7, then of dims + 8 .. + 15: A's
            // a0 .. a3 in the registers ldmatrix writes (no moves before the mma).
            uint32_t ka[4];
            const int key = 16 * i + (lane & 7) + (((lane >> 3) & 1) << 3);
            ldmatrix_x4(ka, k_base + tile_offset(TK, warp * KW + key, mt * (D / 8) + 2 * kk + (lane >> 4)));
            mma_16816<T>(s[i], ka, q[kk][0], q[kk][1]);
          }
        }
      }
    }
  }

  /// O^T += V^T P^T: acc[mt][c] holds dims of the 16-dim chunk c for rows 2t (even e)
  /// and 2t + 1 (odd e) of tile mt: 16c + g (e = 0, 1) and 16c + g + 8 (e = 2, 3); fp8
  /// (v_fragments_fp8's rows) 16c + 2g and 16c + 2g + 1.
  __device__ static void pv(const float (&sm)[MT][NS][4], uint32_t v_base, int warp, int lane,
                            float (&accm)[MT][NA][4]) {
#pragma unroll
    for (int kk = 0; kk < KW / 16; ++kk) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const float(&s)[NS][4] = sm[mt];
        float(&acc)[NA][4] = accm[mt];
        // P^T's B fragment (k: keys 2t, 2t + 1 and + 8; n: row g) is the transpose of S^T's
        // 8x8 blocks (keys g / g + 8, rows 2t, 2t + 1).
        const uint32_t pb0 = movmatrix_trans(pack2<PvT>(s[kk][0], s[kk][1]));
        const uint32_t pb1 = movmatrix_trans(pack2<PvT>(s[kk][2], s[kk][3]));
        if constexpr (Pol::kFp8) {
#pragma unroll
          for (int c = 0; c < NA; c += 2) {
            uint32_t even[2][2], odd[2][2];
            v_fragments_fp8<kRaw>(even, odd, v_base, warp * KW + 16 * kk, mt * NA + c, lane);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const uint32_t va[4] = {even[j][0], odd[j][0], even[j][1], odd[j][1]};
              mma_16816<__half>(acc[c + j], va, pb0, pb1);
            }
          }
        } else {
          const int key = kk * 16 + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
          for (int dp = 0; dp < D / 16; ++dp) {
            // Matrices (transposed): dims 16 dp .. + 7 / + 8 .. + 15 of keys 0-7, then of
            // keys 8-15: A's a0 .. a3 in the registers ldmatrix writes.
            uint32_t va[4];
            ldmatrix_x4_trans(va,
                              v_base + tile_offset(TK, warp * KW + key, mt * (D / 8) + 2 * dp + ((lane >> 3) & 1)));
            mma_16816<T>(acc[dp], va, pb0, pb1);
          }
        }
      }
    }
  }

  /// buf[row][dim] = (kAdd: +=) acc * f[h] for rows 8 mt + 2t + h (pv's layout: fp8 as
  /// float2 pairs of dims 2g, 2g + 1).
  template <bool kAdd>
  __device__ static void to_buffer(float* buf, const float (&accm)[MT][NA][4], const float (&fm)[MT][2], int lane) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) to_buffer_tile<kAdd>(buf + 8 * mt * Pol::kOStride, accm[mt], fm[mt], lane);
  }

  template <bool kAdd>
  __device__ static void to_buffer_tile(float* buf, const float (&acc)[NA][4], const float (&f)[2], int lane) {
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* r = buf + (2 * t4 + h) * Pol::kOStride;
#pragma unroll
      for (int c = 0; c < NA; ++c) {
        if constexpr (Pol::kFp8) {
          float2* x = reinterpret_cast<float2*>(r + 16 * c + 2 * g);
          if constexpr (kAdd) {
            const float2 y = *x;
            *x = make_float2(y.x + acc[c][h] * f[h], y.y + acc[c][h + 2] * f[h]);
          } else {
            *x = make_float2(acc[c][h] * f[h], acc[c][h + 2] * f[h]);
          }
        } else {
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            float* x = r + 16 * c + g + 8 * w;
            *x = kAdd ? *x + acc[c][h + 2 * w] * f[h] : acc[c][h + 2 * w] * f[h];
          }
        }
      }
    }
  }
};

}  // namespace pagedmha::cuda::sm90
