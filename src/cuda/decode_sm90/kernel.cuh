// The Hopper decode kernel (sm_90a): split-KV decode and speculative verify with the G x
// q_len query rows of a KV head packed into one mma.sync row tile (row_tile.cuh: 16 or,
// at D = 64, 32 rows as the mma's M, or up to 8 as its N, operand-swapped), K / V
// streamed by TMA. Structure
// (policy.h):
//   * persistent grid, kCtasPerSm CTAs per SM, walking the work items (request, split,
//     KV head: policy.h kHeadsFastest) blockIdx.x, + gridDim.x, ...; the split of each
//     request is decode/policy.h's (its own length only: results are bitwise the same in
//     any batch);
//   * a producer warp fills the CTA's ring of stages (kWarps x KW keys of K and V; one
//     TMA box per page and 64-column panel, or per page and fp8 row, issued by its
//     lanes in parallel; a full and
//     an empty mbarrier per stage) and runs on into the CTA's next item without draining;
//   * consumer warp w reads keys [w KW, w KW + KW) of every stage: Q in registers, S and
//     O by m16n8k16 from the swizzled stages (row_tile.cuh), the online softmax of
//     online_softmax.cuh, the variant of device_variant.cuh; fp8 caches stay raw in the
//     ring and are converted in registers (common/fp8_fragments.cuh);
//   * the item's epilogue merges the warps' (m, l, O) in a fixed order and writes o and
//     lse (one split) or the partials that decode_merge_kernel combines.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda/common/attention_args.cuh"
#include "cuda/common/convert.cuh"
#include "cuda/common/fp8_fragments.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/decode/decode_kernel.cuh"
#include "cuda/decode_sm90/policy.h"
#include "cuda/decode_sm90/row_tile.cuh"
#include "cuda/hopper/device_variant.cuh"
#include "cuda/hopper/paged_kv.cuh"
#include "cuda/hopper/sm90.cuh"

namespace pagedmha::cuda::sm90 {

/// Passed as a __grid_constant__ parameter (TMA reads the tensor maps from it).
struct DecodeSm90Params {
  // [pages][page_size][Hkv / n][n D] for n = Pol::kItemHeads, boxes [1][geo.box_rows][1][64 or fp8 n D]
  // (policy.h kPanels)
  CUtensorMap tm_k;
  CUtensorMap tm_v;
  AttentionArgs a;
  PageGeometry geo;
};

/// Shared memory: the ring's stages (K tile, then V tile; [kTileKeys][D] as 64-column
/// panels of 128-byte swizzled rows, sm90.cuh tile_offset, or fp8 rows in
/// paged_loader.cuh's swizzle_rows), the epilogue buffers and statistics, then the
/// stages' full and empty barriers.
template <class Pol>
struct DecodeSmem {
  char* base;
  __device__ explicit DecodeSmem(char* raw)
      : base(reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023})) {}
  static constexpr int kRingBytes = Pol::kStages * Pol::kStageBytes;
  __device__ char* k(int s) const { return base + s * Pol::kStageBytes; }
  __device__ char* v(int s) const { return k(s) + Pol::kTileBytes; }
  __device__ float* buf(int i) const {
    return reinterpret_cast<float*>(base + kRingBytes) + i * Pol::kRows * Pol::kOStride;
  }
  __device__ float* stat_m() const { return buf(Pol::kEpiBuffers); }
  __device__ float* stat_l() const { return stat_m() + Pol::kWarps * Pol::kRows; }
  __device__ float* row_scale() const { return stat_l() + Pol::kWarps * Pol::kRows; }
  /// Stage s has landed.
  __device__ uint64_t* full(int s) const {
    return reinterpret_cast<uint64_t*>(base + kRingBytes + Pol::kEpiBytes + Pol::kStatBytes) + s;
  }
  /// Every consumer warp has read stage s.
  __device__ uint64_t* empty(int s) const { return full(0) + Pol::kMaxStages + s; }
};

/// The work items of a batch as one warp walks them, 32 requests at a time: lane j holds
/// request base + j's length, split count and the inclusive prefix of items (splits x
/// KV heads / kItemHeads) within the window. Items are visited in increasing order.
template <int kItemHeads>
struct RequestScan {
  int base = 0, before = 0;  // first request of the window; items of the requests before it
  int len = 0, count = 0, incl = 0;

