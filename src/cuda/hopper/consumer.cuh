// The consumer warpgroups of the Hopper kernels: each owns 64 rows of the query tile and
// runs S = Q K^T (wgmma, both operands in shared memory) and O += P V (wgmma, P from
// registers) over the KV tiles, last first, with the online softmax in registers:
//   * intra-warpgroup overlap: QK of tile j is issued together with P V of tile j - 1,
//     and the softmax of tile j runs while that P V is in flight, across items too (the
//     last P V of an item goes with the next item's first QK);
//   * ping-pong: the warpgroups take turns issuing (named barriers), so one's softmax
//     overlaps the others' GEMMs.
// The Variant (mask, logits transform, finalisation) is a template parameter; tiles
// inside the keys every row sees skip the mask.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/hopper/device_variant.cuh"
#include "cuda/hopper/params.cuh"
#include "cuda/hopper/sm90.cuh"

namespace pagedmha::cuda::sm90 {

template <class Pol, class T, class Variant>
struct Consumer {
  static constexpr int D = Pol::kHeadDim, BN = Pol::kBlockN, BM = Pol::kBlockM;
  using KPipe = PipeState<Pol::kKStages>;
  using VPipe = PipeState<Pol::kVStages>;
  using M = MmaType<Pol, T>;  // Q, K, V and P in the GEMMs; T is the output's

  const Sm90Params& p;
  const SmemLayout<Pol> sm;  // by value: a reference would put it in local memory
  int wg;    // 0 .. W - 1: rows [64 wg, 64 wg + 64)
  int ltid;  // 0..127 within the warpgroup

  // Turns rotate 0, 1, .., W - 1, 0, ..: warpgroup w waits on its barrier, which its
  // predecessor arrives on once it has issued (256 threads: the waiter and the arriver).
  static constexpr int W = Pol::kConsumerWarpgroups;
  __device__ void turn_wait() const {
    if constexpr (Pol::kPingPong) named_sync(kBarTurn0 + wg, 256);
  }
  __device__ void turn_pass() const {
    if constexpr (Pol::kPingPong) named_arrive(kBarTurn0 + (wg + 1 == W ? 0 : wg + 1), 256);
  }
  int cluster, peer;  // CTAs per cluster; the other CTA's rank (cluster of two)

  /// A consumed K / V stage: its producer may refill it once the consumers of every CTA
  /// it multicasts to are done with it. Lane 0 of each warp arrives: with policy.h
  /// kPredRelease by predicated instructions, else in a branch around them (divergent:
  /// a BSSY / BSYNC region per release).
  __device__ void release(uint64_t* bar) const {
    if constexpr (Pol::kPredRelease) {
      const bool lane0 = (ltid & 31) == 0;
      arrive_if(bar, lane0);
      arrive_peer_if(bar, peer, lane0 && cluster == 2);
    } else if ((ltid & 31) == 0) {
      arrive(bar);
      if (cluster == 2) Barrier::arrive(bar, peer, 1u);
    }
  }
  /// Q is this CTA's own.
  __device__ void release_q(int slot) const {
    if constexpr (Pol::kPredRelease) {
      arrive_if(sm.q_empty(slot), (ltid & 31) == 0);
    } else if ((ltid & 31) == 0) {
      arrive(sm.q_empty(slot));
    }
  }

  /// S = Q K^T of the stage's first 8 NS keys (NS = BN / 8: all of them).
  template <int NS>
  __device__ void issue_qk(float (&s)[NS][4], int slot, int q_slot) const {
    if constexpr (PAGEDMHA_SM90_DIAG >= 2) {
      cute::warpgroup_commit_batch();
      return;
    }
    const uint32_t q = desc_lo_k_major(smem_addr(sm.q(q_slot)) + wg * 64 * 128);
    const uint32_t k = desc_lo_k_major(smem_addr(sm.k(slot)));
    fence_operand(s);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      // k16 step kk: panel kk / 4, 32 bytes per step inside the panel's 128-byte rows.
      const uint32_t off = (kk % 4) * 32;
      gmma_ss<8 * NS, M>(s, gmma_desc(q + (((kk / 4) * BM * 128 + off) >> 4)),
                         gmma_desc(k + (((kk / 4) * BN * 128 + off) >> 4)), kk > 0);
    }
    cute::warpgroup_commit_batch();
  }

