// Online softmax state of the two rows a thread owns in an m16n8 accumulator (rows g and
// g + 8 of its warp's 16, or rows 2t and 2t + 1 of an operand-swapped tile: RowsInN), in
// log2 units. Masked logits are -inf; a row that has seen
// no key keeps m = -inf and uses 0 as its reference so that no -inf - -inf arises.
//
// The reference m is the running maximum rounded UP to an integer: every rescale
// exp2(m_old - m_new) is then an exact power of two, and the probabilities exp2(s - m)
// (rounded to 16 bits for the P V mma) of one key differ between two references only by
// a power of two. So partial results over different key ranges (the warps of a CTA, the
// splits of split-KV) combine to the same value as one pass, up to fp32 summation order.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>

namespace pagedmha::cuda {

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));  // ex2(-inf) = +0
  return y;
}

/// ex2 with subnormal results flushed to +0: one MUFU.EX2, where the plain form costs a
/// compare and two multiplies around it (its subnormal-range scaling). A probability
/// below 2^-126 of the row's largest (which is >= 1/2) then counts as 0.
__device__ __forceinline__ float fast_exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// Where a thread's two rows lie in an m16n8 accumulator fragment (4 floats; lane = 4 g + t).
/// RowsInM: the rows are the mma's M, rows g and g + 8 (row h: elements 2h, 2h + 1), a
/// row's columns over the 4 lanes of a quad. RowsInN: the rows are its N, as in an
/// operand-swapped S^T = K Q^T: rows 2t and 2t + 1 (row h: elements h, h + 2), a row's
/// columns (the keys) over the 8 lanes with the same t.
struct RowsInM {
  __device__ static constexpr int elem(int h, int j) { return 2 * h + j; }
  __device__ static constexpr int row_of(int e) { return e >> 1; }
  /// The column (key) of element e of fragment i, from the tile's first: 8 columns each.
  __device__ static constexpr int key(int i, int e, int lane) { return i * 8 + 2 * (lane & 3) + (e & 1); }
  /// Max / sum over the lanes that share the thread's rows.
  __device__ __forceinline__ static float max_across(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  }
  __device__ __forceinline__ static float sum_across(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
  }
};

struct RowsInN {
  __device__ static constexpr int elem(int h, int j) { return h + 2 * j; }
  __device__ static constexpr int row_of(int e) { return e & 1; }
  /// The key of element e of fragment i: 16 keys (the mma's M) each.
  __device__ static constexpr int key(int i, int e, int lane) { return i * 16 + (lane >> 2) + 8 * (e >> 1); }
  __device__ __forceinline__ static float max_across(float x) {
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
  }
  __device__ __forceinline__ static float sum_across(float x) {
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
  }
};

/// The softmax state of a thread's two rows, for fragments laid out as Frag says.
template <class Frag>
struct OnlineSoftmax {
  float m[2];  // reference: running max rounded up to an integer (-inf before any key)
  float l[2];  // running sum of exp2(s - m), partial over the thread's columns until finish()

  __device__ __forceinline__ void init() {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }

  /// s: NS m16n8 logit fragments of one KV tile, in log2 units once multiplied by
  /// `scale` (> 0; folded into the FFMA that feeds ex2), replaced by the probabilities
  /// exp2(s * scale - m_new); alpha: the factor the output accumulated so far must be
  /// multiplied by (exact: 0, 2^-k or 1). The wgmma consumers apply it once their P V of
  /// the previous tile has landed (rescale()); update() does both at once.
  /// Warps where some reference reaches 2^20 in magnitude (a logit overflowing to +inf
  /// gives FLT_MAX) round the product s * scale before subtracting the reference, and
  /// clamp the exponent to <= 0. Below 2^20 the scale is folded into the FFMA: the
  /// reference is the ceiling of the rounded product max(s) * scale, and the exact
  /// product the FFMA exponentiates differs from the rounded one by at most half an ulp
  /// of a number below 2^20, so every exponent is <= 2^-5 (P <= 1.03) and the largest
  /// logit's P is within 2^-5 of 1. Above 2^20 that half ulp grows (256 at 2^32): exp2
  /// would overflow to inf or flush the largest logit to 0.
  /// kFtz: fast_exp2_ftz for the probabilities and alpha (kernels whose results are not
  /// compared bitwise across key splits: a reference change can move a probability
  /// across 2^-126 and so flush it on one side only). kOneCopy: the huge path rounds the
  /// products in place and shares the common path's exponentials (a smaller loop; the
  /// caller's policy says where it pays); else it has its own copy. Bitwise the same.
  template <int NS, bool kFtz = false, bool kOneCopy = false>
  __device__ __forceinline__ void step(float (&s)[NS][4], float scale, float (&alpha)[2]) {
    const auto ex2 = [](float x) { return kFtz ? fast_exp2_ftz(x) : fast_exp2(x); };
    float ref[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Four independent chains (max is exact in any order): the maximum gates every
      // exponential of the tile, and one chain of NS dependent FMNMX is its latency.
      float part[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
      for (int i = 0; i < NS; ++i) {
        part[i % 4] = fmaxf(part[i % 4], fmaxf(s[i][Frag::elem(h, 0)], s[i][Frag::elem(h, 1)]));
      }
      float mx = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
      mx = Frag::max_across(mx);
      mx = fmaxf(m[h], mx * scale);  // scale > 0: max commutes with it
      // A logit overflowing to +inf counts as FLT_MAX (docs/semantics.md section 8.1): the reference stays
      // finite and the clamp below gives such keys exp2(0) = 1 instead of inf - inf.
      ref[h] = mx == -INFINITY ? 0.0f : fminf(ceilf(mx), FLT_MAX);
      alpha[h] = ex2(m[h] - ref[h]);  // exact: 0, 2^-k or 1 (ftz: 0 below 2^-126)
      m[h] = mx == -INFINITY ? -INFINITY : ref[h];
    }
    constexpr float kExactRef = 0x1p20f;  // see above
    // Huge references (rare): the product is rounded first, as the reference was, so the
    // row's largest logit gets exp2(0) = 1 exactly (the fused form's excess, up to half an
    // ulp of the product: 2^13 at 2^37, would flush it to 0 as easily as overflow it), and
    // every exponent is clamped to <= 0.
    const bool huge = __any_sync(0xffffffffu, fabsf(ref[0]) >= kExactRef || fabsf(ref[1]) >= kExactRef);
    float sc = scale;
    if constexpr (kOneCopy) {
      // In place, by multiplies alone; the one copy of the exponentials below then runs
      // with scale 1, where fmaf(x, 1, -ref) is the rounded x - ref. fminf(x, ref) is x
      // except for +inf (a product past FLT_MAX: ref is FLT_MAX) and NaN, which both
      // become ref, i.e. exp2(0) = 1, as in the other form.
      if (huge) {
#pragma unroll
        for (int i = 0; i < NS; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[i][e] = fminf(__fmul_rn(s[i][e], scale), ref[Frag::row_of(e)]);
        }
        sc = 1.0f;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = 0.0f;
      if (!kOneCopy && huge) {
#pragma unroll
        for (int i = 0; i < NS; ++i) {
          s[i][Frag::elem(h, 0)] = ex2(fminf(__fsub_rn(__fmul_rn(s[i][Frag::elem(h, 0)], scale), ref[h]), 0.0f));
          s[i][Frag::elem(h, 1)] = ex2(fminf(__fsub_rn(__fmul_rn(s[i][Frag::elem(h, 1)], scale), ref[h]), 0.0f));
          sum += s[i][Frag::elem(h, 0)] + s[i][Frag::elem(h, 1)];
        }
      } else {
#pragma unroll
        for (int i = 0; i < NS; ++i) {
          s[i][Frag::elem(h, 0)] = ex2(fmaf(s[i][Frag::elem(h, 0)], sc, -ref[h]));
          s[i][Frag::elem(h, 1)] = ex2(fmaf(s[i][Frag::elem(h, 1)], sc, -ref[h]));
          sum += s[i][Frag::elem(h, 0)] + s[i][Frag::elem(h, 1)];
        }
      }
      l[h] = l[h] * alpha[h] + sum;
    }
  }

  /// step() speculating that the tile leaves each reference where it is (0 before any
  /// key): the exponentials do not wait for the maxima, which are found beside them.
  /// Where the new reference lies within 64 of the speculated one, the probabilities and
  /// their sums are multiplied by the exact power of two between the two (nothing
  /// overflowed: each exponent was < 64 + 2^-5; nothing that matters was flushed: a
  /// value below 2^-126 is then below 2^-62 of the row's largest). Otherwise (a jump past
  /// 64, or at or past 2^20: step()'s rounded form) returns false with m and l untouched
  /// and s overwritten: the caller recomputes S and runs step(). NaN logits drop out of
  /// the maxima and propagate through the exponentials, as in step(). on_vote(ok) runs
  /// once the outcome is known, before the exponentials are done (the caller frees there
  /// what the recompute would not read). Both are the same on every lane of the warp.
  /// The probabilities differ from step()'s by the rounding of their exponent argument
  /// (another reference), so results are not bitwise those of step().
  template <int NS, bool kFtz = false, class OnVote>
  __device__ __forceinline__ bool speculate(float (&s)[NS][4], float scale, float (&alpha)[2], OnVote on_vote) {
    const auto ex2 = [](float x) { return kFtz ? fast_exp2_ftz(x) : fast_exp2(x); };
    constexpr float kExactRef = 0x1p20f;
    constexpr int C = NS >= 16 ? 4 : 2;  // independent max chains per row (registers)
    float spec[2], ref[2], mx[2];
    bool ok = true;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      spec[h] = m[h] == -INFINITY ? 0.0f : m[h];
      float part[C];
#pragma unroll
      for (int c = 0; c < C; ++c) part[c] = -INFINITY;
#pragma unroll
      for (int i = 0; i < NS; ++i) {
        part[i % C] = fmaxf(part[i % C], fmaxf(s[i][Frag::elem(h, 0)], s[i][Frag::elem(h, 1)]));
      }
      float x = part[0];
#pragma unroll
      for (int c = 1; c < C; ++c) x = fmaxf(x, part[c]);
      x = Frag::max_across(x);
      mx[h] = fmaxf(m[h], x * scale);
      ref[h] = mx[h] == -INFINITY ? 0.0f : fminf(ceilf(mx[h]), FLT_MAX);
      ok = ok && fabsf(ref[h] - spec[h]) <= 64.0f && fabsf(ref[h]) < kExactRef;
    }
    ok = __all_sync(0xffffffffu, ok);
    on_vote(ok);
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NS; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        s[i][Frag::elem(h, 0)] = ex2(fmaf(s[i][Frag::elem(h, 0)], scale, -spec[h]));
        s[i][Frag::elem(h, 1)] = ex2(fmaf(s[i][Frag::elem(h, 1)], scale, -spec[h]));
        sum[h] += s[i][Frag::elem(h, 0)] + s[i][Frag::elem(h, 1)];
      }
    }
    // Pinned before the branch: the compiler would otherwise sink the exponentials into
    // the one path that uses them, behind the vote.
#pragma unroll
    for (int i = 0; i < NS; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(s[i][e]));
    }
    if (!ok) return false;
    float fix[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      alpha[h] = ex2(m[h] - ref[h]);  // exact: 0, 2^-k or 1
      fix[h] = ex2(spec[h] - ref[h]);  // exact: 2^-64 .. 2^64
      m[h] = mx[h] == -INFINITY ? -INFINITY : ref[h];
    }
    if (__any_sync(0xffffffffu, fix[0] != 1.0f || fix[1] != 1.0f)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sum[h] *= fix[h];
#pragma unroll
        for (int i = 0; i < NS; ++i) {
          s[i][Frag::elem(h, 0)] *= fix[h];
          s[i][Frag::elem(h, 1)] *= fix[h];
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + sum[h];
    return true;
  }

  /// acc *= alpha per row; skipped when no reference of the warp moved (alpha == 1:
  /// exact), the common case once the integer reference has settled.
  template <int ND>
  __device__ __forceinline__ static void rescale(float (&acc)[ND][4], const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int i = 0; i < ND; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] *= alpha[Frag::row_of(e)];
      }
    }
  }

  /// step() then rescale() (the mma.sync mainloop: its P V of the tile follows at once).
  template <int NS, int ND, bool kFtz = false>
  __device__ __forceinline__ void update(float (&s)[NS][4], float (&acc)[ND][4], float scale = 1.0f) {
    float alpha[2];
    step<NS, kFtz>(s, scale, alpha);
    rescale(acc, alpha);
  }

  /// Completes the row sums across the threads that share a row.
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] = Frag::sum_across(l[h]);
    }
  }
};