  __device__ void load(const AttentionArgs& a, int first) {
    const int lane = threadIdx.x & 31, b = first + lane;
    base = first;
    len = b < a.batch ? max(a.seq_lens[b], 0) : 0;
    count = b < a.batch ? decode_split(a, len).count : 0;
    int x = count * (a.num_kv_heads / kItemHeads);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    incl = x;
  }

  /// Item `item`: request b, its index `local` among the request's items, its split count
  /// and length. False past the batch's last item.
  __device__ bool locate(const AttentionArgs& a, int item, int& b, int& local, int& cnt, int& L) {
    for (;;) {
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      if (item - before < total) break;
      if (base + 32 >= a.batch) return false;
      before += total;
      load(a, base + 32);
    }
    const int rel = item - before;
    const int j = __popc(__ballot_sync(0xffffffffu, incl <= rel));  // requests wholly before it
    const int excl = __shfl_sync(0xffffffffu, incl, j > 0 ? j - 1 : 0);
    b = base + j;
    local = rel - (j > 0 ? excl : 0);
    cnt = __shfl_sync(0xffffffffu, count, j);
    L = __shfl_sync(0xffffffffu, len, j);
    return true;
  }
};

/// Row r of a work item of kItemHeads KV heads from kv_head: with one, DecodeRows' row r;
/// with two, row r % kTileRows of KV head kv_head + r / kTileRows (each head's rows on its
/// own tile, row_tile.cuh RowTileN).
template <class Pol>
struct ItemRows {
  const AttentionArgs& a;
  int b, kv_head, L;

  __device__ RowDesc operator()(int r) const {
    if constexpr (Pol::kItemHeads == 1) {
      return DecodeRows{a, b, kv_head, 0, L}(r);
    } else {
      return DecodeRows{a, b, kv_head + r / Pol::kTileRows, 0, L}(r % Pol::kTileRows);
    }
  }
};

/// One work item: the rows' visible keys and the item's key tiles (tiles of kTileKeys
/// keys, a stage each; decode_split with a.split_tile = kTileKeys).
struct WarpItem {
  int b, kv_head, split, count, L;  // kv_head: the item's first
  int lo, hi;            // keys any valid row sees (loaded)
  int full_lo, full_hi;  // keys every valid row sees (tiles inside skip the mask)
  int t0, t1;            // the item's tiles [t0, t1)
  int row_lo, row_hi;    // lane r < max(kRows, 16): row r's keys (0, 0 for padding rows)
};

template <class Pol>
__device__ __forceinline__ WarpItem warp_item(const AttentionArgs& a, int b, int local, int count, int L) {
  constexpr int KW = Pol::kTileKeys;
  WarpItem it;
  it.b = b;
  it.count = count;
  it.L = L;
  // One row chunk (G * q_len <= kTileRows).
  const int units = a.num_kv_heads / Pol::kItemHeads;
  it.split = Pol::kHeadsFastest ? local / units : local % count;
  it.kv_head = (Pol::kHeadsFastest ? local % units : local / count) * Pol::kItemHeads;
  const int lane = threadIdx.x & 31;
  constexpr int kLaneRows = Pol::kRows > 16 ? 32 : 16;
  const ItemRows<Pol> rows{a, b, it.kv_head, L};
  const RowDesc d = rows(lane & (kLaneRows - 1));
  const bool valid = lane < kLaneRows && d.valid;
  it.row_lo = valid ? d.lo : 0;
  it.row_hi = valid ? d.hi : 0;
  const bool sees = valid && d.lo < d.hi;
  int lo = __reduce_min_sync(0xffffffffu, sees ? d.lo : INT_MAX);
  int hi = __reduce_max_sync(0xffffffffu, sees ? d.hi : INT_MIN);
  it.full_lo = __reduce_max_sync(0xffffffffu, valid ? d.lo : INT_MIN);
  it.full_hi = __reduce_min_sync(0xffffffffu, valid ? d.hi : INT_MAX);
  if (lo >= hi) lo = hi = 0;
  it.lo = lo;
  it.hi = hi;
  // The split's tiles (as the portable decode_item), clipped to the keys the rows see.
  const DecodeSplit sp = decode_split(a, L);
  const int tb = max(sp.t0 + static_cast<int>(static_cast<int64_t>(it.split) * sp.nt / sp.count), lo / KW);
  const int te = max(min(sp.t0 + static_cast<int>(static_cast<int64_t>(it.split + 1) * sp.nt / sp.count),
                         (hi + KW - 1) / KW),
                     tb);
  it.t0 = tb;
  it.t1 = te;
  return it;
}

