// The Hopper decode kernel (sm_90a): split-KV decode and speculative verify with the G x
// q_len query rows of a KV head packed into one m16 tile (mma.sync), K / V streamed by
// TMA. Structure (policy.h):
//   * persistent grid, kCtasPerSm CTAs per SM, walking the work items (request, split,
//     KV head: policy.h kHeadsFastest) blockIdx.x, + gridDim.x, ...; the split of each
//     request is decode/policy.h's (its own length only: results are bitwise the same in
//     any batch);
//   * a producer warp fills the CTA's ring of stages (kWarps x KW keys of K and V; one
//     TMA box per page and 64-column panel, or per page and fp8 row, issued by its
//     lanes in parallel; a full and
//     an empty mbarrier per stage) and runs on into the CTA's next item without draining;
//   * consumer warp w reads keys [w KW, w KW + KW) of every stage: Q in registers (A
//     fragments), S = Q K^T and O += P V by m16n8k16 from the swizzled stages, the online
//     softmax of online_softmax.cuh, the variant of device_variant.cuh; fp8 caches stay
//     raw in the ring and are converted in registers (common/fp8_fragments.cuh);
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
#include "cuda/hopper/device_variant.cuh"
#include "cuda/hopper/paged_kv.cuh"
#include "cuda/hopper/sm90.cuh"

namespace pagedmha::cuda::sm90 {

/// Passed as a __grid_constant__ parameter (TMA reads the tensor maps from it).
struct DecodeSm90Params {
  CUtensorMap tm_k;  // [pages][page_size][Hkv][D], boxes [1][geo.box_rows][1][64 or fp8 D] (policy.h kPanels)
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
/// KV heads) within the window. Items are visited in increasing order.
struct RequestScan {
  int base = 0, before = 0;  // first request of the window; items of the requests before it
  int len = 0, count = 0, incl = 0;

