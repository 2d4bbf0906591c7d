// Decode (and speculative verify) attention with split-KV decided per request on the
// device. The G query heads x q_len_per_req queries of a KV head are packed into the
// rows of one query tile, so each K/V byte is read once per KV head.
//
// Work items: (request, KV head, row chunk, split). A request's split count depends only
// on its own visible key count and the problem's constants (policy.h), never on the
// batch, so a request gives bitwise the same result in any batch (CUDA-graph padding,
// docs/semantics.md section 4). Two kernels, sized from shapes and the device only
// (graph-safe):
//   1. decode_kernel: a persistent grid (CTAs that fit the GPU at once). Each CTA scans
//      the requests' item counts itself, 128 requests at a time (no plan kernel), and
//      loops over its items; a single-split request writes its output directly, others
//      write unnormalised partials (O, m, l) into the workspace;
//   2. the merge (merge_kernel.cuh): combines the partials of split requests, the sink
//      counted once, empty splits skipped; a programmatic dependent launch where its code
//      is sm_90 or later.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "core/problem.h"
#include "cuda/common/arch.h"
#include "cuda/common/attention_mainloop.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/decode/merge_kernel.cuh"
#include "cuda/decode/policy.h"
#include "cuda/decode/split.cuh"

namespace pagedmha::cuda {

/// Inclusive prefix sum of one value per thread over the CTA; ends with the CTA
/// synchronised. `warp_sums`: shared [kThreads / 32].
template <int kThreads>
__device__ __forceinline__ int block_inclusive_sum(int x, int* warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  for (int w = 0; w < warp; ++w) x += warp_sums[w];
  return x;
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
    return (d.qrow * a.num_q_heads + d.head) * a.max_splits + split;
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

/// One work item: request b's `local`-th item (split fastest, then row chunk, KV head).
template <class Tr>
__device__ __forceinline__ void decode_item(const AttentionArgs& a, const AttentionSmem<Tr>& sm, int b, int local) {
  const int L = max(a.seq_lens[b], 0);
  const DecodeSplit sp = decode_split(a, L);
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

/// Bound on decode_kernel's static shared memory (req_prefix and warp_sums: 532 B, 640
/// as ptxas lays it out), added to the dynamic bytes wherever they are checked.
constexpr int kDecodeStaticSmemBound = 1024;

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) decode_kernel(const AttentionArgs a) {
  extern __shared__ __align__(128) char smem_raw[];
  __shared__ int req_prefix[Tr::kThreads + 1];  // item prefix of the current 128 requests
  __shared__ int warp_sums[Tr::kThreads / 32];
  static_assert(sizeof(req_prefix) + sizeof(warp_sums) <= kDecodeStaticSmemBound, "static shared memory");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // the merge may start its CTAs
#endif
  const AttentionSmem<Tr> sm{smem_raw};
  const int tid = threadIdx.x;
  int item = blockIdx.x;
  for (int base = 0; base < a.batch; base += Tr::kThreads) {
    const int b = base + tid;
    const int n = b < a.batch ? decode_split(a, max(a.seq_lens[b], 0)).count * a.num_kv_heads * a.row_chunks : 0;
    const int before = base == 0 ? 0 : req_prefix[Tr::kThreads];  // items of the requests already scanned
    const int incl = block_inclusive_sum<Tr::kThreads>(n, warp_sums);  // (everyone has read `before`)
    req_prefix[tid + 1] = before + incl;
    if (tid == 0) req_prefix[0] = before;
    __syncthreads();
    // Across items only `item` and `base` stay in registers (the 64-row D = 256 tiles
    // use all 255).
    for (; item < req_prefix[Tr::kThreads]; item += gridDim.x) {
      // The request: the largest j with req_prefix[j] <= item (every request has at
      // least one item, so the prefix rises strictly up to the batch's end).
      int j = 0;
#pragma unroll
      for (int step = Tr::kThreads / 2; step > 0; step >>= 1) {
        if (req_prefix[j + step] <= item) j += step;
      }
      decode_item<Tr>(a, sm, base + j, item - req_prefix[j]);
      __syncthreads();  // the epilogue's shared memory is the next item's
    }
  }
}

/// Resident CTAs per SM of decode_kernel<Tr> on the current device, computed once per
/// (instantiation, device), with its dynamic shared memory limit raised once, not per
/// launch.
template <class Tr>
int resident_ctas_per_sm(int device) {
  static std::atomic<int> cache[kMaxDevices];
  return once_per_device(cache, device, [] {
    const auto kernel = decode_kernel<Tr>;
    allow_dynamic_smem(kernel, Tr::kSmemBytes);
    int n = 0;
    PAGEDMHA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, Tr::kThreads, Tr::kSmemBytes));
    return std::max(n, 1);
  });
}

