// Decode (and speculative verify) attention with split-KV decided per request on the
// device. The G query heads x q_len_per_req queries of a KV head are packed into the
// rows of one query tile, so each K/V byte is read once per KV head.
//
// Work items: (request, KV head, row chunk, split). A request's split count depends only
// on its own visible key count (decode_split), never on the batch, so a request gives
// bitwise the same result in any batch (CUDA-graph padding, docs/semantics.md section 4).
// Three launches, all sized from shapes and the device only (graph-safe):
//   1. decode_plan_kernel (1 CTA): exclusive prefix of work items per request;
//   2. decode_kernel: a persistent grid (CTAs that fit the GPU at once) loops over the
//      live items; a single-split request writes its output directly, others write
//      unnormalised partials (O, m, l) into the workspace;
//   3. decode_merge_kernel: combines the partials of split requests, the sink counted
//      once, empty splits skipped.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "core/problem.h"
#include "cuda/common/arch.h"
#include "cuda/common/attention_mainloop.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/decode/decode_split.h"

namespace pagedmha::cuda {


/// A request's split-KV decomposition: its key tiles [t0, t0 + nt) (tiles of a.split_tile
/// keys covering the keys any of its queries can see) and the split count.
struct DecodeSplit {
  int t0, nt, count;
};

/// Depends only on L, the problem's constants and the tile size (never the batch).
__device__ __forceinline__ DecodeSplit decode_split(const AttentionArgs& a, int L) {
  const int tile = a.split_tile;
  const int first = static_cast<int>(a.mask.first_key(L, a.q_len_per_req));
  DecodeSplit s;
  s.t0 = first / tile;
  s.nt = max((L + tile - 1) / tile - s.t0, 0);
  const int keys = max(L - first, 0);
  const int want = a.forced_splits > 0 ? a.forced_splits : (keys + kKeysPerSplit - 1) / kKeysPerSplit;
  s.count = max(1, min(want, kMaxSplits));
  return s;
}

/// Writes work_prefix[0..batch]: exclusive prefix sums of Hkv * row_chunks * splits(b).
/// (A template only so that the header can be included by several translation units.)
template <int kPlanThreads>
__global__ void __launch_bounds__(kPlanThreads) decode_plan_kernel(const AttentionArgs a) {
  static_assert(kPlanThreads == 1024, "warp 0 scans the 32 warp sums");
  __shared__ int warp_sums[kPlanThreads / 32];
  __shared__ int carry;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int per_split = a.num_kv_heads * a.row_chunks;
  if (threadIdx.x == 0) {
    carry = 0;
    a.work_prefix[0] = 0;
  }
  for (int base = 0; base < a.batch; base += kPlanThreads) {
    const int b = base + threadIdx.x;
    int x = b < a.batch ? decode_split(a, max(a.seq_lens[b], 0)).count * per_split : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int w = warp_sums[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += y;
      }
      warp_sums[lane] = w;
    }
    __syncthreads();
    const int incl = carry + x + (warp > 0 ? warp_sums[warp - 1] : 0);
    if (b < a.batch) a.work_prefix[b + 1] = incl;
    __syncthreads();  // everyone has read carry
    if (threadIdx.x == kPlanThreads - 1) carry = incl;
    __syncthreads();
  }
}

