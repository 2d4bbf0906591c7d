// The merge of a split decode call: the partials (O unnormalised, m, l) that the split
// requests' items wrote into the workspace (decode_kernel.cuh PartialOut) are combined
// into o and lse, the sink counted once, empty splits skipped. A row (query row and head)
// of a request with few splits (at most decode_merge_warp_max_splits(D)) is merged by one
// warp, a row of more by a whole CTA: the choice depends on the request's own split
// count only, so its result does not depend on its batch. The kernel is a programmatic
// dependent of the decode grid where its code is sm_90 or later: its CTAs read the
// requests' lengths before they wait for the grid in griddepcontrol.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/common/arch.h"
#include "cuda/common/attention_args.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/decode/policy.h"
#include "cuda/decode/split.cuh"

namespace pagedmha::cuda {

/// A row to merge: (query row, query head) = item / Hq, item % Hq (4 x the rows fit
/// int32: decode_args bounds rows x max_splits, max_splits >= 32), its request's split count (0 past the last row) and the sink in log2
/// units. Read before the grid wait: the decode grid writes neither seq_lens nor sinks.
struct MergeRow {
  int item, qrow, head, count;
  float sink;
};

__device__ __forceinline__ MergeRow merge_row(const AttentionArgs& a, int item, int rows) {
  MergeRow r;
  r.item = item;
  r.qrow = item / a.num_q_heads;
  r.head = item - r.qrow * a.num_q_heads;
  r.count = item < rows ? decode_split(a, max(a.seq_lens[r.qrow / a.q_len_per_req], 0)).count : 0;
  r.sink = a.sinks != nullptr && r.count > 1 ? a.sinks[r.head] * kLog2e : -INFINITY;
  return r;
}

/// Merges row `r` with the whole CTA. Thread (g, c) adds splits g, g + kGroups, ... of
/// the 8 columns [8c, 8c + 8), with the loads of kUnroll splits in flight (the partials'
/// latency, not their bytes, bounds a merge of many splits: policy.h
/// decode_merge_unroll; the sums' order does not depend on it), the first of them issued
/// before the statistics are reduced. The kGroups sums are then added in group order.
/// Integer references make every weight exp2(m_s - M) an exact power of two; then
/// finalize_softmax as the direct epilogue. CTA-uniform.
template <int D, class T, int kUnroll>
__device__ __forceinline__ void merge_by_cta(const AttentionArgs& a, const MergeRow& r) {
  constexpr int kThreads = kDecodeMergeThreads, kChunks = D / 8, kGroups = kThreads / kChunks;
  static_assert(DecodeSplitPolicy::kMaxCap <= kThreads, "one split's (m, l) per thread");
  __shared__ float weight[kThreads];
  __shared__ float red_m[kThreads / 32], red_l[kThreads / 32];
  __shared__ float4 part[kGroups][kChunks][2];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int count = r.count;
  const int64_t slot0 = int64_t{r.item} * a.max_splits;
  const int g = tid / kChunks, c = tid % kChunks;
  float4 x[kUnroll][2];
  const auto load = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int s = s0 + u * kGroups;
      if (s < count) {
        const float4* o = reinterpret_cast<const float4*>(a.ws_o + (slot0 + s) * D + 8 * c);
        x[u][0] = o[0];
        x[u][1] = o[1];
      }
    }
  };
  const float2 ml = tid < count ? a.ws_ml[slot0 + tid] : make_float2(-INFINITY, 0.0f);
  load(g);
  float mx = ml.x;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red_m[warp] = mx;
  __syncthreads();
  mx = fmaxf(fmaxf(red_m[0], red_m[1]), fmaxf(red_m[2], red_m[3]));
  const float w = ml.x == -INFINITY ? 0.0f : fast_exp2(ml.x - mx);  // exact power of two
  weight[tid] = w;
  float z = ml.y * w;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
  if (lane == 0) red_l[warp] = z;
  __syncthreads();
  const float l_sum = (red_l[0] + red_l[1]) + (red_l[2] + red_l[3]);

  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int s0 = g; s0 < count;) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int s = s0 + u * kGroups;
      const float ws = s < count ? weight[s] : 0.0f;
      if (ws > 0.0f) {  // a split that saw no key adds nothing
        acc[0] += ws * x[u][0].x, acc[1] += ws * x[u][0].y, acc[2] += ws * x[u][0].z, acc[3] += ws * x[u][0].w;
        acc[4] += ws * x[u][1].x, acc[5] += ws * x[u][1].y, acc[6] += ws * x[u][1].z, acc[7] += ws * x[u][1].w;
      }
    }
    s0 += kGroups * kUnroll;
    if (s0 < count) load(s0);
  }
  part[g][c][0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  part[g][c][1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  __syncthreads();

  float scale, lse;
  finalize_softmax(mx, l_sum, r.sink, a.bmm2_scale, scale, lse);
  if (tid < kChunks) {
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int gg = 0; gg < kGroups; ++gg) {
      const float4 p0 = part[gg][tid][0], p1 = part[gg][tid][1];
      v[0] += p0.x, v[1] += p0.y, v[2] += p0.z, v[3] += p0.w;
      v[4] += p1.x, v[5] += p1.y, v[6] += p1.z, v[7] += p1.w;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] *= scale;
    T* out = static_cast<T*>(a.out) + int64_t{r.qrow} * a.out_row_stride + int64_t{r.head} * a.out_head_stride;
    *reinterpret_cast<uint4*>(out + 8 * tid) = pack8<T>(v);
  }
  if (tid == 0 && a.lse != nullptr) a.lse[int64_t{r.qrow} * a.lse_row_stride + int64_t{r.head} * a.lse_head_stride] = lse;
}

