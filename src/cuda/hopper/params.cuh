// Kernel parameters and shared-memory layout of the warp-specialised Hopper attention
// kernels (one producer warpgroup, two consumer warpgroups; see prefill_sm90/).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/common/attention_args.cuh"
#include "cuda/hopper/paged_kv.cuh"
#include "cuda/hopper/schedule.cuh"
#include "cuda/hopper/walk_order.h"

namespace pagedmha::cuda::sm90 {


/// Passed as a __grid_constant__ parameter (the tensor maps must live in parameter or
/// global memory for TMA).
struct Sm90Params {
  CUtensorMap tm_q;  // [rows][Hq][D] 16-bit, box [tokens][pack][64], 128B swizzle
  CUtensorMap tm_k;  // [pages][page_size][Hkv][D], box [1][geo.box_rows][1][64], 128B swizzle
  CUtensorMap tm_v;  // (fp8 caches: box [1][geo.box_rows][1][D] bytes, no swizzle: the raw tile)
  AttentionArgs a;
  TileSpace space;
  const int4* list;  // plan: query tiles in the order to run them (schedule.cuh plan entries)
  const int* count;  // plan: number of list entries
  int pack;          // query heads per tile (GQA packing)
  int head_groups;   // group / pack
  ItemDivisors item_div;        // of work-item indices (schedule.cuh)
  cutlass::FastDivmod pack_div;  // a tile row -> (token, head offset)
  PageGeometry geo;  // K / V pages and TMA boxes
  int cluster;       // CTAs per cluster (1, or 2 sharing each K / V tile by TMA multicast)
  bool tma_q, tma_kv;  // Q / 16-bit K and V by TMA (else the cp.async gather)
  bool q_convert;      // Q by TMA in its dtype, converted in place into the GEMMs' (fp8 KV, bf16 Q)
  bool tma_raw;        // fp8 K and V by TMA (into the staging slots or their stages; else the gather)
  cutlass::FastDivmod walkers;  // the grid's clusters: a pair item's round (Walk, serpentine order)
};

/// This CTA's walk over the plan. Items are numbered entry x (Hkv * head_groups /
/// cluster) + the rest (schedule.cuh); the plan's entries come in pairs 2i, 2i + 1 run back to
/// back (plan_kernel). Its cluster (walker `first` of `stride`) takes one pair item of
/// each round of `stride`, round-robin (first, first + stride, ...) or in serpentine
/// order (walk_order.h; policy.h kPlanPairRounds), and runs each pair item's two tiles
/// in turn; rank in the cluster (a 1-d grid of clusters of p.cluster consecutive CTAs).
struct Walk {
  int first, stride, rank, total;
  __device__ explicit Walk(const Sm90Params& p)
      : first(static_cast<int>(blockIdx.x) / p.cluster),
        stride(static_cast<int>(gridDim.x) / p.cluster),
        rank(static_cast<int>(blockIdx.x) % p.cluster),
        total(num_items(*p.count, p.a.num_kv_heads, p.head_groups, p.cluster)) {}
  /// Item of pair item `q` (pair q / per, the rest q % per): its first tile's.
  __device__ int pair_item(const Sm90Params& p, int q) const {
    int pair, r;
    p.item_div.per_entry.fast_divmod(pair, r, q);
    return (2 * pair) * p.item_div.per_entry.divisor + r;
  }
  __device__ int begin(const Sm90Params& p) const { return pair_item(p, first); }
  /// The item after `item`: the pair's second tile, else the next pair item's first.
  __device__ int next(const Sm90Params& p, int item) const {
    int entry, r;
    p.item_div.per_entry.fast_divmod(entry, r, item);
    const int per = p.item_div.per_entry.divisor;
    if ((entry & 1) == 0) return item + per;
    const int q = (entry >> 1) * per + r;  // this pair item
    if constexpr (kPlanPairRounds == 0) {
      return pair_item(p, q + stride);  // round-robin (policy.h)
    } else {
      int round, c;
      p.walkers.fast_divmod(round, c, q);
      return pair_item(p, serpentine_next(q, round, first, stride));
    }
  }
  /// Item `item`'s plan entry (schedule.cuh), or zeros past the walk. Each role loads
  /// the next item's entry as it starts an item, so the load's latency hides behind it.
  __device__ int4 entry(const Sm90Params& p, int item) const {
    return item < total ? plan_entry(p.list, item, p.item_div) : make_int4(0, 0, 0, 0);
  }
  template <int kBN>
  __device__ QueryTile tile(const Sm90Params& p, int item, int4 e) const {
    return query_tile<kBN>(p.space, e, item, p.item_div, p.a.group, p.pack, p.cluster, rank);
  }
};

/// Shared memory of one CTA, carved from a 1024-byte aligned base: the Q slots, the K and V rings
/// (16-bit, swizzled), the fp8 staging slots, then the mbarriers.
template <class Pol>
struct SmemLayout {
  static constexpr int SK = Pol::kKStages, SV = Pol::kVStages;
  char* base;

