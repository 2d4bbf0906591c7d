// mma fragments straight from raw fp8 e4m3 K / V tiles in shared memory (no dequantised
// copy, no extra barrier): ldmatrix treats each pair of fp8 bytes as one b16 element and
// the registers are converted in place (exact: e4m3 is a subset of bf16 and fp16).
//
// S = Q K^T: a non-transposed ldmatrix of 8 keys x 16 fp8 dims gives lane (g, t) the
//   dims 4t..4t+3 of key g. They serve as the B fragment's k indices (2t, 2t+1, 2t+8,
//   2t+9); the dot product is invariant under permuting k if Q uses the same one, so Q's
//   A fragment takes dims 4t..4t+3 of its rows (one 8-byte load per row) for those k.
// O += P V: a transposed ldmatrix of 8 keys x 16 fp8 dims gives lane (g, t) the bytes
//   (key 2t, dim 2g), (2t, 2g + 1), (2t + 1, 2g), (2t + 1, 2g + 1): one byte permute splits
//   them into the B fragments (keys 2t, 2t + 1) of dim 2g and of dim 2g + 1. So of a
//   16-dim chunk c, accumulator 2c holds the even dims and 2c + 1 the odd ones:
//   acc[2c][e], e = 0, 1 -> dim 16c + 4t + 2e; acc[2c + 1][e] -> 16c + 4t + 2e + 1
//   (rows g, and g + 8 for e = 2, 3). P and V use fp16 mma: P in [0, 1] keeps more bits
//   in fp16 than in bf16, and fp8 -> fp16 is one instruction per pair.
// The operand-swapped decode tile (decode_sm90/row_tile.cuh RowTileN) uses the same
// registers as A fragments: K's keys as rows, and V^T's even / odd dims as rows g / g + 8
// of one accumulator (k_fragments_fp8, v_fragments_fp8).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/paged_loader.cuh"

namespace pagedmha::cuda {

/// Q's A fragment for qk_fp8 from a swizzled [rows][kChunks] 16-bit Q tile in shared
/// memory: rows r and r + 8, dims 16 chunk + 4t .. + 3 (one 8-byte load per row).
template <int kChunks>
__device__ __forceinline__ void q_fragment_fp8_order(uint32_t (&qa)[4], uint32_t q_base, int r, int chunk, int lane) {
  const int t = lane & 3;
  const int c = 2 * chunk + (t >> 1);  // 16-byte chunk holding dims 16 chunk + 4t .. + 3
  const uint32_t off = (t & 1) * 8;
  lds64(qa[0], qa[2], q_base + swizzle<kChunks>(r, c) + off);
  lds64(qa[1], qa[3], q_base + swizzle<kChunks>(r + 8, c) + off);
}

/// K fragments of the 16 keys from `key` (a multiple of 16) of a raw fp8 K tile at k_base,
/// fp8 chunks kk and kk + 1 (dims 16 kk .. 16 kk + 31) converted to T: b[j][n] is the
/// B fragment (k: chunk kk + j's dims in the permuted order above; n: keys key + 8 n ..
/// + 7). Stacked, b[j][0] and b[j][1] are also the A fragment of those 16 keys as rows
/// (operand-swapped S^T = K Q^T): {b[j][0][0], b[j][1][0], b[j][0][1], b[j][1][1]}.
template <class T, int kRaw>
__device__ __forceinline__ void k_fragments_fp8(uint32_t (&b)[2][2][2], uint32_t k_base, int key, int kk, int lane) {
  // Matrices: keys 0-7 / 8-15 of the 16-key block, fp8 chunks kk / kk + 1.
  uint32_t kw[4];
  ldmatrix_x4(kw, k_base + swizzle_rows<kRaw>(key + (lane & 7) + (((lane >> 3) & 1) << 3), kk + (lane >> 4)));
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    fp8x4_to<T>(kw[2 * j], b[j][0][0], b[j][0][1]);
    fp8x4_to<T>(kw[2 * j + 1], b[j][1][0], b[j][1][1]);
  }
}