// Per-tile costs (barrier, Q fragment reloads, softmax and O rescale, page ids) do not
// scale with the bytes: with 4 warps splitting the keys, rows of <= 128 bytes (fp8
// D <= 128, bf16 / fp16 D = 64) take 32 keys per warp, so a warp still streams 8 KB of
// K + V per tile (as bf16 D = 128 does with 16 keys) in the same 32 KB stages.
// The 64-row tiles at D = 256 take 16 keys per warp: their 128 accumulator registers
// leave no room for 32 keys' logits without spilling.
template <int D, class T, class KV, int WM>
using DecodeTraits = AttentionTraits<D, T, KV, WM, 1,
                                     WM == 1 && D * static_cast<int>(sizeof(KV)) <= 128 ? 32
                                     : WM == 4 && D == 256                               ? 16
                                                                                         : 0,
                                     false, kDecodeSmemKB>;

/// Launches attention and merge for one (head dim, T, KV, warp layout); `a` is complete
/// except for the tile configuration chosen here.
template <int D, class T, class KV, int WM>
void launch_decode_config(AttentionArgs a, int device, int sm_count, cudaStream_t stream) {
  using Tr = DecodeTraits<D, T, KV, WM>;
  a.split_tile = Tr::BN;
  a.row_chunks = ceil_div(a.group * a.q_len_per_req, Tr::M);
  const int max_count = decode_max_split_count(a);
  const int64_t max_items = static_cast<int64_t>(a.batch) * a.num_kv_heads * a.row_chunks * max_count;
  const int per_sm = resident_ctas_per_sm<Tr>(device);
  const int64_t grid = decode_grid_ctas(max_items, static_cast<int64_t>(per_sm) * sm_count);
  decode_kernel<Tr><<<static_cast<unsigned>(grid), Tr::kThreads, Tr::kSmemBytes, stream>>>(a);
  PAGEDMHA_CUDA_CHECK_LAUNCH();

  if (max_count > 1) launch_decode_merge<D, T>(a, max_count, device, stream);
}

/// Tile choice: 16 packed rows with the KV tile split over 4 warps when the G * n rows
/// fit and the GPU has the shared memory (sm_86 / sm_89 have 99 KB per CTA; some 16-row
/// configurations take up to 137 KB), else 64-row tiles (row chunks beyond 64 become
/// more work items), which fit every supported GPU.
template <int D, class T, class KV>
void launch_decode(const AttentionArgs& a, int device, int sm_count, cudaStream_t stream) {
  static_assert(DecodeTraits<D, T, KV, 4>::kSmemBytes + kDecodeStaticSmemBound <= kSm89SmemPerBlock,
                "64-row decode tiles fit sm_89");
  if (a.group * a.q_len_per_req <= 16 &&
      DecodeTraits<D, T, KV, 1>::kSmemBytes + kDecodeStaticSmemBound <= max_smem_per_block(device)) {
    launch_decode_config<D, T, KV, 1>(a, device, sm_count, stream);
  } else {
    launch_decode_config<D, T, KV, 4>(a, device, sm_count, stream);
  }
}

}  // namespace pagedmha::cuda
