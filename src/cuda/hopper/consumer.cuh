// The consumer warpgroups of the Hopper kernels: each owns 64 rows of the query tile and
// runs S = Q K^T (wgmma, both operands in shared memory) and O += P V (wgmma, P from
// registers) over the KV tiles, last first, with the online softmax in registers:
//   * intra-warpgroup overlap: QK of tile j is issued together with P V of tile j - 1,
//     and the softmax of tile j runs while that P V is in flight;
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
#include "cuda/hopper/params.cuh"
#include "cuda/hopper/sm90.cuh"

namespace pagedmha::cuda::sm90 {

/// The attention variant on the device: docs/semantics.md section 1 through MaskVariant
/// (visible keys) plus the logits transform and the sink. Runtime fields; a variant with
/// compile-time flags (FA3's Is_causal / Has_softcap) can replace it where that pays.
struct DeviceVariant {
  const AttentionArgs& a;

  /// tanh(x) = 1 - 2 / (e^2x + 1): ex2 and rcp, no branches (tanhf's registers would
  /// spill at D = 256); absolute error a few ulp of 1, which is what c * tanh needs.
  __device__ __forceinline__ static float tanh_fast(float x) {
    return 1.0f - __fdividef(2.0f, fast_exp2_ftz(x * (2.0f * kLog2e)) + 1.0f);
  }

  /// Turns raw logits into log2 units; returns the scale left to fold into the softmax's
  /// FFMA (1 when applied here). Soft-cap: c * tanh(s * scale / c).
  template <int NS>
  __device__ __forceinline__ float transform(float (&s)[NS][4]) const {
    if (a.cap_log2 > 0.0f) {
#pragma unroll
      for (int i = 0; i < NS; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[i][e] = a.cap_log2 * tanh_fast(s[i][e] * a.cap_inner);
      }
      return 1.0f;
    }
    if (a.logit_scale_log2 > 0.0f) return a.logit_scale_log2;
#pragma unroll
    for (int i = 0; i < NS; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] *= a.logit_scale_log2;
    }
    return 1.0f;
  }

  /// The sink of query head h in log2 units (-inf when absent).
  __device__ __forceinline__ float sink_log2(int h) const {
    return a.sinks != nullptr ? a.sinks[h] * kLog2e : -INFINITY;
  }
};

template <class Pol, class T, class Variant>
struct Consumer {
  static constexpr int D = Pol::kHeadDim, BN = Pol::kBlockN, BM = Pol::kBlockM, S = Pol::kStages;

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
  /// it multicasts to are done with it.
  __device__ void release(uint64_t* bar) const {
    if ((ltid & 31) == 0) {
      arrive(bar);
      if (cluster == 2) Barrier::arrive(bar, peer, 1u);
    }
  }
  /// Q is this CTA's own.
  __device__ void release_q() const {
    if ((ltid & 31) == 0) arrive(sm.q_empty());
  }