  __device__ void load(const AttentionArgs& a, int first) {
    const int lane = threadIdx.x & 31, b = first + lane;
    base = first;
    len = b < a.batch ? max(a.seq_lens[b], 0) : 0;
    count = b < a.batch ? decode_split(a, len).count : 0;
    int x = count * a.num_kv_heads;
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

/// One work item: the rows' visible keys and the item's key tiles (tiles of kTileKeys
/// keys, a stage each; decode_split with a.split_tile = kTileKeys).
struct WarpItem {
  int b, kv_head, split, count, L;
  int lo, hi;            // keys any valid row sees (loaded)
  int full_lo, full_hi;  // keys every valid row sees (tiles inside skip the mask)
  int t0, t1;            // the item's tiles [t0, t1)
  int row_lo, row_hi;    // lane r < 16: row r's keys (0, 0 for padding rows)
};

template <class Pol>
__device__ __forceinline__ WarpItem warp_item(const AttentionArgs& a, int b, int local, int count, int L) {
  constexpr int KW = Pol::kTileKeys;
  WarpItem it;
  it.b = b;
  it.count = count;
  it.L = L;
  // One row chunk (G * q_len <= 16).
  it.split = Pol::kHeadsFastest ? local / a.num_kv_heads : local % count;
  it.kv_head = Pol::kHeadsFastest ? local % a.num_kv_heads : local / count;
  const int lane = threadIdx.x & 31;
  const DecodeRows rows{a, b, it.kv_head, 0, L};
  const RowDesc d = rows(lane & 15);
  const bool valid = lane < 16 && d.valid;
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

/// Byte offset of 16-byte chunk c of row r in a stage's K or V tile.
template <class Pol>
__device__ __forceinline__ uint32_t ring_offset(int r, int c) {
  if constexpr (Pol::kFp8) {
    return swizzle_rows<Pol::kChunks>(r, c);
  } else {
    return tile_offset(Pol::kTileKeys, r, c);
  }
}

template <class Pol, class T>
struct DecodeWarp {
  static constexpr int D = Pol::kHeadDim, KW = Pol::KW, S = Pol::kStages, W = Pol::kWarps, R = Pol::kRows;
  static constexpr int TK = Pol::kTileKeys;  // rows of a stage
  // The fp8 fragments' view of the warp's tile (fp8_fragments.cuh): one m16 row tile,
  // S = Q K^T in fp16 (policy.h kQkF16) or in T.
  using QkT = std::conditional_t<Pol::kQkF16, __half, T>;
  struct Fp8Tile {
    using QkT = DecodeWarp::QkT;
    static constexpr int D = Pol::kHeadDim, KW = Pol::KW, MT = 1;
  };
  const DecodeSm90Params& p;
  const DecodeSmem<Pol> sm;
  int warp, lane;
  int row0;  // the warp's first row of a stage: its slice of the ring

  __device__ void run() {
    const AttentionArgs& a = p.a;
    const DeviceVariant<> var{a};
    PipeState<S> st;
    RequestScan scan;
    scan.load(a, 0);
    const int g = lane >> 2, t4 = lane & 3;
    for (int item = blockIdx.x;; item += gridDim.x) {
      int b, local, cnt, L;
      if (!scan.locate(a, item, b, local, cnt, L)) break;
      const WarpItem it = warp_item<Pol>(a, b, local, cnt, L);
      const DecodeRows rows{a, b, it.kv_head, 0, L};
      float acc[D / 8][4];
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
      }
      SoftmaxRows smx;
      smx.init();
      if (it.t0 < it.t1) {
        uint32_t qa[D / 16][4];
        load_q(rows, qa);
        int lo[2], hi[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          lo[h] = __shfl_sync(0xffffffffu, it.row_lo, g + 8 * h);
          hi[h] = __shfl_sync(0xffffffffu, it.row_hi, g + 8 * h);
        }
        for (int tile = it.t0; tile < it.t1; ++tile) {
          wait(sm.full(st.slot), st.phase);
          const int key0 = tile * TK + row0;
          // V rows outside the keys any row sees (past L: whatever the page holds; before
          // a window's start, or of skipped boxes: stale rows) must not meet a zero
          // probability: zero them, as the portable loader zero-fills (K's are masked).
          const bool edge = key0 < it.lo || key0 + KW > it.hi;
          if (edge) zero_rows_outside(sm.v(st.slot), min(max(it.lo - key0, 0), KW), min(max(it.hi - key0, 0), KW));
          float s[KW / 8][4];
          qk(qa, smem_addr(sm.k(st.slot)), s);
          var.template transform<false>(s);
          if (!(key0 >= it.full_lo && key0 + KW <= it.full_hi)) mask_keys(s, key0, t4, lo, hi);
          // ftz: split results are compared within an ulp, not bitwise, across split
          // counts, and a request's splits never depend on the batch (decode/policy.h).
          smx.template update<KW / 8, D / 8, true>(s, acc);
          pv(s, smem_addr(sm.v(st.slot)), acc);
          if (edge) fence_async_smem();  // the zeroing (generic proxy) before the producer's next TMA write
          __syncwarp();                  // every lane's reads of the stage are done before it is released
          if (lane == 0) arrive(sm.empty(st.slot));
          st.advance();
        }
      }
      smx.finish();
      if (cnt == 1) {
        epilogue(smx, acc, DirectOut<T, DecodeRows>{a, rows});
      } else {
        epilogue(smx, acc, PartialOut<D, DecodeRows>{a, rows, it.split});
      }
    }
  }

  /// Q of rows g and g + 8 as m16n8k16 A fragments of QkT (zero for padding rows); for
  /// fp8 caches in qk_fp8's dim order (dims 16 kk + 4t .. + 3 as k 2t, 2t + 1, 2t + 8,
  /// 2t + 9), a bf16 query rounded to fp16 where S is computed in fp16.
  __device__ void load_q(const DecodeRows& rows, uint32_t (&qa)[D / 16][4]) const {
    const AttentionArgs& a = p.a;
    const int g = lane >> 2, t4 = lane & 3;
    const RowDesc r0 = rows(g), r1 = rows(g + 8);
    const uint32_t* q0 = reinterpret_cast<const uint32_t*>(
        static_cast<const T*>(a.q) + (r0.valid ? r0.qrow * a.q_row_stride + int64_t{r0.head} * a.q_head_stride : 0));
    const uint32_t* q1 = reinterpret_cast<const uint32_t*>(
        static_cast<const T*>(a.q) + (r1.valid ? r1.qrow * a.q_row_stride + int64_t{r1.head} * a.q_head_stride : 0));
    // Pairs of k 2t, 2t + 1 and 2t + 8, 2t + 9: dims 2t and 2t + 8 (m16n8k16), or 4t and
    // 4t + 2 in qk_fp8's order.
    const int lo = Pol::kFp8 ? 2 * t4 : t4, hi = Pol::kFp8 ? 2 * t4 + 1 : 4 + t4;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      qa[kk][0] = r0.valid ? __ldg(q0 + kk * 8 + lo) : 0u;
      qa[kk][1] = r1.valid ? __ldg(q1 + kk * 8 + lo) : 0u;
      qa[kk][2] = r0.valid ? __ldg(q0 + kk * 8 + hi) : 0u;
      qa[kk][3] = r1.valid ? __ldg(q1 + kk * 8 + hi) : 0u;
      if constexpr (!std::is_same<QkT, T>::value) {
#pragma unroll
        for (int e = 0; e < 4; ++e) qa[kk][e] = bf16x2_to_half_sat(qa[kk][e]);
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

  /// S = Q K^T over the warp tile's KW keys.
  __device__ void qk(const uint32_t (&qa)[D / 16][4], uint32_t k_base, float (&s)[KW / 8][4]) const {
#pragma unroll
    for (int i = 0; i < KW / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = 0.0f;
    }
    if constexpr (Pol::kFp8) {
      const auto q_frag = [&](int chunk, int, uint32_t(&f)[4]) {
#pragma unroll
        for (int e = 0; e < 4; ++e) f[e] = qa[chunk][e];
      };
      qk_fp8<Fp8Tile>(reinterpret_cast<float(&)[1][KW / 8][4]>(s), q_frag, k_base, warp, lane);
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < KW / 16; ++np) {
          uint32_t kb[4];
          const int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(kb, k_base + tile_offset(TK, row0 + key, 2 * kk + ((lane >> 3) & 1)));
          mma_16816<T>(s[2 * np], qa[kk], kb[0], kb[1]);
          mma_16816<T>(s[2 * np + 1], qa[kk], kb[2], kb[3]);
        }
      }
    }
  }

  /// O += P V with P the tile's probabilities (fp8: accumulators in pv_fp8's even / odd
  /// dim layout, which acc_pair reads).
  __device__ void pv(const float (&s)[KW / 8][4], uint32_t v_base, float (&acc)[D / 8][4]) const {
    if constexpr (Pol::kFp8) {
      pv_fp8<Fp8Tile>(reinterpret_cast<float(&)[1][D / 8][4]>(acc),
                      reinterpret_cast<const float(&)[1][KW / 8][4]>(s), v_base, warp, lane);
    } else {
#pragma unroll
      for (int kk = 0; kk < KW / 16; ++kk) {
        uint32_t pa[4];
        pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        const int key = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_base + tile_offset(TK, row0 + key, 2 * dp + (lane >> 4)));
          mma_16816<T>(acc[2 * dp], pa, vb[0], vb[1]);
          mma_16816<T>(acc[2 * dp + 1], pa, vb[2], vb[3]);
        }
      }
    }
  }

