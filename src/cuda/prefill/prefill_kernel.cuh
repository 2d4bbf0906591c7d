// Prefill / extend attention: one CTA per (query tile of Tr::M rows, query head, request) with
// ragged queries (cu_seqlens_q) after a cached prefix of L - n keys. Tiles past a
// request's query count exit; causal tiles stop at the diagonal and windowed tiles start
// at the window, so only boundary tiles pay for masking.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/arch.h"
#include "cuda/common/attention_mainloop.cuh"
#include "cuda/common/launch.cuh"

namespace pagedmha::cuda {

/// Row r of the tile starting at query m0 of request b (query positions L - n + i).
struct PrefillRows {
  const AttentionArgs& a;
  int64_t q_begin;
  int n, L, m0, head;

  __device__ RowDesc operator()(int r) const {
    const int i = m0 + r;
    RowDesc d{};
    d.valid = i < n;
    if (!d.valid) return d;
    d.qrow = q_begin + i;
    d.head = head;
    visible_keys(a, L, L - n + i, d.lo, d.hi);
    return d;
  }
};

// 4 warps x 2 m16 tiles (128 rows) for D <= 128: K / V fragments and tile loads are
// shared by twice the rows; D = 256 keeps 64 rows (its O accumulator alone is 128 regs).
// Keys per tile: 64 at D = 64 (halves the per-tile barrier, row-max shuffles and loader
// work per key; 2 x 32 S registers fit); at D = 128 the traits' 32, since 64 spills
// (O 128 + S 64 registers). PAGEDMHA_PREFILL_KW_D128=64 selects 64 for comparison.
#ifndef PAGEDMHA_PREFILL_KW_D128
#define PAGEDMHA_PREFILL_KW_D128 0
#endif
template <int D, class T, class KV>
using PrefillTraits =
    AttentionTraits<D, T, KV, 4, D <= 128 ? 2 : 1, D == 64 ? 64 : (D == 128 ? PAGEDMHA_PREFILL_KW_D128 : 0), true>;

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) prefill_kernel(const AttentionArgs a) {
  extern __shared__ __align__(128) char smem_raw[];
  const int m_tile = gridDim.x - 1 - blockIdx.x;  // longest (latest) tiles first
  const int head = blockIdx.y, b = blockIdx.z;
  const int q_begin = a.cu_seqlens_q[b];
  const int n = a.cu_seqlens_q[b + 1] - q_begin;
  const int m0 = m_tile * Tr::M;
  if (m0 >= n) return;
  const int L = max(a.seq_lens[b], 0);
  const int kv_head = head / a.group;

  const AttentionSmem<Tr> sm{smem_raw};
  const PrefillRows rows{a, q_begin, n, L, m0, head};
  const KeyRange kr = setup_rows<Tr>(a, sm, rows);
  WarpResult<Tr> res;
  attention_mainloop<Tr>(a, sm, kr, kv_head, a.page_table + b * a.page_table_row_stride, kr.lo / Tr::BN,
                         (kr.hi + Tr::BN - 1) / Tr::BN, res);
  attention_epilogue<Tr>(sm, res, DirectOut<typename Tr::T, PrefillRows>{a, rows});
}

template <int D, class T, class KV>
void launch_prefill(const AttentionArgs& a, int max_q_len, cudaStream_t stream) {
  using Tr = PrefillTraits<D, T, KV>;
  static_assert(Tr::kSmemBytes <= kSm89SmemPerBlock, "prefill tiles fit sm_89");
  const dim3 grid(static_cast<unsigned>(ceil_div(max_q_len, Tr::M)), static_cast<unsigned>(a.num_q_heads),
                  static_cast<unsigned>(a.batch));
  allow_dynamic_smem(prefill_kernel<Tr>, Tr::kSmemBytes);
  prefill_kernel<Tr><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(a);
  PAGEDMHA_CUDA_CHECK_LAUNCH();
}

}  // namespace pagedmha::cuda