  __device__ void issue_pv(float (&o)[D / 8][4], const uint32_t (&pa)[BN / 16][4], int slot) const {
    if constexpr (PAGEDMHA_SM90_DIAG >= 2) {
      cute::warpgroup_commit_batch();
      return;
    }
    const uint32_t v = desc_lo_mn_major(smem_addr(sm.v(slot)), BN * 128);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) gmma_rs<D, M>(o, pa[kk], gmma_desc(v + ((kk * 16 * 128) >> 4)));
    cute::warpgroup_commit_batch();
  }

  /// Row h (0, 1) of the thread: row g + 8h of its warp's 16 in the warpgroup's 64.
  __device__ int row(int h) const { return wg * 64 + (ltid >> 5) * 16 + ((ltid & 31) >> 2) + 8 * h; }
  /// Its token in the tile (row / pack; -1 for a padding row) and head offset (row %
  /// pack: the head is head0 + it). Recomputed where needed: no registers hold them
  /// across the KV tiles.
  __device__ int row_token(int n_tok, int h, int& head_off) const {
    const int r = row(h);
    int tok;
    p.pack_div.fast_divmod(tok, head_off, r);
    return r < p.space.tokens * p.pack && tok < n_tok ? tok : -1;
  }

  /// Masks the keys of a boundary tile that a row does not see (every key for padding
  /// rows).
  template <int NS>
  __device__ void mask(float (&s)[NS][4], int key0, const QueryTile& t) const {
    int lo[2], hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int head_off;
      const int tok = row_token(t.n_tok, h, head_off);
      narrow(p.space.mask.row(t.L, int64_t{t.p0} + tok), lo[h], hi[h]);
      if (tok < 0) lo[h] = hi[h] = 0;
    }
    mask_keys(s, key0, ltid & 31, lo, hi);
  }

  /// P of the tile from the probabilities of its first 8 NS keys (0 for the rest; NS is
  /// odd for the half of an 80-key tile).
  template <int NS>
  __device__ static void pack_p(uint32_t (&pa)[BN / 16][4], const float (&s)[NS][4]) {
#pragma unroll
    for (int kk = 0; kk < NS / 2; ++kk) p_fragment<M>(pa[kk], s, kk);
    if constexpr (NS % 2 == 1) {
      pa[NS / 2][0] = pack2<M>(s[NS - 1][0], s[NS - 1][1]);
      pa[NS / 2][1] = pack2<M>(s[NS - 1][2], s[NS - 1][3]);
      pa[NS / 2][2] = pa[NS / 2][3] = 0u;
    }
#pragma unroll
    for (int kk = (NS + 1) / 2; kk < BN / 16; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
  }

  /// What the epilogue of an item needs once its tiles have run (the item whose last
  /// P V is still in flight while the next item's first QK runs).
  struct OutRows {
    int q_row0, head0, n_tok;
  };
  __device__ static OutRows out_rows(const QueryTile& t) { return {t.q_row0, t.head0, t.n_tok}; }

  /// One KV tile step: S = Q K^T of tile `tile` (the slot's Q), issued together with the
  /// pending P V (`pv`: the previous tile's P, of this item or, for j = 0, of the item
  /// before); the softmax of S runs while that P V is on the tensor cores. After it the
  /// pending P V is complete (O and its V stage are free), S becomes the new pending P and
  /// `on_pv` runs.
  /// `pv` is a template parameter: ptxas tracks the wgmma accumulators only through
  /// straight-line code, and a runtime branch around an issue makes it wait for every
  /// HGMMA (scripts/sass_check.py: gsb0 on all of them).
  /// S has NS = BN / 8 fragments, or BN / 16 where no row sees a key of the tile's upper
  /// half (first_step): S and the softmax then cover its first BN / 2 keys and P's
  /// upper half is 0 (the P V is whole).
  template <bool pv, bool kFirst, int NS, class OnPv>
  __device__ __forceinline__ void kv_step(const Variant& var, float (&s)[NS][4], uint32_t (&pa)[BN / 16][4],
                                          float (&o)[D / 8][4], float (&alpha)[2], SoftmaxRows& smx,
                                          const QueryTile& t, int tile, int q_slot, bool last, KPipe& ks, VPipe& vs,
                                          OnPv on_pv) const {
    wait(sm.k_full(ks.slot), ks.phase);
    if constexpr (pv) wait(sm.v_full(vs.slot), vs.phase);
    // O (P V through two tiles back, complete) takes the pending P's rescale before S is
    // issued (after it, ptxas cannot tell O from the in-flight S across the item loop and
    // injects a wait: C7517); rare once the integer reference settles.
    if constexpr (pv) SoftmaxRows::rescale(o, alpha);
    turn_wait();
    issue_qk(s, ks.slot, q_slot);
    if constexpr (pv) issue_pv(o, pa, vs.slot);
    turn_pass();
    if constexpr (pv) {
      cute::warpgroup_wait<1>();  // S
    } else {
      cute::warpgroup_wait<0>();
    }
    fence_operand(s);
    // The K stage is free once S has landed (the speculative softmax's rare recompute
    // reads K from the cache); after an item's last tile its Q tile too, or with the
    // speculative softmax once the warp knows it will not recompute S from it.
    release(sm.k_empty(ks.slot));
    ks.advance();
    constexpr bool kSpec = Pol::kSpecSoftmax && !kFirst;
    if (!kSpec && last) release_q(q_slot);
    softmax<kSpec>(var, s, tile * BN, t, smx, alpha, q_slot,
                   [&](bool ok) { arrive_if(sm.q_empty(q_slot), ok && last && (ltid & 31) == 0); });
    if constexpr (pv) {
      cute::warpgroup_wait<0>();  // the pending P V
      fence_operand(o);
      fence_operand(pa);
      release(sm.v_empty(vs.slot));
      vs.advance();
      on_pv();
    }
    pack_p(pa, s);
  }

  /// An item's first step: its last key tile, with the pending item's last P V, whose
  /// epilogue then runs. Where no row sees a key of the tile's upper half (on a full
  /// prompt half of the items: 64-row query tiles over 128-key tiles), Q K^T is a wgmma of
  /// N = BN / 2 into an S of its own and the softmax covers half the fragments
  /// (docs/perf-notes/prefill-sm90-schedule.md section 9).
  __device__ __forceinline__ void first_step(const Variant& var, float (&s)[BN / 8][4], uint32_t (&pa)[BN / 16][4],
                                             float (&o)[D / 8][4], float (&alpha)[2], SoftmaxRows& smx,
                                             SoftmaxRows& done, const OutRows& prev, bool pending, const QueryTile& t,
                                             int n, int q_slot, KPipe& ks, VPipe& vs) const {
    const auto step = [&](auto& sx) {
      if (pending) {
        kv_step<true, true>(var, sx, pa, o, alpha, smx, t, t.keys.end - 1, q_slot, n == 1, ks, vs, [&] {
          epilogue(var, prev, o, done);
          zero(o);
        });
      } else {
        kv_step<false, true>(var, sx, pa, o, alpha, smx, t, t.keys.end - 1, q_slot, n == 1, ks, vs, [] {});
      }
    };
    if (t.keys.span_hi - (t.keys.end - 1) * BN <= BN / 2) {
      float sh[BN / 16][4];  // S of the tile's lower half, registers of its own
      step(sh);
    } else {
      step(s);
    }
  }

  /// The pending item's last P V and its epilogue, when no next QK goes with it.
  __device__ void drain(const Variant& var, uint32_t (&pa)[BN / 16][4], float (&o)[D / 8][4],
                        const float (&alpha)[2], SoftmaxRows& done, const OutRows& prev, VPipe& vs) const {
    wait(sm.v_full(vs.slot), vs.phase);
    turn_wait();
    SoftmaxRows::rescale(o, alpha);
    issue_pv(o, pa, vs.slot);
    turn_pass();
    cute::warpgroup_wait<0>();
    fence_operand(o);
    fence_operand(pa);
    release(sm.v_empty(vs.slot));
    vs.advance();
    epilogue(var, prev, o, done);
  }

  __device__ static void zero(float (&o)[D / 8][4]) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][e] = 0.0f;
    }
  }

  /// The items of the walk as one stream of KV tiles: the pipeline does not drain between
  /// items. The last P V of an item goes in with the next item's first QK, and its
  /// epilogue runs once that P V is done (short prompts have a few tiles per item: a
  /// drained pipeline cost them a QK, a softmax and a P V of idle tensor cores each).
  /// Inlined into the kernel: where ptxas left it a call (fp8 at D = 128 with the
  /// speculative softmax), it serialized every wgmma (C7510).
  __device__ __forceinline__ void run() {
    const Variant var{p.a};
    KPipe ks;
    VPipe vs;
    PipeState<Pol::kQSlots> qs;
    if (Pol::kPingPong && wg == W - 1) named_arrive(kBarTurn0, 256);  // warpgroup 0 goes first
    float s[BN / 8][4];
    uint32_t pa[BN / 16][4];
    float o[D / 8][4];
    float alpha[2];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = 0.0f;
    }
    zero(o);
    const Walk walk(p);
    cluster = p.cluster;
    peer = walk.rank ^ 1;
    SoftmaxRows smx, done;  // the running item's rows; the pending item's
    OutRows prev{};
    bool pending = false;
    int4 next = walk.entry(p, walk.begin(p));
    for (int item = walk.begin(p); item < walk.total; item = walk.next(p, item)) {
      const QueryTile t = walk.template tile<BN>(p, item, next);
      next = walk.entry(p, walk.next(p, item));
      if (t.n_tok <= 0) continue;  // a pair's missing tile (schedule.cuh plan_kernel)
      const int n = t.keys.end - t.keys.begin;
      smx.init();
      if (n <= 0) {  // no key: o = 0 (and the sink alone decides the lse)
        if (pending) drain(var, pa, o, alpha, done, prev, vs);
        pending = false;
        zero(o);
        epilogue(var, out_rows(t), o, smx);
        continue;
      }
      wait(sm.q_full(qs.slot), qs.phase);
      first_step(var, s, pa, o, alpha, smx, done, prev, pending, t, n, qs.slot, ks, vs);
      for (int j = 1; j < n; ++j) {
        kv_step<true, false>(var, s, pa, o, alpha, smx, t, t.keys.end - 1 - j, qs.slot, j == n - 1, ks, vs, [] {});
      }
      qs.advance();
      pending = true;
      done = smx;
      prev = out_rows(t);
    }
    if (pending) drain(var, pa, o, alpha, done, prev, vs);
    if (Pol::kPingPong && wg == 0) named_sync(kBarTurn0, 256);  // the last warpgroup's last pass
  }

  /// One online-softmax step over the NS m16n8 fragments of keys [key0, key0 + 8 NS).
  /// kSpec (Pol::kSpecSoftmax, after an item's first step, which sets the references):
  /// the exponentials run against the current references while the row maxima are found
  /// (SoftmaxRows::speculate); where a reference jumps too far the warp recomputes its S
  /// (recompute_s) and takes the plain step. free_q(ok) runs once the warp knows whether
  /// it reads the Q tile again.
  template <bool kSpec, int NS, class FreeQ>
  __device__ void softmax(const Variant& var, float (&s)[NS][4], int key0, const QueryTile& t, SoftmaxRows& smx,
                          float (&alpha)[2], int q_slot, FreeQ free_q) const {
    if constexpr (PAGEDMHA_SM90_DIAG == 1 || PAGEDMHA_SM90_DIAG == 3) {
      alpha[0] = alpha[1] = 1.0f;
      return;
    }
    const bool boundary = !(key0 >= t.keys.common_lo && key0 + 8 * NS <= t.keys.common_hi);
    float fold = var.transform(s);
    if (boundary) mask(s, key0, t);
    if constexpr (kSpec) {
      if (!Pol::kSpecRecomputeAlways && smx.template speculate<NS, Pol::kFtzExp2>(s, fold, alpha, free_q)) return;
      recompute_s(s, t, key0, q_slot);
      fold = var.transform(s);
      if (boundary) mask(s, key0, t);
      smx.template step<NS, Pol::kFtzExp2, Pol::kSoftmaxOneCopy>(s, fold, alpha);
      free_q(true);
      return;
    }
    smx.template step<NS, Pol::kFtzExp2, Pol::kSoftmaxOneCopy>(s, fold, alpha);
  }

  /// S of this warp's 16 rows again, by mma.sync (the wgmma is warpgroup-wide; this path
  /// is one warp's, and rare: a reference jumping by more than 64). Q from its tile in
  /// shared memory; K from the cache in global memory, since its stage went back to the
  /// producer once S landed (holding it through the softmax cost 4-5% at D = 64:
  /// docs/perf-notes/prefill-sm90-schedule.md section 13), as the producer loads it
  /// (fp8: the same exact conversion) and 0 outside the keys the tile reads (masked).
  /// The same fragment layout and sums as the wgmma's: bitwise its S.
  template <int NS>
  __device__ __forceinline__ void recompute_s(float (&s)[NS][4], const QueryTile& t, int key0, int q_slot) const {
    constexpr int kEs = Pol::kFp8Kv ? 1 : 2;  // cache element bytes
    const int lane = ltid & 31;
    const uint32_t q = smem_addr(sm.q(q_slot));
    const int qr = wg * 64 + (ltid >> 5) * 16 + (lane & 7) + 8 * ((lane >> 3) & 1);  // A: matrices (rows, k half)
    // B of m16n8k16: lane holds key (lane / 4) of the block, dims 2 (lane % 4) + {0, 1, 8, 9}.
    const char* base =
        static_cast<const char*>(p.a.k) + (int64_t{t.kv_head} * p.a.k_head_stride + (lane & 3) * 2) * kEs;
    const int32_t* pages = p.a.page_table + int64_t{t.b} * p.a.page_table_row_stride;
    const auto pair = [&](const char* row, int d) -> uint32_t {
      if (row == nullptr) return 0u;
      if constexpr (Pol::kFp8Kv) {
        return fp8x2_to<M>(*reinterpret_cast<const uint16_t*>(row + d));
      } else {
        return *reinterpret_cast<const uint32_t*>(row + 2 * d);
      }
    };
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int pos = key0 + 8 * i + (lane >> 2);
      const char* row = nullptr;
      if (pos >= t.keys.span_lo && pos < t.keys.span_hi) {
        row = base + (int64_t{__ldg(pages + p.geo.col(pos))} * p.a.k_page_stride +
                      int64_t{p.geo.row(pos)} * p.a.k_token_stride) * kEs;
      }
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
      // k steps in a loop: few registers live beside O and P, which the pending P V holds.
#pragma unroll 1
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, q + tile_offset(BM, qr, 2 * kk + (lane >> 4)));
        mma_16816<M>(s[i], a, pair(row, 16 * kk), pair(row, 16 * kk + 8));
      }
    }
  }

  /// Direct output: o = acc * scale (sink counted once, empty rows 0), lse in natural log.
  /// The four threads of a row hold 4-byte column pairs (8 i + 2 t4). With Pol::kOut16 a
  /// transpose inside the quad (quad_transpose) gives thread t4 the 16 contiguous bytes of
  /// columns [8 i, 8 i + 8) for i = 4 c + t4, and each row is written in 16-byte stores
  /// that fill whole 32-byte sectors (batch_prefill checks that out is 16-byte aligned
  /// with 16-byte multiple strides: ops.cpp aligned16; a dimension of size 1 is only ever
  /// indexed at 0).
  __device__ void epilogue(const Variant& var, const OutRows& t, const float (&o)[D / 8][4], SoftmaxRows& smx) const {
    smx.finish();
    const int t4 = ltid & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int head_off;
      const int tok = row_token(t.n_tok, h, head_off);  // the same for the row's four threads
      if constexpr (!Pol::kOut16) {
        if (tok < 0) continue;
      }
      const int head = t.head0 + head_off;
      float scale = 0.0f, lse = 0.0f;
      if (tok >= 0) finalize_softmax(smx.m[h], smx.l[h], var.sink_log2(head), p.a.bmm2_scale, scale, lse);
      uint32_t w[D / 8];
#pragma unroll
      for (int i = 0; i < D / 8; ++i) w[i] = pack2<T>(o[i][2 * h] * scale, o[i][2 * h + 1] * scale);
      if constexpr (Pol::kOut16) {
#pragma unroll
        for (int c = 0; c < D / 32; ++c) quad_transpose(w + 4 * c, t4);  // every lane: shuffles
        if (tok < 0) continue;
      }
      const int64_t q_row = int64_t{t.q_row0} + tok;
      T* out = static_cast<T*>(p.a.out) + q_row * p.a.out_row_stride + int64_t{head} * p.a.out_head_stride;
      if constexpr (Pol::kOut16) {
#pragma unroll
        for (int c = 0; c < D / 32; ++c) {
          *reinterpret_cast<uint4*>(out + 8 * (4 * c + t4)) = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) *reinterpret_cast<uint32_t*>(out + 8 * i + 2 * t4) = w[i];
      }
      if (t4 == 0 && p.a.lse != nullptr) {
        p.a.lse[q_row * p.a.lse_row_stride + int64_t{head} * p.a.lse_head_stride] = lse;
      }
    }
  }

  /// 4 x 4 transpose of 32-bit words across the quad's threads: on entry thread t holds
  /// x[j] = word t of column group j (columns 8 j + 2 t, 8 j + 2 t + 1), on return word j
  /// of group t. Two butterfly stages (lane bit 1, then bit 0), two shuffles each.
  __device__ static void quad_transpose(uint32_t* x, int t) {
    const bool t1 = (t & 2) != 0, t0 = (t & 1) != 0;
    // Stage 1: rows with the partner's bit 1. c[k1][j0] = word (k1, t0) of group (t1, j0).
    const uint32_t y0 = __shfl_xor_sync(0xffffffffu, t1 ? x[0] : x[2], 2);
    const uint32_t y1 = __shfl_xor_sync(0xffffffffu, t1 ? x[1] : x[3], 2);
    const uint32_t c00 = t1 ? y0 : x[0], c01 = t1 ? y1 : x[1];
    const uint32_t c10 = t1 ? x[2] : y0, c11 = t1 ? x[3] : y1;
    // Stage 2: the partner's bit 0. Word (k1, k0) of group t.
    const uint32_t z0 = __shfl_xor_sync(0xffffffffu, t0 ? c00 : c01, 1);
    const uint32_t z1 = __shfl_xor_sync(0xffffffffu, t0 ? c10 : c11, 1);
    x[0] = t0 ? z0 : c00;
    x[1] = t0 ? c01 : z0;
    x[2] = t0 ? z1 : c10;
    x[3] = t0 ? c11 : z1;
  }
};

}  // namespace pagedmha::cuda::sm90