  /// Pair i (of D / 8) of the dims this lane holds of row g (h = 0) or g + 8 (h = 1):
  /// its values and first dim (pair_dim + lane_dim, kept apart so the stores keep their
  /// constant offsets). In the m16n8 layout acc[i][2h], acc[i][2h + 1] at 8i + 2t;
  /// in pv_fp8's even / odd layout (i = 2c + e) acc[2c][2h + e], acc[2c + 1][2h + e] at
  /// 16c + 4t + 2e.
  __device__ static float2 acc_pair(const float (&acc)[D / 8][4], int i, int h) {
    if constexpr (Pol::kFp8) {
      return make_float2(acc[i & ~1][2 * h + (i & 1)], acc[i | 1][2 * h + (i & 1)]);
    } else {
      return make_float2(acc[i][2 * h], acc[i][2 * h + 1]);
    }
  }
  __device__ static int pair_dim(int i) { return Pol::kFp8 ? 16 * (i >> 1) + 2 * (i & 1) : 8 * i; }
  __device__ static int lane_dim(int t4) { return Pol::kFp8 ? 4 * t4 : 2 * t4; }

  /// The consumer warps' barrier: named barrier 1, beside the ring's producer.
  __device__ static void consumers_sync() { named_sync(1, Pol::kConsumerThreads); }