template <class Pol, class T>
struct DecodeWarp {
  static constexpr int D = Pol::kHeadDim, KW = Pol::KW, S = Pol::kStages, W = Pol::kWarps, R = Pol::kRows;
  static constexpr int TK = Pol::kTileKeys;  // rows of a stage
  using Tile = std::conditional_t<Pol::kTileRows == 8, RowTileN<Pol, T>, RowTileM<Pol, T, Pol::kTileRows / 16>>;
  static constexpr int MT = Tile::MT, NS = Tile::NS, NA = Tile::NA;
  using Softmax = OnlineSoftmax<typename Tile::Frag>;
  const DecodeSm90Params& p;
  const DecodeSmem<Pol> sm;
  int warp, lane;
  int row0;  // the warp's first row of a stage: its slice of the ring

  __device__ void run() {
    const AttentionArgs& a = p.a;
    const DeviceVariant<> var{a};
    PipeState<S> st;
    RequestScan<Pol::kItemHeads> scan;
    scan.load(a, 0);
    // Q of the next item is loaded while this one runs (Pol::kQPrefetch): its latency
    // is off the item's start.
    constexpr int NQ = Tile::NQ;
    int item = blockIdx.x, b, local, cnt, L;
    WarpItem next{};
    uint32_t q_next[MT][D / 16][NQ];
    bool more = scan.locate(a, item, b, local, cnt, L);
    if (Pol::kQPrefetch && more) {
      next = warp_item<Pol>(a, b, local, cnt, L);
      Tile::load_q(a, ItemRows<Pol>{a, next.b, next.kv_head, next.L}, lane, q_next);
    }
    while (more) {
      const WarpItem it = Pol::kQPrefetch ? next : warp_item<Pol>(a, b, local, cnt, L);
      const ItemRows<Pol> rows{a, it.b, it.kv_head, it.L};
      uint32_t q[MT][D / 16][NQ];
      if constexpr (Pol::kQPrefetch) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int e = 0; e < NQ; ++e) q[mt][kk][e] = q_next[mt][kk][e];
          }
        }
      } else if (it.t0 < it.t1) {
        Tile::load_q(a, rows, lane, q);
      }
      item += gridDim.x;
      more = scan.locate(a, item, b, local, cnt, L);
      if (Pol::kQPrefetch && more) {
        next = warp_item<Pol>(a, b, local, cnt, L);
        Tile::load_q(a, ItemRows<Pol>{a, next.b, next.kv_head, next.L}, lane, q_next);
      }
      float acc[MT][NA][4];
      Softmax smx[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Tile::zero(acc[mt]);
        smx[mt].init();
      }
      if (it.t0 < it.t1) {
        Tile::to_qk(q);
        // The thread's rows' visible keys: for the mask, read once per item where the
        // registers allow (one row tile), else in each masked tile (the 32-row tiles).
        int lo[MT][2], hi[MT][2];
        const auto row_keys = [&](int mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            lo[mt][h] = __shfl_sync(0xffffffffu, it.row_lo, Tile::row(mt, h, lane));
            hi[mt][h] = __shfl_sync(0xffffffffu, it.row_hi, Tile::row(mt, h, lane));
          }
        };
        if constexpr (MT == 1) row_keys(0);
        for (int tile = it.t0; tile < it.t1; ++tile) {
          wait(sm.full(st.slot), st.phase);
          const int key0 = tile * TK + row0;
          // V rows outside the keys any row sees (past L: whatever the page holds; before
          // a window's start, or of skipped boxes: stale rows) must not meet a zero
          // probability: zero them, as the portable loader zero-fills (K's are masked).
          const bool edge = key0 < it.lo || key0 + KW > it.hi;
          if (edge) zero_rows_outside(sm.v(st.slot), min(max(it.lo - key0, 0), KW), min(max(it.hi - key0, 0), KW));
          float s[MT][NS][4];
          Tile::qk(q, smem_addr(sm.k(st.slot)), warp, lane, s);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            var.template transform<false>(s[mt]);
            if (!(key0 >= it.full_lo && key0 + KW <= it.full_hi)) {
              if constexpr (MT > 1) row_keys(mt);
              mask_keys<typename Tile::Frag>(s[mt], key0, lane, lo[mt], hi[mt]);
            }
            // ftz: split results are compared within an ulp, not bitwise, across split
            // counts, and a request's splits never depend on the batch (decode/policy.h).
            smx[mt].template update<NS, NA, true>(s[mt], acc[mt]);
          }
          Tile::pv(s, smem_addr(sm.v(st.slot)), warp, lane, acc);
          if (edge) fence_async_smem();  // the zeroing (generic proxy) before the producer's next TMA write
          __syncwarp();                  // every lane's reads of the stage are done before it is released
          if (lane == 0) arrive(sm.empty(st.slot));
          st.advance();
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) smx[mt].finish();
      if (it.count == 1) {
        epilogue(smx, acc, DirectOut<T, ItemRows<Pol>>{a, rows});
      } else {
        epilogue(smx, acc, PartialOut<D, ItemRows<Pol>>{a, rows, it.split});
      }
    }
  }

  /// The rows of the warp's V tile (rows row0 .. row0 + KW of the stage) outside
  /// [row0 + r0, row0 + r1) set to zero.
  __device__ void zero_rows_outside(char* v, int r0, int r1) const {
    const uint32_t base = smem_addr(v);
    for (int idx = lane; idx < KW * Pol::kChunks; idx += 32) {
      const int r = idx / Pol::kChunks;
      if (r < r0 || r >= r1) sts128(base + ring_offset<Pol>(row0 + r, idx % Pol::kChunks), make_uint4(0, 0, 0, 0));
    }
    __syncwarp();
  }

  /// The consumer warps' barrier: named barrier 1, beside the ring's producer.
  __device__ static void consumers_sync() { named_sync(1, Pol::kConsumerThreads); }

  /// The CTA's merge of the warps' rows (each relative to its own integer reference):
  /// rescaled to the row maximum; warps 0 and 1 write the two buffers, each further pair
  /// adds to them in turn, and o = (buffer 0 + buffer 1) * the row's scale from `out`.
  template <class Out>
  __device__ void epilogue(const Softmax (&smx)[MT], const float (&acc)[MT][NA][4], const Out& out) const {
    const int tid = threadIdx.x;
    if (Tile::holds_stats(lane)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sm.stat_m()[warp * R + Tile::row(mt, h, lane)] = smx[mt].m[h];
          sm.stat_l()[warp * R + Tile::row(mt, h, lane)] = smx[mt].l[h];
        }
      }
    }
    consumers_sync();
    if (tid < R) {
      float m_all, l_all;
      merge_warp_rows<W>(sm.stat_m(), sm.stat_l(), R, tid, m_all, l_all);
      sm.row_scale()[tid] = out.finish_row(tid, m_all, l_all);
    }
    float f[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m_all = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; ++w) m_all = fmaxf(m_all, sm.stat_m()[w * R + Tile::row(mt, h, lane)]);
        f[mt][h] = m_all == -INFINITY ? 0.0f : fast_exp2(smx[mt].m[h] - m_all);
      }
    }
    float* buf = sm.buf(warp & 1);
    if (warp < 2) Tile::template to_buffer<false>(buf, acc, f, lane);
    for (int pair = 1; pair < W / 2; ++pair) {
      consumers_sync();
      if ((warp >> 1) == pair) Tile::template to_buffer<true>(buf, acc, f, lane);
    }
    consumers_sync();
    for (int idx = tid; idx < R * (D / 8); idx += Pol::kConsumerThreads) {
      const int r = idx / (D / 8), c = idx % (D / 8);
      if (!out.row_valid(r)) continue;
      const float4* x = reinterpret_cast<const float4*>(sm.buf(0) + r * Pol::kOStride + 8 * c);
      const float4* y = reinterpret_cast<const float4*>(sm.buf(1) + r * Pol::kOStride + 8 * c);
      const float sc = sm.row_scale()[r];
      const float4 x0 = x[0], x1 = x[1], y0 = y[0], y1 = y[1];
      const float v[8] = {(x0.x + y0.x) * sc, (x0.y + y0.y) * sc, (x0.z + y0.z) * sc, (x0.w + y0.w) * sc,
                          (x1.x + y1.x) * sc, (x1.y + y1.y) * sc, (x1.z + y1.z) * sc, (x1.w + y1.w) * sc};
      out.store8(r, c, v);
    }
  }
};