/// The request of work item `item`: the largest b with prefix[b] <= item (the prefix is
/// strictly increasing: every request has at least one item). All threads of the CTA
/// call it; one load per thread per round (one round up to kThreads requests). Also a
/// block-wide barrier.
template <int kThreads>
__device__ __forceinline__ int find_request(const int32_t* prefix, int batch, int item) {
  int lo = 0, span = batch;  // invariant: prefix[lo] <= item, answer in [lo, lo + span)
  while (true) {
    const int step = (span + kThreads - 1) / kThreads;
    const int off = static_cast<int>(threadIdx.x) * step;
    const int n = __syncthreads_count(off < span && prefix[lo + off] <= item);
    lo += (n - 1) * step;
    if (step == 1) return lo;
    span = min(step, span - (n - 1) * step);
  }
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

/// A split's partial result: O unnormalised (relative to the split's integer reference
/// m, see online_softmax.cuh) and (m, l); m = -inf when the split saw no key. No sink,
/// no bmm2_scale: the merge applies both exactly as DirectOut does.
template <int D, class RowMap>
struct PartialOut {
  const AttentionArgs& a;
  const RowMap& rows;
  int split;

  __device__ int64_t slot(int r) const {
    const RowDesc d = rows(r);
    return (d.qrow * a.num_q_heads + d.head) * kMaxSplits + split;
  }
  __device__ bool row_valid(int r) const { return rows(r).valid; }
  __device__ float finish_row(int r, float m, float l) const {
    if (!rows(r).valid) return 0.0f;
    a.ws_ml[slot(r)] = make_float2(m, l);
    return 1.0f;
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
  const AttentionSmem<Tr> sm{smem_raw};
  const int total = a.work_prefix[a.batch];
  for (int item = blockIdx.x; item < total; item += gridDim.x) {
    // Also the barrier between the previous item's epilogue and this item's setup.
    const int b = find_request<Tr::kThreads>(a.work_prefix, a.batch, item);
    const int L = max(a.seq_lens[b], 0);
    const DecodeSplit sp = decode_split(a, L);
    int local = item - a.work_prefix[b];
    const int split = local % sp.count;
    local /= sp.count;
    const int chunk = local % a.row_chunks, kv_head = local / a.row_chunks;

    const DecodeRows rows{a, b, kv_head, chunk * Tr::M, L};
    const KeyRange kr = setup_rows<Tr>(a, sm, rows);
    // This split's share of the request's tiles, clipped to the keys these rows see.
    const int tb = max(sp.t0 + static_cast<int>(static_cast<int64_t>(split) * sp.nt / sp.count), kr.lo / Tr::BN);
    const int te = min(sp.t0 + static_cast<int>(static_cast<int64_t>(split + 1) * sp.nt / sp.count),
                       (kr.hi + Tr::BN - 1) / Tr::BN);
    WarpResult<Tr> res;
    attention_mainloop<Tr>(a, sm, kr, kv_head, a.page_table + b * a.page_table_row_stride, tb, max(te, tb), res);
    if (sp.count == 1) {
      attention_epilogue<Tr>(sm, res, DirectOut<typename Tr::T, DecodeRows>{a, rows});
    } else {
      attention_epilogue<Tr>(sm, res, PartialOut<Tr::D, DecodeRows>{a, rows, split});
    }
  }
}

/// One warp per (query row, query head) of requests with more than one split. Same
/// arithmetic as the direct epilogue: integer references make every weight
/// exp2(m_s - M) an exact power of two, then finalize_softmax.
template <int D, class T>
__global__ void __launch_bounds__(128) decode_merge_kernel(const AttentionArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (item >= static_cast<int64_t>(a.batch) * a.q_len_per_req * a.num_q_heads) return;
  const int64_t qrow = item / a.num_q_heads;
  const int head = static_cast<int>(item % a.num_q_heads);
  const int b = static_cast<int>(qrow / a.q_len_per_req);
  const int count = decode_split(a, max(a.seq_lens[b], 0)).count;
  if (count <= 1) return;

  // Lane s holds split s's (m, l).
  const float2 ml = lane < count ? a.ws_ml[item * kMaxSplits + lane] : make_float2(-INFINITY, 0.0f);
  float mx = ml.x;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const float w_lane = ml.x == -INFINITY ? 0.0f : fast_exp2(ml.x - mx);  // exact power of two
  float z = ml.y * w_lane;  // summed in split order below, as the warps are in the epilogue
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float l_sum = 0.0f;
  const bool active = lane < D / 8;
  for (int s = 0; s < count; ++s) {
    const float w = __shfl_sync(0xffffffffu, w_lane, s);
    l_sum += __shfl_sync(0xffffffffu, z, s);
    if (active && w > 0.0f) {
      const float4* o = reinterpret_cast<const float4*>(a.ws_o + (item * kMaxSplits + s) * D + 8 * lane);
      const float4 x = o[0], y = o[1];
      acc[0] += w * x.x, acc[1] += w * x.y, acc[2] += w * x.z, acc[3] += w * x.w;
      acc[4] += w * y.x, acc[5] += w * y.y, acc[6] += w * y.z, acc[7] += w * y.w;
    }
  }
  float scale, lse;
  finalize_softmax(mx, l_sum, a.sinks != nullptr ? a.sinks[head] * kLog2e : -INFINITY, a.bmm2_scale, scale, lse);
  if (active) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= scale;
    T* out = static_cast<T*>(a.out) + qrow * a.out_row_stride + head * a.out_head_stride;
    *reinterpret_cast<uint4*>(out + 8 * lane) = pack8<T>(acc);
  }
  if (lane == 0 && a.lse != nullptr) a.lse[qrow * a.lse_row_stride + head * a.lse_head_stride] = lse;
}

/// Resident CTAs per SM of decode_kernel<Tr> on the current device, computed once per
/// (instantiation, device), with its dynamic shared memory limit raised once, not per
/// launch.
template <class Tr>
int resident_ctas_per_sm(int device) {
  const auto kernel = decode_kernel<Tr>;
  constexpr int threads = Tr::kThreads, smem_bytes = Tr::kSmemBytes;
  static std::atomic<int> cache[64];
  std::atomic<int>* slot = device >= 0 && device < 64 ? &cache[device] : nullptr;
  if (slot != nullptr) {
    const int v = slot->load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  allow_dynamic_smem(kernel, smem_bytes);
  int n = 0;
  PAGEDMHA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem_bytes));
  n = std::max(n, 1);
  if (slot != nullptr) slot->store(n, std::memory_order_relaxed);
  return n;
}

