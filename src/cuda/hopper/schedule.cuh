// The persistent grid's work: query tiles (request b, the m-th tile of its tokens, KV head,
// head group), paired within each request and ordered longest pair first across the whole
// batch by a one-CTA plan kernel that writes them into the caller's workspace. The
// producer and the consumers of a CTA walk the same sequence (params.cuh Walk), so they
// agree on every tile without talking.
#pragma once

#include <cub/block/block_scan.cuh>
#include <cutlass/fast_math.h>

#include <cstdint>

#include "cuda/prefill_sm90/policy.h"
#include "pagedmha/variant.h"

namespace pagedmha::cuda::sm90 {

/// What the plan and the kernels need to enumerate query tiles.
struct TileSpace {
  const int32_t* cu_seqlens_q;
  const int32_t* seq_lens;
  int batch;
  int tokens;  // tokens per query tile (keys per KV tile: the kernels' template parameter kBN)
  MaskVariant mask;
};

/// KV tiles [begin, end) that a query tile reads, and the keys every one of its rows sees
/// (tiles inside need no mask).
struct TileKeys {
  int begin, end;
  int span_lo, span_hi;      // keys any row sees (loaded; everything else in the tiles is zero or masked)
  int common_lo, common_hi;  // keys every row sees (clamped to >= 0: keys are)
};

/// A variant's key span in 32 bits (keys and positions of one request fit: lengths are int32).
__device__ __forceinline__ void narrow(const KeySpan& s, int& lo, int& hi) {
  lo = static_cast<int>(s.lo);
  hi = static_cast<int>(s.hi > 0 ? s.hi : 0);
}

/// Element x of the order the producer loads and the consumers use K / V tiles of a
/// query tile with n KV tiles (tile j = KV tile end - 1 - j, the last one first):
/// K0, K1, V0, K2, V1, ..., K_{n-1}, V_{n-2}, V_{n-1}.
__device__ __forceinline__ void kv_order(int x, int n, int& j, bool& is_v) {
  if (x == 0) {
    j = 0, is_v = false;
  } else if (x == 2 * n - 1) {
    j = n - 1, is_v = true;
  } else if (x & 1) {
    j = (x + 1) / 2, is_v = false;
  } else {
    j = x / 2 - 1, is_v = true;
  }
}

/// The KV tiles of a query tile of `rows` tokens (1 .. tokens) whose first token is at
/// position p0 of a request of L keys, in KV tiles of kBN keys.
template <int kBN>
__device__ __forceinline__ TileKeys tile_keys(const TileSpace& s, int L, int p0, int rows) {
  const int64_t q0 = p0, q1 = int64_t{p0} + rows - 1;
  TileKeys k;
  narrow(s.mask.rows_union(L, q0, q1), k.span_lo, k.span_hi);
  narrow(s.mask.rows_common(L, q0, q1), k.common_lo, k.common_hi);
  if (k.span_hi <= k.span_lo) {
    k.begin = k.end = 0;
  } else {
    // Keys are >= 0: unsigned division by the constant (a shift for a power of two, a
    // multiply for policy.h's 80-key tile).
    k.begin = static_cast<int>(static_cast<unsigned>(k.span_lo) / kBN);
    k.end = static_cast<int>((static_cast<unsigned>(k.span_hi) + kBN - 1) / kBN);
  }
  return k;
}

/// One CTA of kPlanThreads: the plan of the persistent grid, written into the workspace.
/// A request of n query tiles (m = 0 .. n - 1, later tiles see more keys under a causal
/// mask) gives ceil(n / 2) pairs: tile n - 1 - j, then tile j (none for the middle tile
/// of an odd n). A CTA runs the two tiles of a pair back to back, so under a causal mask
/// every pair of a request costs about the same: a grid walking the pairs round-robin
/// stays balanced while the pairs of one request (and so its K / V) run together. Sorted
/// by the tiles' key count alone (each round on equal tiles of every request), 16
/// requests of 1k at D = 256 re-read K / V from DRAM for every round: 2.35 TB/s of DRAM
/// traffic, twice the bytes the problem has, and an 18% L2 hit rate (ncu, H100
/// 2026-12-06 s27run4; FA3 dense on the same problem: 65%, its scheduler runs the query
/// tiles of a few heads together).
/// Pairs of one request also stay adjacent in the list (their request's bucket, warp-
/// ordered places): gemma 16 x 1k L2 hits 44% -> 58%, 328 -> 303 us (ncu, H100 2026-12-06
/// s28run1). A batch of fewer than min_pairs pairs (under policy.h kPlanPairRounds
/// rounds of the grid, three by default) runs single tiles instead, each the first entry of a
/// unit whose second is empty, sorted by its own key count: finer units for a short grid.
/// Steps: units (pairs or tiles) per request, their prefix, then a counting sort of the
/// units by their bucket, descending (bucketed; order within a bucket is free for the
/// results: every tile is computed whole by one CTA), written as two plan
/// entries each: int4 {b, q_row0, rest, L}, request b, the q / out row of the tile's
/// first token, the request's query tokens from that token on (> 0; 0 for the missing
/// tile of a pair: nothing to run) and its KV length (>= 0). Everything an item needs of
/// its request, so that the kernels read one 16-byte entry per item and nothing that
/// depends on it (cu_seqlens_q, seq_lens; the consumers had waited out two dependent
/// global round trips at every item: ncu, H200 2026-12-03 s10run3, 16 x 1k).
/// min_pairs: the fewest pairs run as pairs, else single tiles (policy.h plan_min_pairs).
template <int kThreads, int kBuckets, int kBN>
__global__ void __launch_bounds__(kThreads) plan_kernel(const TileSpace s, int min_pairs, char* workspace) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int bucket[kBuckets];
  __shared__ int carry;
  int* count = reinterpret_cast<int*>(workspace);
  int* prefix = reinterpret_cast<int*>(workspace + PlanLayout::prefix_offset());
  int4* list = reinterpret_cast<int4*>(workspace + PlanLayout::list_offset(s.batch));
  const int tid = threadIdx.x;
  const auto tiles_of = [&](int b) {
    const int n = s.cu_seqlens_q[b + 1] - s.cu_seqlens_q[b];
    return n > 0 ? (n + s.tokens - 1) / s.tokens : 0;
  };