/// Merges row `r` (at most decode_merge_warp_max_splits(D) splits) with one warp. Lane i
/// holds columns [i D / 32, (i + 1) D / 32) of every split and loads up to kUnroll
/// splits' partials with the statistics (one round trip for the usual 2-8 splits). The
/// sums follow merge_by_cta's order for such a row, whose thread groups would each hold
/// at most one split: ((0 + w_0 x_0) + w_1 x_1) + ... in split order, each w_s x_s
/// rounded once (w_s is a power of two), the l sum one warp's tree (a design choice: no
/// row of this size is merged by CTA, and no test compares the two). Warp-uniform.
template <int D, class T>
__device__ __forceinline__ void merge_by_warp(const AttentionArgs& a, const MergeRow& r) {
  constexpr int kCols = D / 32, kMaxSplits = decode_merge_warp_max_splits(D);
  constexpr int kUnroll = kMaxSplits < 8 ? kMaxSplits : 8;
  static_assert(kMaxSplits <= 32, "one split's (m, l) per lane");
  const int lane = threadIdx.x & 31;
  const int count = r.count;
  const int64_t slot0 = int64_t{r.item} * a.max_splits;
  const float* part = a.ws_o + slot0 * D + lane * kCols;
  float x[kUnroll][kCols];
  const auto load = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s0 + u < count) {
        const float* src = part + int64_t{s0 + u} * D;
        if constexpr (kCols == 2) {
          const float2 p = *reinterpret_cast<const float2*>(src);
          x[u][0] = p.x, x[u][1] = p.y;
        } else {
#pragma unroll
          for (int e = 0; e < kCols; e += 4) {
            const float4 p = *reinterpret_cast<const float4*>(src + e);
            x[u][e] = p.x, x[u][e + 1] = p.y, x[u][e + 2] = p.z, x[u][e + 3] = p.w;
          }
        }
      }
    }
  };
  const float2 ml = lane < count ? a.ws_ml[slot0 + lane] : make_float2(-INFINITY, 0.0f);
  load(0);
  float mx = ml.x;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const float w = ml.x == -INFINITY ? 0.0f : fast_exp2(ml.x - mx);  // exact power of two
  float l_sum = ml.y * w;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) l_sum += __shfl_xor_sync(0xffffffffu, l_sum, o);

  float v[kCols];
#pragma unroll
  for (int e = 0; e < kCols; ++e) v[e] = 0.0f;
  for (int s0 = 0; s0 < count;) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float ws = __shfl_sync(0xffffffffu, w, (s0 + u) & 31);
      if (s0 + u < count && ws > 0.0f) {  // a split that saw no key adds nothing
#pragma unroll
        for (int e = 0; e < kCols; ++e) v[e] = __fadd_rn(v[e], __fmul_rn(ws, x[u][e]));
      }
    }
    s0 += kUnroll;
    if (s0 < count) load(s0);
  }

  float scale, lse;
  finalize_softmax(mx, l_sum, r.sink, a.bmm2_scale, scale, lse);
  uint32_t packed[kCols / 2];