/// The ring's producer warp: it walks the CTA's items as the consumer warps do and loads
/// each item's stages [tb, tb + n) into the ring, waiting for a stage's empty barrier
/// (every consumer warp has read its slice). Lane u * kPanels + c issues box u of panel c
/// (kv_boxes.h kv_box_rows: a page, or of a larger page the largest power of two that
/// divides kTileKeys); its page id for the next stage is read while this one is issued.
template <class Pol>
struct DecodeRingProducer {
  static constexpr int TK = Pol::kTileKeys;
  const DecodeSm90Params& p;
  const DecodeSmem<Pol> sm;
  int lane;

  /// This lane's box of stage `tile`: its first key and panel, and whether it holds keys
  /// of [lo, hi).
  __device__ bool box(const WarpItem& it, int tile, int& pos, int& c) const {
    const int u = lane / Pol::kPanels;
    c = lane % Pol::kPanels;
    pos = tile * TK + u * p.geo.box_rows;
    return u < TK / p.geo.box_rows && pos < it.hi && pos + p.geo.box_rows > it.lo;
  }

  __device__ void run() {
    const AttentionArgs& a = p.a;
    const PageGeometry& g = p.geo;
    RequestScan<Pol::kItemHeads> scan;
    scan.load(a, 0);
    PipeState<Pol::kStages> st;
    for (int item = blockIdx.x;; item += gridDim.x) {
      int b, local, cnt, L;
      if (!scan.locate(a, item, b, local, cnt, L)) break;
      const WarpItem it = warp_item<Pol>(a, b, local, cnt, L);
      if (it.t0 >= it.t1) continue;
      const int32_t* pages = a.page_table + int64_t{b} * a.page_table_row_stride;
      int pos, c;
      int page = box(it, it.t0, pos, c) ? __ldg(pages + g.col(pos)) : 0;
      for (int tile = it.t0; tile < it.t1; ++tile) {
        int next = 0;
        if (tile + 1 < it.t1 && box(it, tile + 1, pos, c)) next = __ldg(pages + g.col(pos));
        const bool mine = box(it, tile, pos, c);
        wait(sm.empty(st.slot), st.phase ^ 1);
        const uint32_t boxes = __popc(__ballot_sync(0xffffffffu, mine));
        if (lane == 0) {
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(sm.full(st.slot),
                                                                         boxes * 2 * g.box_rows * Pol::kBoxRowBytes);
        }
        __syncwarp();
        if (mine) {
          const uint32_t off = c * TK * Pol::kBoxRowBytes + (pos - tile * TK) * Pol::kBoxRowBytes;
          // The tensor maps' head coordinate counts items' heads (paged_kv.cuh kv_tensor_maps).
          const int head = it.kv_head / Pol::kItemHeads;
          tma_load_4d(&p.tm_k, sm.full(st.slot), sm.k(st.slot) + off, c * 64, head, g.row(pos), page, kEvictFirst);
          tma_load_4d(&p.tm_v, sm.full(st.slot), sm.v(st.slot) + off, c * 64, head, g.row(pos), page, kEvictFirst);
        }
        st.advance();
        page = next;
      }
    }
  }
};