  // 1. prefix[b] = units (pairs, or single tiles: policy.h kPlanPairRounds) of the
  // requests before b.
  const auto scan_units = [&](bool singles) {
    __syncthreads();  // every thread has read the last scan's total
    if (tid == 0) carry = 0;
    __syncthreads();
    for (int base = 0; base < s.batch; base += kThreads) {
      const int b = base + tid;
      const int tiles = b < s.batch ? tiles_of(b) : 0;
      int excl, total;
      Scan(scan_tmp).ExclusiveSum(singles ? tiles : (tiles + 1) / 2, excl, total);
      if (b < s.batch) prefix[b] = carry + excl;
      __syncthreads();
      if (tid == 0) carry += total;
      __syncthreads();
    }
    return carry;
  };
  int total = scan_units(false);
  // The same in every thread (carry, synchronized); never with kPlanPairRounds 0 (min_pairs 0).
  const bool singles = total < min_pairs;
  if (singles) total = scan_units(true);
  if (tid == 0) prefix[s.batch] = total;
  for (int i = tid; i < kBuckets; i += kThreads) bucket[i] = 0;
  __syncthreads();

  // Unit i -> request b and its tiles m0 (a pair's later one) and m1 (-1: none) by a
  // binary search of the prefix; its bucket (0 = most KV tiles).
  auto locate = [&](int i, int& b, int& m0, int& m1) {
    int lo = 0, hi = s.batch - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (prefix[mid] <= i) lo = mid; else hi = mid - 1;
    }
    b = lo;
    const int j = i - prefix[b], tiles = tiles_of(b);
    m0 = singles ? j : tiles - 1 - j;
    m1 = !singles && j < m0 ? j : -1;
    const int n = s.cu_seqlens_q[b + 1] - s.cu_seqlens_q[b];
    const int L = s.seq_lens[b] > 0 ? s.seq_lens[b] : 0;
    const auto cost = [&](int m) {
      const int rest = n - m * s.tokens;
      const TileKeys k = tile_keys<kBN>(s, L, L - rest, rest < s.tokens ? rest : s.tokens);
      return k.end - k.begin;
    };
    // A single tile takes its own cost (longest first). Every pair takes its request's
    // first pair's bucket: pairs that differ by a tile (80-key tiles at 1k) would
    // otherwise split the request across rounds.
    const int c = singles ? cost(m0) : cost(tiles - 1) + (tiles > 1 ? cost(0) : 0);
    return kBuckets - 1 - (c < kBuckets - 1 ? c : kBuckets - 1);
  };
  // 2. histogram, 3. bucket offsets, 4. scatter.
  for (int i = tid; i < total; i += kThreads) {
    int b, m0, m1;
    atomicAdd(&bucket[locate(i, b, m0, m1)], 1);
  }
  __syncthreads();
  constexpr int kPer = kBuckets / kThreads;
  static_assert(kBuckets % kThreads == 0, "buckets per thread");
  int v[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) v[j] = bucket[tid * kPer + j];
  __syncthreads();
  Scan(scan_tmp).ExclusiveSum(v, v);