using SoftmaxRows = OnlineSoftmax<RowsInM>;

/// Sets to -inf the logits of fragments laid out as Frag says outside their rows' visible
/// keys: s[i][e] is key key0 + Frag::key(i, e, lane) of the thread's row Frag::row_of(e),
/// which sees keys [lo[row], hi[row]).
template <class Frag = RowsInM, int NS>
__device__ __forceinline__ void mask_keys(float (&s)[NS][4], int key0, int lane, const int (&lo)[2],
                                          const int (&hi)[2]) {
#pragma unroll
  for (int i = 0; i < NS; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + Frag::key(i, e, lane);
      if (key < lo[Frag::row_of(e)] || key >= hi[Frag::row_of(e)]) s[i][e] = -INFINITY;
    }
  }
}

/// (m, l) of row r whose keys were split over N warps, each with its own integer
/// reference: stat_m / stat_l hold warp w's at [w * stride + r]. m_all is the largest
/// reference (-inf when no warp saw a key), l_all the sum of l_w * 2^(m_w - m_all) in warp
/// order (exact powers of two: see above).
template <int N>
__device__ __forceinline__ void merge_warp_rows(const float* stat_m, const float* stat_l, int stride, int r,
                                                float& m_all, float& l_all) {
  m_all = -INFINITY;
  l_all = 0.0f;
#pragma unroll
  for (int w = 0; w < N; ++w) m_all = fmaxf(m_all, stat_m[w * stride + r]);
  if (m_all != -INFINITY) {
#pragma unroll
    for (int w = 0; w < N; ++w) l_all += stat_l[w * stride + r] * fast_exp2(stat_m[w * stride + r] - m_all);
  }
}

/// Final scale and lse of a row whose keys gave (m, l) (log2 units, l relative to m),
/// counting the optional sink (log2 units, -inf when absent) once: o = acc * scale and
/// lse in natural log. Shared by the direct epilogue and the split-KV merge, so both
/// round identically. Accurate exp2f / log2f: once per row.
__device__ __forceinline__ void finalize_softmax(float m, float l, float sink, float bmm2_scale, float& scale,
                                                 float& lse) {
  const float mm = fmaxf(m, sink);
  scale = 0.0f;
  lse = -INFINITY;
  if (mm == -INFINITY) return;
  const float w = m == -INFINITY ? 0.0f : exp2f(m - mm);  // 0 when no key was seen
  const float z = l * w + (sink == -INFINITY ? 0.0f : exp2f(sink - mm));
  if (z > 0.0f) {
    scale = bmm2_scale * w / z;
    lse = (mm + log2f(z)) * 0.6931471805599453f;
  }
}

}  // namespace pagedmha::cuda