template <int D, class T, class KV, int kRows, int kItemHeads = 1>
__global__ void __launch_bounds__(DecodePolicy<D, sizeof(KV) == 1, kRows, kItemHeads>::kThreads,
                                  DecodePolicy<D, sizeof(KV) == 1, kRows, kItemHeads>::kCtasPerSm)
    decode_sm90_kernel(const __grid_constant__ DecodeSm90Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Pol = DecodePolicy<D, sizeof(KV) == 1, kRows, kItemHeads>;
  extern __shared__ char smem_raw[];
  const DecodeSmem<Pol> sm(smem_raw);
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < Pol::kStages; ++s) Barrier::init(sm.full(s), 1);
    for (int s = 0; s < Pol::kStages; ++s) Barrier::init(sm.empty(s), Pol::kWarps);
    cutlass::arch::fence_barrier_init();
  }
  // V rows a tile does not load meet probability 0: the stages start finite (zero).
  for (int s = 0; s < Pol::kStages; ++s) {
    uint4* v = reinterpret_cast<uint4*>(sm.v(s));
    for (int i = tid; i < Pol::kTileBytes / 16; i += Pol::kThreads) v[i] = make_uint4(0, 0, 0, 0);
  }
  fence_async_smem();
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // the merge may start its CTAs
  if (tid >= Pol::kConsumerThreads) {
    DecodeRingProducer<Pol>{p, sm, tid & 31}.run();
  } else {
    DecodeWarp<Pol, T>{p, sm, tid >> 5, tid & 31, (tid >> 5) * Pol::KW}.run();
  }
#endif
}

}  // namespace pagedmha::cuda::sm90