// Per-tile costs (barrier, Q fragment reloads, softmax and O rescale, page ids) do not
// scale with the bytes: with 4 warps splitting the keys, rows of <= 128 bytes (fp8
// D <= 128, bf16 / fp16 D = 64) take 32 keys per warp, so a warp still streams 8 KB of
// K + V per tile (as bf16 D = 128 does with 16 keys) in the same 32 KB stages.
template <int D, class T, class KV, int WM>
using DecodeTraits =
    AttentionTraits<D, T, KV, WM, 1, WM == 1 && D * static_cast<int>(sizeof(KV)) <= 128 ? 32 : 0>;

/// Launches plan, attention and merge for one (head dim, T, KV, warp layout); `a` is
/// complete except for the tile configuration chosen here.
template <int D, class T, class KV, int WM>
void launch_decode_config(AttentionArgs a, int device, int sm_count, cudaStream_t stream) {
  using Tr = DecodeTraits<D, T, KV, WM>;
  a.split_tile = Tr::BN;
  a.row_chunks = ceil_div(a.group * a.q_len_per_req, Tr::M);
  constexpr int kPlanThreads = 1024;
  decode_plan_kernel<kPlanThreads><<<1, kPlanThreads, 0, stream>>>(a);
  PAGEDMHA_CUDA_CHECK_LAUNCH();

  const int max_count = a.forced_splits > 0 ? std::min(a.forced_splits, kMaxSplits) : kMaxSplits;
  const int64_t max_items = static_cast<int64_t>(a.batch) * a.num_kv_heads * a.row_chunks * max_count;
  const int per_sm = resident_ctas_per_sm<Tr>(device);
  const int64_t grid = std::min<int64_t>(max_items, static_cast<int64_t>(per_sm) * sm_count);
  decode_kernel<Tr><<<static_cast<unsigned>(grid), Tr::kThreads, Tr::kSmemBytes, stream>>>(a);
  PAGEDMHA_CUDA_CHECK_LAUNCH();

  if (max_count > 1) {
    const int64_t rows = static_cast<int64_t>(a.batch) * a.q_len_per_req * a.num_q_heads;
    decode_merge_kernel<D, T><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(a);
    PAGEDMHA_CUDA_CHECK_LAUNCH();
  }
}

/// Tile choice: 16 packed rows with the KV tile split over 4 warps when the G * n rows
/// fit and the GPU has the shared memory (sm_86 / sm_89 have 99 KB per CTA; some 16-row
/// configurations take up to 137 KB), else 64-row tiles (row chunks beyond 64 become
/// more work items), which fit every supported GPU.
template <int D, class T, class KV>
void launch_decode(const AttentionArgs& a, int device, int sm_count, cudaStream_t stream) {
  static_assert(DecodeTraits<D, T, KV, 4>::kSmemBytes <= kSm89SmemPerBlock, "64-row decode tiles fit sm_89");
  if (a.group * a.q_len_per_req <= 16 && DecodeTraits<D, T, KV, 1>::kSmemBytes <= max_smem_per_block(device)) {
    launch_decode_config<D, T, KV, 1>(a, device, sm_count, stream);
  } else {
    launch_decode_config<D, T, KV, 4>(a, device, sm_count, stream);
  }
}

}  // namespace pagedmha::cuda