/// V fragments of the 16 keys from `key` (a k16 step of P V) of a raw fp8 V tile at
/// v_base, fp8 chunks c and c + 1, in fp16: even[j] / odd[j] are the B fragments (k: the
/// 16 keys; n = g: dim 16 (c + j) + 2g, or + 1). Stacked they are also the A fragment of
/// V^T with rows g -> dim 2g and g + 8 -> dim 2g + 1 (operand-swapped O^T = V^T P^T):
/// {even[j][0], odd[j][0], even[j][1], odd[j][1]}.
template <int kRaw>
__device__ __forceinline__ void v_fragments_fp8(uint32_t (&even)[2][2], uint32_t (&odd)[2][2], uint32_t v_base,
                                                int key, int c, int lane) {
  // Matrices: keys 0-7 / 8-15 of the k16 step, fp8 chunks c / c + 1.
  uint32_t vw[4];
  ldmatrix_x4_trans(vw, v_base + swizzle_rows<kRaw>(key + (lane & 7) + (((lane >> 3) & 1) << 3), c + (lane >> 4)));
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    fp8x4_deinterleave_to_half(vw[2 * j], even[j][0], odd[j][0]);      // keys 2t, 2t + 1
    fp8x4_deinterleave_to_half(vw[2 * j + 1], even[j][1], odd[j][1]);  // keys 2t + 8, 2t + 9
  }
}

/// s[mt] += Q K^T over the warp's KW keys (from key wn KW) of a raw fp8 K tile at k_base.
/// q_frag(chunk, mt, qa) gives Q's A fragment of row tile mt for dims 16 chunk .. + 15 in
/// the permuted order above (q_fragment_fp8_order, or registers loaded in that order).
template <class Tr, class QFrag>
__device__ __forceinline__ void qk_fp8(float (&s)[Tr::MT][Tr::KW / 8][4], QFrag q_frag, uint32_t k_base, int wn,
                                       int lane) {
  using T = typename Tr::QkT;  // the mma's 16-bit type
  constexpr int D = Tr::D, KW = Tr::KW, MT = Tr::MT, kRaw = D / 16;
  static_assert(kRaw % 2 == 0, "k16 steps in pairs");
#pragma unroll
  for (int kk = 0; kk < D / 16; kk += 2) {
    uint32_t qa[2][MT][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) q_frag(kk + j, mt, qa[j][mt]);
    }
#pragma unroll
    for (int np = 0; np < KW / 16; ++np) {
      uint32_t b[2][2][2];
      k_fragments_fp8<T, kRaw>(b, k_base, wn * KW + np * 16, kk, lane);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(s[mt][2 * np], qa[j][mt], b[j][0][0], b[j][0][1]);
          mma_16816<T>(s[mt][2 * np + 1], qa[j][mt], b[j][1][0], b[j][1][1]);
        }
      }
    }
  }
}

/// acc[mt] += P V over the warp's KW keys of a raw fp8 V tile at v_base (P = s, already
/// exponentiated); accumulator columns in the even / odd layout above.
template <class Tr>
__device__ __forceinline__ void pv_fp8(float (&acc)[Tr::MT][Tr::D / 8][4], const float (&s)[Tr::MT][Tr::KW / 8][4],
                                       uint32_t v_base, int wn, int lane) {
  constexpr int D = Tr::D, KW = Tr::KW, MT = Tr::MT, kRaw = D / 16;
#pragma unroll
  for (int kk = 0; kk < KW / 16; ++kk) {
    uint32_t pa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) p_fragment<__half>(pa[mt], s[mt], kk);
#pragma unroll
    for (int c = 0; c < kRaw; c += 2) {
      uint32_t even[2][2], odd[2][2];
      v_fragments_fp8<kRaw>(even, odd, v_base, wn * KW + kk * 16, c, lane);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<__half>(acc[mt][2 * (c + j)], pa[mt], even[j][0], even[j][1]);
          mma_16816<__half>(acc[mt][2 * (c + j) + 1], pa[mt], odd[j][0], odd[j][1]);
        }
      }
    }
  }
}

/// Dims 16c + 4t .. 16c + 4t + 3 of row g (h = 0) or g + 8 (h = 1) from an accumulator
/// in the even / odd layout of pv_fp8.
template <int ND>
__device__ __forceinline__ float4 fp8_acc_dims(const float (&acc)[ND][4], int c, int h) {
  return make_float4(acc[2 * c][2 * h], acc[2 * c + 1][2 * h], acc[2 * c][2 * h + 1], acc[2 * c + 1][2 * h + 1]);
}

}  // namespace pagedmha::cuda