#pragma unroll
  for (int e = 0; e < kCols; e += 2) packed[e / 2] = pack2<T>(v[e] * scale, v[e + 1] * scale);
  T* out = static_cast<T*>(a.out) + int64_t{r.qrow} * a.out_row_stride + int64_t{r.head} * a.out_head_stride +
           lane * kCols;
  if constexpr (kCols == 2) {
    *reinterpret_cast<uint32_t*>(out) = packed[0];
  } else if constexpr (kCols == 4) {
    *reinterpret_cast<uint2*>(out) = make_uint2(packed[0], packed[1]);
  } else {
    static_assert(kCols == 8, "head dims 64, 128, 256");
    *reinterpret_cast<uint4*>(out) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
  if (lane == 0 && a.lse != nullptr) a.lse[int64_t{r.qrow} * a.lse_row_stride + int64_t{r.head} * a.lse_head_stride] = lse;
}

/// The merge: CTA i merges by warp the rows 4i + w of few splits (warp w) and, by CTA,
/// row i if it has more. Which depends on the row's own split count only, so a request's
/// result does not depend on its batch. kUnroll: decode_merge_unroll for the CTA rows;
/// 0 where the call's split bound says no row has more splits than a warp takes, and the
/// grid is a CTA per four rows (launch_decode_merge).
template <int D, class T, int kUnroll>
__global__ void __launch_bounds__(kDecodeMergeThreads) decode_merge_kernel(const AttentionArgs a) {
  static_assert(kDecodeMergeThreads == kDecodeMergeWarps * 32, "a warp's row per warp of the CTA");
  constexpr int kWarpMax = decode_merge_warp_max_splits(D);
  const int rows = a.batch * a.q_len_per_req * a.num_q_heads;
  const MergeRow wr = merge_row(a, static_cast<int>(blockIdx.x) * kDecodeMergeWarps + (threadIdx.x >> 5), rows);
  MergeRow cr{};
  if constexpr (kUnroll > 0) cr = merge_row(a, static_cast<int>(blockIdx.x), rows);
  const bool by_warp = wr.count > 1 && wr.count <= kWarpMax, by_cta = cr.count > kWarpMax;
  // Every thread waits: work after the merge in the stream may read the grid's writes.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (by_warp) merge_by_warp<D, T>(a, wr);
  if constexpr (kUnroll > 0) {
    if (by_cta) merge_by_cta<D, T, kUnroll>(a, cr);
  }
}

/// The merge of a call whose requests have at most max_count = decode_max_split_count(a)
/// > 1 splits (kUnroll as decode_merge_kernel's); a programmatic
/// dependent of the decode grid where the kernel as loaded on `device` holds its
/// griddepcontrol.wait, i.e. runs code generated for sm_90 or later (a build for 80;89
/// JIT-compiles its compute_89 PTX on a Hopper, without the wait; read once per
/// instantiation and device).
template <int D, class T, int kUnroll>
void launch_decode_merge_unrolled(const AttentionArgs& a, int max_count, int device, cudaStream_t stream) {
  static std::atomic<int> waits_cache[kMaxDevices];
  const bool waits = once_per_device(waits_cache, device, [&] {
                       cudaFuncAttributes attr{};
                       PAGEDMHA_CUDA_CHECK(cudaFuncGetAttributes(&attr, decode_merge_kernel<D, T, kUnroll>));
                       return attr.ptxVersion >= 90 && compute_capability(device) >= 90 ? 1 : 0;
                     }) == 1;
  const int rows = a.batch * a.q_len_per_req * a.num_q_heads;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(decode_merge_ctas(D, max_count, rows)));
  cfg.blockDim = dim3(kDecodeMergeThreads);
  cfg.stream = stream;
  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  if (waits) {
    cfg.attrs = pdl;
    cfg.numAttrs = 1;
  }
  PAGEDMHA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_merge_kernel<D, T, kUnroll>, a));
}

/// The merge of a call whose requests have at most max_count = decode_max_split_count(a)
/// > 1 splits (the launcher's, computed once per call).
template <int D, class T>
void launch_decode_merge(const AttentionArgs& a, int max_count, int device, cudaStream_t stream) {
  if (decode_merge_by_warp(D, max_count)) {
    launch_decode_merge_unrolled<D, T, 0>(a, max_count, device, stream);
  } else if (decode_merge_unroll(max_count) == 8) {
    launch_decode_merge_unrolled<D, T, 8>(a, max_count, device, stream);
  } else {
    launch_decode_merge_unrolled<D, T, 4>(a, max_count, device, stream);
  }
}

}  // namespace pagedmha::cuda