  __device__ explicit SmemLayout(char* raw)
      : base(reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023})) {}

  static constexpr int QS = Pol::kQSlots;
  static constexpr int kQAll = QS * Pol::kQBytes;

  __device__ char* q(int s) const { return base + s * Pol::kQBytes; }
  __device__ char* k(int s) const { return base + kQAll + s * Pol::kTileBytes; }
  __device__ char* v(int s) const { return base + kQAll + (SK + s) * Pol::kTileBytes; }
  __device__ char* raw(int r) const { return base + kQAll + (SK + SV) * Pol::kTileBytes + r * Pol::kRawBytes; }
  __device__ uint64_t* bars() const {
    return reinterpret_cast<uint64_t*>(base + kQAll + (SK + SV) * Pol::kTileBytes + Pol::kRawSlots * Pol::kRawBytes);
  }
  __device__ uint64_t* q_full(int s) const { return bars() + s; }
  __device__ uint64_t* q_empty(int s) const { return bars() + QS + s; }
  __device__ uint64_t* k_full(int s) const { return bars() + 2 * QS + s; }
  __device__ uint64_t* k_empty(int s) const { return bars() + 2 * QS + SK + s; }
  __device__ uint64_t* v_full(int s) const { return bars() + 2 * QS + 2 * SK + s; }
  __device__ uint64_t* v_empty(int s) const { return bars() + 2 * QS + 2 * SK + SV + s; }
  // fp8 tiles by TMA: one barrier per staging slot, or converting in place one per K
  // stage, then one per V stage.
  static constexpr int kRawBars = Pol::kFp8InPlace ? SK + SV : Pol::kRawSlots;
  __device__ uint64_t* raw_full(int r) const { return bars() + 2 * QS + 2 * (SK + SV) + r; }
  /// Where stage s's raw fp8 tile lands when converting in place: the upper half.
  __device__ char* k_raw(int s) const { return k(s) + Pol::kTileBytes / 2; }
  __device__ char* v_raw(int s) const { return v(s) + Pol::kTileBytes / 2; }
  __device__ uint64_t* k_raw_full(int s) const { return raw_full(s); }
  __device__ uint64_t* v_raw_full(int s) const { return raw_full(SK + s); }
  /// Converting Q (Sm90Params::q_convert): its TMA bytes land on q_land, the
  /// conversion arrives on q_full.
  __device__ uint64_t* q_land(int s) const { return raw_full(kRawBars + s); }
  static constexpr int kNumBars = 2 * QS + 2 * (SK + SV) + kRawBars + QS;
  static_assert(kNumBars * 8 <= Pol::kBarrierBytes, "barrier space");
};

// Named barriers (0 is __syncthreads): the producer warpgroups, the consumers' turn-taking.
constexpr int kBarProducer = 1;  // producer team r's kRoleThreads threads: barrier kBarProducer + r
constexpr int kBarTurn0 = 3;     // consumer warpgroup w may issue its GEMMs: barrier kBarTurn0 + w

}  // namespace pagedmha::cuda::sm90