  __device__ void issue_qk(float (&s)[BN / 8][4], int slot) const {
    if constexpr (PAGEDMHA_SM90_DIAG >= 2) {
      cute::warpgroup_commit_batch();
      return;
    }
    const uint32_t q = desc_lo_k_major(smem_addr(sm.q()) + wg * 64 * 128);
    const uint32_t k = desc_lo_k_major(smem_addr(sm.k(slot)));
    fence_operand(s);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      // k16 step kk: panel kk / 4, 32 bytes per step inside the panel's 128-byte rows.
      const uint32_t off = (kk % 4) * 32;
      gmma_ss<BN, T>(s, gmma_desc(q + (((kk / 4) * BM * 128 + off) >> 4)),
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
    for (int kk = 0; kk < BN / 16; ++kk) gmma_rs<D, T>(o, pa[kk], gmma_desc(v + ((kk * 16 * 128) >> 4)));
    cute::warpgroup_commit_batch();
  }

  /// Row h (0, 1) of the thread: row g + 8h of its warp's 16 in the warpgroup's 64.
  __device__ int row(int h) const { return wg * 64 + (ltid >> 5) * 16 + ((ltid & 31) >> 2) + 8 * h; }
  /// Its token in the tile (its head is head0 + row % pack), or -1 for a padding row.
  /// Recomputed where needed: no registers hold it across the KV tiles.
  __device__ int row_token(const QueryTile& t, int h) const {
    const int r = row(h);
    return r < p.space.tokens * p.pack && r / p.pack < t.n_tok ? r / p.pack : -1;
  }

  /// Masks the keys of a boundary tile that a row does not see (every key for padding
  /// rows).
  __device__ void mask(float (&s)[BN / 8][4], int key0, const QueryTile& t) const {
    const int t4 = ltid & 3;
    int lo[2], hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tok = row_token(t, h);
      narrow(p.space.mask.row(t.L, int64_t{t.p0} + tok), lo[h], hi[h]);
      if (tok < 0) lo[h] = hi[h] = 0;
    }
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + i * 8 + 2 * t4 + (e & 1);
        if (key < lo[e >> 1] || key >= hi[e >> 1]) s[i][e] = -INFINITY;
      }
    }
  }

  __device__ static void pack_p(uint32_t (&pa)[BN / 16][4], const float (&s)[BN / 8][4]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pa[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  }

  __device__ void run() {
    const Variant var{p.a};
    PipeState<S> ks, vs;
    uint32_t q_phase = 0;
    if (Pol::kPingPong && wg == W - 1) named_arrive(kBarTurn0, 256);  // warpgroup 0 goes first
    float s[BN / 8][4];
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = 0.0f;
    }
    const Walk walk(p);
    cluster = p.cluster;
    peer = walk.rank ^ 1;
    for (int item = walk.first; item < walk.total; item += walk.stride) {
      const QueryTile t = walk.tile(p, item);
      float o[D / 8][4];
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[i][e] = 0.0f;
      }
      SoftmaxRows smx;
      smx.init();
      const int n = t.keys.end - t.keys.begin;
      if (n > 0) {
        wait(sm.q_full(), q_phase);
        q_phase ^= 1;
        float alpha[2];
        // Tile 0 (the last key tile): S alone. Loads are waited for before taking the
        // turn, so a warpgroup never holds it while its data is in flight.
        wait(sm.k_full(ks.slot), ks.phase);
        turn_wait();
        issue_qk(s, ks.slot);
        turn_pass();
        cute::warpgroup_wait<0>();
        fence_operand(s);
        release(sm.k_empty(ks.slot));
        ks.advance();
        if (n == 1) release_q();
        softmax(var, s, t.keys.end - 1, t, smx, alpha);
        pack_p(pa, s);
        for (int j = 1; j < n; ++j) {
          wait(sm.k_full(ks.slot), ks.phase);
          wait(sm.v_full(vs.slot), vs.phase);
          turn_wait();
          issue_qk(s, ks.slot);
          // O (P V through tile j - 2, complete) takes tile j - 1's rescale while S of
          // tile j is on the tensor cores; then P V of tile j - 1 goes in behind it.
          SoftmaxRows::rescale(o, alpha);
          issue_pv(o, pa, vs.slot);
          turn_pass();
          cute::warpgroup_wait<1>();  // S of tile j
          fence_operand(s);
          release(sm.k_empty(ks.slot));
          ks.advance();
          if (j == n - 1) release_q();
          softmax(var, s, t.keys.end - 1 - j, t, smx, alpha);
          cute::warpgroup_wait<0>();  // P V of tile j - 1
          fence_operand(o);
          fence_operand(pa);
          release(sm.v_empty(vs.slot));
          vs.advance();
          pack_p(pa, s);
        }
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
      }
      epilogue(var, t, o, smx);
    }
    if (Pol::kPingPong && wg == 0) named_sync(kBarTurn0, 256);  // the last warpgroup's last pass
  }

  __device__ void softmax(const Variant& var, float (&s)[BN / 8][4], int tile, const QueryTile& t, SoftmaxRows& smx,
                          float (&alpha)[2]) const {
    if constexpr (PAGEDMHA_SM90_DIAG == 1 || PAGEDMHA_SM90_DIAG == 3) {
      alpha[0] = alpha[1] = 1.0f;
      return;
    }
    const float fold = var.transform(s);
    const int key0 = tile * BN;
    if (!(key0 >= t.keys.common_lo && key0 + BN <= t.keys.common_hi)) mask(s, key0, t);
    smx.template step<BN / 8, true, Pol::kFtzExp2>(s, fold, alpha);
  }

  /// Direct output: o = acc * scale (sink counted once, empty rows 0), lse in natural log.
  __device__ void epilogue(const Variant& var, const QueryTile& t, float (&o)[D / 8][4], SoftmaxRows& smx) const {
    smx.finish();
    const int t4 = ltid & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tok = row_token(t, h);
      if (tok < 0) continue;
      const int head = t.head0 + row(h) % p.pack;
      float scale, lse;
      finalize_softmax(smx.m[h], smx.l[h], var.sink_log2(head), p.a.bmm2_scale, scale, lse);
      const int64_t q_row = int64_t{t.q_row0} + tok;
      T* out = static_cast<T*>(p.a.out) + q_row * p.a.out_row_stride + int64_t{head} * p.a.out_head_stride;
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        *reinterpret_cast<uint32_t*>(out + 8 * i + 2 * t4) = pack2<T>(o[i][2 * h] * scale, o[i][2 * h + 1] * scale);
      }
      if (t4 == 0 && p.a.lse != nullptr) {
        p.a.lse[q_row * p.a.lse_row_stride + int64_t{head} * p.a.lse_head_stride] = lse;
      }
    }
  }
};

}  // namespace pagedmha::cuda::sm90
