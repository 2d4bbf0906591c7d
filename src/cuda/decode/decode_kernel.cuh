// Decode (and speculative verify) attention: one CTA per (request, KV head, row chunk,
// split). The G query heads x q_len_per_req queries of a KV head are packed into the
// rows of one query tile, so each K/V byte is read once per KV head. The number of
// splits is chosen on the device from the live seq_lens (CUDA-graph safe): CTAs past it
// exit, a request with one split writes its output directly, otherwise partials go to
// the workspace and decode_merge_kernel combines them (the sink counted once).
#pragma once

#include <cuda_runtime.h>

#include "core/problem.h"
#include "cuda/common/attention_mainloop.cuh"
#include "cuda/common/launch.cuh"

namespace pagedmha::cuda {

/// Fewest keys one split handles when the count is chosen from the length.
constexpr int kMinKeysPerSplit = 512;

/// Split count of a request with L keys, and its tile range [t0, t0 + nt) (tiles of
/// a.split_tile keys covering the keys any of its queries can see). Shared by the
/// attention and merge kernels so both agree.
__device__ __forceinline__ int decode_splits(const AttentionArgs& a, int L, int& t0, int& nt) {
  const int tile = a.split_tile;
  const int first = a.window_left >= 0 ? max(L - a.q_len_per_req - a.window_left, 0) : 0;
  t0 = first / tile;
  nt = max((L + tile - 1) / tile - t0, 0);
  const int want = a.forced_splits > 0 ? a.forced_splits : (nt * tile + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  return max(1, min(want, a.max_splits));
}

/// Row r of chunk `row_base / M` of (request b, KV head): packed index pr = i * G + j is
/// query i of query head kv_head * G + j.
struct DecodeRows {
  const AttentionArgs& a;
  int b, kv_head, row_base, L;

  __device__ RowDesc operator()(int r) const {
    const int G = a.group, n = a.q_len_per_req;
    const int pr = row_base + r;
    RowDesc d{};
    d.valid = pr < G * n;
    if (!d.valid) return d;
    const int i = pr / G;
    d.qrow = static_cast<int64_t>(b) * n + i;
    d.head = kv_head * G + (pr - i * G);
    visible_keys(a, L, L - n + i, d.lo, d.hi);
    return d;
  }
};

/// A split's partial result: o normalised by the split's own sum (fp32) and its
/// log2-sum-exp (-inf when the split saw no key). No sink, no bmm2_scale.
template <int D, class RowMap>
struct PartialOut {
  const AttentionArgs& a;
  const RowMap& rows;
  int split;

  __device__ int64_t slot(int r) const {
    const RowDesc d = rows(r);
    return (d.qrow * a.num_q_heads + d.head) * a.max_splits + split;
  }
  __device__ bool row_valid(int r) const { return rows(r).valid; }
  __device__ float finish_row(int r, float m, float l) const {
    if (!rows(r).valid) return 0.0f;
    a.ws_lse[slot(r)] = l > 0.0f ? m + __log2f(l) : -INFINITY;
    return l > 0.0f ? 1.0f / l : 0.0f;
  }
  __device__ void store8(int r, int c, const float (&v)[8]) const {
    float4* o = reinterpret_cast<float4*>(a.ws_o + slot(r) * D + 8 * c);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
};

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) decode_kernel(const AttentionArgs a) {
  extern __shared__ __align__(128) char smem_raw[];
  const int b = blockIdx.x;
  const int kv_head = blockIdx.y % a.num_kv_heads, chunk = blockIdx.y / a.num_kv_heads;
  const int split = blockIdx.z;
  const int L = max(a.seq_lens[b], 0);
  int t0, nt;
  const int num_splits = decode_splits(a, L, t0, nt);
  if (split >= num_splits) return;

  const AttentionSmem<Tr> sm{smem_raw};
  const DecodeRows rows{a, b, kv_head, chunk * Tr::M, L};
  const KeyRange kr = setup_rows<Tr>(a, sm, rows);
  // This split's share of the request's tiles, clipped to the keys these rows see.
  const int tb = max(t0 + static_cast<int>(static_cast<int64_t>(split) * nt / num_splits), kr.lo / Tr::BN);
  const int te = min(t0 + static_cast<int>(static_cast<int64_t>(split + 1) * nt / num_splits),
                     (kr.hi + Tr::BN - 1) / Tr::BN);
  WarpResult<Tr> res;
  attention_mainloop<Tr>(a, sm, kr, kv_head, a.page_table + b * a.page_table_row_stride, tb, max(te, tb), res);
  if (num_splits == 1) {
    attention_epilogue<Tr>(sm, res, DirectOut<typename Tr::T, DecodeRows>{a, rows});
  } else {
    attention_epilogue<Tr>(sm, res, PartialOut<Tr::D, DecodeRows>{a, rows, split});
  }
}

/// One warp per (query row, query head) of requests that used more than one split.
template <int D, class T>
__global__ void __launch_bounds__(128) decode_merge_kernel(const AttentionArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (item >= static_cast<int64_t>(a.batch) * a.q_len_per_req * a.num_q_heads) return;
  const int64_t qrow = item / a.num_q_heads;
  const int head = static_cast<int>(item % a.num_q_heads);
  const int b = static_cast<int>(qrow / a.q_len_per_req);
  int t0, nt;
  const int num_splits = decode_splits(a, max(a.seq_lens[b], 0), t0, nt);
  if (num_splits <= 1) return;

  const float* lse = a.ws_lse + item * a.max_splits;
  const float sink = a.sinks != nullptr ? a.sinks[head] * kLog2e : -INFINITY;
  float mx = sink;
  for (int s = 0; s < num_splits; ++s) mx = fmaxf(mx, lse[s]);
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float z = 0.0f;
  const bool active = lane < D / 8;
  if (mx != -INFINITY) {
    for (int s = 0; s < num_splits; ++s) {
      const float w = fast_exp2(lse[s] - mx);  // 0 for empty splits
      z += w;
      if (active && w > 0.0f) {
        const float4* o = reinterpret_cast<const float4*>(a.ws_o + (item * a.max_splits + s) * D + 8 * lane);
        const float4 x = o[0], y = o[1];
        acc[0] += w * x.x, acc[1] += w * x.y, acc[2] += w * x.z, acc[3] += w * x.w;
        acc[4] += w * y.x, acc[5] += w * y.y, acc[6] += w * y.z, acc[7] += w * y.w;
      }
    }
    z += fast_exp2(sink - mx);  // 0 without a sink
  }
  const float scale = mx == -INFINITY ? 0.0f : a.bmm2_scale / z;
  if (active) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= scale;
    T* out = static_cast<T*>(a.out) + qrow * a.out_row_stride + head * a.out_head_stride;
    *reinterpret_cast<uint4*>(out + 8 * lane) = pack8<T>(acc);
  }
  if (lane == 0 && a.lse != nullptr) {
    a.lse[qrow * a.lse_row_stride + head * a.lse_head_stride] = mx == -INFINITY ? -INFINITY : (mx + __log2f(z)) * kLn2;
  }
}

/// Launches decode for one (head dim, query type, cache type); `a` is complete except
/// for split_tile, which depends on the tile configuration chosen here.
template <int D, class T, class KV, int WM>
void launch_decode_config(AttentionArgs a, cudaStream_t stream) {
  using Tr = AttentionTraits<D, T, KV, WM>;
  a.split_tile = Tr::BN;
  const int chunks = ceil_div(a.group * a.q_len_per_req, Tr::M);
  const dim3 grid(static_cast<unsigned>(a.batch), static_cast<unsigned>(a.num_kv_heads * chunks),
                  static_cast<unsigned>(a.max_splits));
  allow_dynamic_smem(decode_kernel<Tr>, Tr::kSmemBytes);
  decode_kernel<Tr><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(a);
  PAGEDMHA_CUDA_CHECK_LAUNCH();
  if (a.max_splits > 1) {
    const int64_t items = static_cast<int64_t>(a.batch) * a.q_len_per_req * a.num_q_heads;
    decode_merge_kernel<D, T><<<static_cast<unsigned>((items + 3) / 4), 128, 0, stream>>>(a);
    PAGEDMHA_CUDA_CHECK_LAUNCH();
  }
}

/// Tile choice: 16 packed rows with the KV tile split over 4 warps when the G * n rows
/// fit, else 64-row tiles (row chunks beyond 64 become more CTAs).
template <int D, class T, class KV>
void launch_decode(const AttentionArgs& a, cudaStream_t stream) {
  if (a.group * a.q_len_per_req <= 16) {
    launch_decode_config<D, T, KV, 1>(a, stream);
  } else {
    launch_decode_config<D, T, KV, 4>(a, stream);
  }
}

}  // namespace pagedmha::cuda