  /// The CTA's merge of the warps' rows (each relative to its own integer reference):
  /// rescaled to the row maximum; warps 0 and 1 write the two buffers, each further pair
  /// adds to them in turn, and o = (buffer 0 + buffer 1) * the row's scale from `out`.
  template <class Out>
  __device__ void epilogue(const SoftmaxRows& smx, const float (&acc)[D / 8][4], const Out& out) const {
    const int g = lane >> 2, t4 = lane & 3, tid = threadIdx.x;
    if (t4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sm.stat_m()[warp * R + g + 8 * h] = smx.m[h];
        sm.stat_l()[warp * R + g + 8 * h] = smx.l[h];
      }
    }
    consumers_sync();
    if (tid < R) {
      float m_all, l_all;
      merge_warp_rows<W>(sm.stat_m(), sm.stat_l(), R, tid, m_all, l_all);
      sm.row_scale()[tid] = out.finish_row(tid, m_all, l_all);
    }
    float f[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m_all = -INFINITY;
#pragma unroll
      for (int w = 0; w < W; ++w) m_all = fmaxf(m_all, sm.stat_m()[w * R + g + 8 * h]);
      f[h] = m_all == -INFINITY ? 0.0f : fast_exp2(smx.m[h] - m_all);
    }
    float* buf = sm.buf(warp & 1);
    if (warp < 2) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
          const float2 x = acc_pair(acc, i, h);
          *reinterpret_cast<float2*>(buf + (g + 8 * h) * Pol::kOStride + pair_dim(i) + lane_dim(t4)) =
              make_float2(x.x * f[h], x.y * f[h]);
        }
      }
    }
    for (int pair = 1; pair < W / 2; ++pair) {
      consumers_sync();
      if ((warp >> 1) == pair) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int i = 0; i < D / 8; ++i) {
            float2* x = reinterpret_cast<float2*>(buf + (g + 8 * h) * Pol::kOStride + pair_dim(i) + lane_dim(t4));
            const float2 y = *x, z = acc_pair(acc, i, h);
            *x = make_float2(y.x + z.x * f[h], y.y + z.y * f[h]);
          }
        }
      }
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

/// The ring's producer warp: it walks the CTA's items as the consumer
/// warps do and loads each item's stages [tb, tb + n) into the ring, waiting for a
/// stage's empty barrier (every consumer warp has read its slice). Lane u * kPanels + c
/// issues box u (a page, or kTileKeys rows of a larger page) of panel c; its page id for
/// the next stage is read while this one is issued.
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
    RequestScan scan;
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
          tma_load_4d(&p.tm_k, sm.full(st.slot), sm.k(st.slot) + off, c * 64, it.kv_head, g.row(pos), page,
                      kEvictFirst);
          tma_load_4d(&p.tm_v, sm.full(st.slot), sm.v(st.slot) + off, c * 64, it.kv_head, g.row(pos), page,
                      kEvictFirst);
        }
        st.advance();
        page = next;
      }
    }
  }
};

template <int D, class T, class KV>
__global__ void __launch_bounds__(DecodePolicy<D, sizeof(KV) == 1>::kThreads,
                                  DecodePolicy<D, sizeof(KV) == 1>::kCtasPerSm)
    decode_sm90_kernel(const __grid_constant__ DecodeSm90Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Pol = DecodePolicy<D, sizeof(KV) == 1>;
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