#pragma unroll
  for (int j = 0; j < kPer; ++j) bucket[tid * kPer + j] = v[j];
  __syncthreads();
  const auto write = [&](int at, int b, int m0, int m1) {
    const int q0 = s.cu_seqlens_q[b], n = s.cu_seqlens_q[b + 1] - q0;
    const int L = s.seq_lens[b] > 0 ? s.seq_lens[b] : 0;
    list[2 * at] = make_int4(b, q0 + m0 * s.tokens, n - m0 * s.tokens, L);
    list[2 * at + 1] = m1 >= 0 ? make_int4(b, q0 + m1 * s.tokens, n - m1 * s.tokens, L) : make_int4(b, q0, 0, L);
  };
  // Whole warps in step: the lanes of one bucket take consecutive places in lane (so
  // pair) order, through one atomic by the group's first lane, so that a round of the
  // grid holds the pairs of as few requests as possible.
  for (int base = 0; base < total; base += kThreads) {
    const int i = base + tid, lane = tid & 31;
    int b = 0, m0 = 0, m1 = -1, key = -1;
    if (i < total) key = locate(i, b, m0, m1);
    const unsigned same = __match_any_sync(0xffffffffu, key);
    const int leader = __ffs(same) - 1;
    int first = 0;
    if (i < total && lane == leader) first = atomicAdd(&bucket[key], __popc(same));
    first = __shfl_sync(0xffffffffu, first, leader);
    if (i < total) write(first + __popc(same & ((1u << lane) - 1u)), b, m0, m1);
  }
  if (tid == 0) *count = 2 * total;
}

/// One work item of the persistent grid, everything both roles derive from it.
struct QueryTile {
  int b, kv_head, head0;  // request, KV head, first of the tile's `pack` query heads
  int q_row0;             // q / out row of the tile's first token
  int n_tok;              // tokens in the tile
  int L, p0;              // KV length; position of the first token (L - rest; < 0 when rest > L)
  TileKeys keys;
};

/// Items of the plan for a grid of clusters of `cluster` CTAs: entries x KV heads x
/// head groups / cluster (the CTAs of a cluster take consecutive head groups of one KV
/// head: the same tokens, so the same K / V tiles, which they load once for both).
__device__ __forceinline__ int num_items(int entries, int num_kv_heads, int head_groups, int cluster) {
  return entries * num_kv_heads * (head_groups / cluster);
}

/// The divisors of a work item's index: items per plan entry (Hkv * head_groups /
/// cluster) and head groups per cluster (head_groups / cluster), as multiply-shift
/// divisions (cutlass::FastDivmod, built on the host): both roles split every item, and
/// a 32-bit division is a chain of ~20 dependent instructions.
struct ItemDivisors {
  cutlass::FastDivmod per_entry, groups;
};

/// Item `item`'s plan entry: entry item / (Hkv * head_groups / cluster) of the list.
__device__ __forceinline__ int4 plan_entry(const int4* list, int item, const ItemDivisors& div) {
  int entry, r;
  div.per_entry.fast_divmod(entry, r, item);
  return list[entry];
}

/// Item `item` from its plan entry `e` (plan_entry): the KV head and the head group (of
/// `pack` query heads; cluster rank `rank` takes the rank-th of the item's `cluster`
/// consecutive groups) from the item's index. The items of one entry are adjacent (equal
/// cost).
template <int kBN>
__device__ __forceinline__ QueryTile query_tile(const TileSpace& s, int4 e, int item, const ItemDivisors& div,
                                                int group, int pack, int cluster, int rank) {
  int entry, r, kv_head, g;
  div.per_entry.fast_divmod(entry, r, item);
  div.groups.fast_divmod(kv_head, g, r);
  QueryTile t;
  t.b = e.x;
  t.kv_head = kv_head;
  t.head0 = kv_head * group + (g * cluster + rank) * pack;
  t.q_row0 = e.y;
  t.n_tok = e.z < s.tokens ? e.z : s.tokens;
  t.L = e.w;
  t.p0 = t.L - e.z;
  t.keys = tile_keys<kBN>(s, t.L, t.p0, t.n_tok);
  return t;
}

}  // namespace pagedmha::cuda::sm90
