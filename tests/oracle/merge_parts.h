// Partial attention results for the merge_attention_states suites (CPU and GPU): a paged
// problem's keys split into K disjoint sets, each part's (o, lse) computed by the fp64
// oracle over its own keys only, rounded to the parts' dtype (lse to fp32), stacked in
// o [K, rows, Hq, D] and lse [K, rows, Hq]. The expected merge is the oracle over the
// union, AttnProblem::reference().
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oracle/test_util.h"

namespace ptest {

/// The part (0..K-1) that key j of request b belongs to.
using KeySplit = std::function<int(int b, int j)>;

/// Named splits of `p`'s keys into K sets; some sets may be empty for some requests.
enum class SplitKind {
  ranges,       // contiguous key ranges with random boundaries (some ranges empty)
  pages,        // whole pages dealt round-robin (page c -> c % K)
  tokens,       // token j -> j % K
  one_part,     // every key in part K - 1, the other parts empty
  random_keys,  // each key in a random part
};

inline const char* split_name(SplitKind s) {
  switch (s) {
    case SplitKind::ranges: return "ranges";
    case SplitKind::pages: return "pages";
    case SplitKind::tokens: return "tokens";
    case SplitKind::one_part: return "one_part";
    case SplitKind::random_keys: return "random_keys";
  }
  return "?";
}

inline KeySplit make_split(const AttnProblem& p, SplitKind kind, int K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int P = p.c.page_size;
  switch (kind) {
    case SplitKind::ranges: {
      // bounds[b]: K - 1 sorted cut points in [0, L], repeats allowed (empty ranges).
      std::vector<std::vector<int>> bounds(p.batch);
      for (int b = 0; b < p.batch; ++b) {
        std::uniform_int_distribution<int> cut(0, p.c.kv_lens[b]);
        for (int i = 0; i + 1 < K; ++i) bounds[b].push_back(cut(rng));
        std::sort(bounds[b].begin(), bounds[b].end());
      }
      return [bounds](int b, int j) {
        return static_cast<int>(std::upper_bound(bounds[b].begin(), bounds[b].end(), j) - bounds[b].begin());
      };
    }
    case SplitKind::pages: return [K, P](int, int j) { return (j / P) % K; };
    case SplitKind::tokens: return [K](int, int j) { return j % K; };
    case SplitKind::one_part: return [K](int, int) { return K - 1; };
    case SplitKind::random_keys: {
      std::vector<std::vector<int>> part(p.batch);
      for (int b = 0; b < p.batch; ++b)
        for (int j = 0; j < p.c.kv_lens[b]; ++j) part[b].push_back(static_cast<int>(rng() % K));
      return [part](int b, int j) { return part[b][j]; };
    }
  }
  return {};
}

struct Parts {
  int K = 0;
  HostTensor o, lse;  // [K, rows, Hq, D] (dtype), fp32 [K, rows, Hq]
};

/// Stacked part tensors, poisoned. `row_pad` > 0 pads each part's rows (strided views).
inline Parts make_parts(const AttnProblem& p, int K, DType dtype, int row_pad = 0) {
  Parts parts;
  parts.K = K;
  const int64_t R = p.rows, H = p.c.Hq, D = p.c.D;
  const int64_t row = H * D + row_pad;
  parts.o = make_tensor(dtype, {K, R, H, D}, {R * row, row, D, 1}, std::max<int64_t>(K * R * row, 1));
  parts.lse = make_tensor(DType::fp32, {K, R, H});
  return parts;
}

/// Each part's (o, lse) from the oracle over the keys `split` gives it. The problem's
/// sinks go to part `sink_part` only (-1: to no part; the merge then takes them).
inline Parts oracle_parts(const AttnProblem& p, int K, const KeySplit& split, DType dtype, int sink_part,
                          int row_pad = 0) {
  Parts parts = make_parts(p, K, dtype, row_pad);
  const oracle::Format f = format_of(dtype);
  const int H = p.c.Hq, D = p.c.D;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < p.batch; ++b) {
    for (int k = 0; k < K; ++k) {
      const int n = p.q_lens[b], L = p.c.kv_lens[b];
      if (n == 0) continue;
      oracle::AttentionSpec s = p.spec();
      if (k != sink_part) s.sinks = nullptr;
      std::vector<char> in(static_cast<size_t>(std::max(L, 1)));
      for (int j = 0; j < L; ++j) in[j] = split(b, j) == k;
      const std::vector<double> q = p.q_values(p.q_start[b], n);
      std::vector<double> o(static_cast<size_t>(n) * H * D), lse(static_cast<size_t>(n) * H);
      oracle::attention(s, n, L, q.data(), p.k_log[b].data(), p.v_log[b].data(), o.data(), lse.data(), nullptr,
                        in.data());
      for (int i = 0; i < n; ++i) {
        const int64_t r = p.q_start[b] + i;
        for (int h = 0; h < H; ++h) {
          const size_t ih = static_cast<size_t>(i) * H + h;
          parts.lse.typed<float>()[(k * static_cast<int64_t>(p.rows) + r) * H + h] = static_cast<float>(lse[ih]);
          for (int d = 0; d < D; ++d) oracle::store(f, o[ih * D + d], parts.o.at({k, r, h, d}));
        }
      }
    }
  }
  return parts;
}

/// Part k of a stacked tensor, as a HostTensor of one less dim sharing its storage.
inline HostTensor part_of(const HostTensor& t, int64_t k) {
  HostTensor r = t;
  r.offset = t.offset + k * t.strides[0];
  r.shape.erase(r.shape.begin());
  r.strides.erase(r.strides.begin());
  return r;
}

/// For an empty part (lse = -inf) the op must not read o: fills those rows with NaN.
inline void poison_empty_parts(const Parts& parts) {
  const int64_t K = parts.o.shape[0], R = parts.o.shape[1], H = parts.o.shape[2], D = parts.o.shape[3];
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t k = 0; k < K; ++k)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t h = 0; h < H; ++h)
        if (parts.lse.get({k, r, h}) == -std::numeric_limits<double>::infinity())
          for (int64_t d = 0; d < D; ++d) parts.o.set({k, r, h, d}, nan);
}

/// A copy of `p` whose out is a fresh poisoned tensor of `dtype` (the merge's out has the
/// parts' dtype) and lse a fresh poisoned one, for check_attention.
inline AttnProblem with_merge_outputs(const AttnProblem& p, DType dtype) {
  AttnProblem r = with_new_outputs(p);
  r.out = make_tensor(dtype, {p.rows, p.c.Hq, p.c.D});
  r.c.with_lse = true;
  return r;
}

/// r (from with_merge_outputs) holding a merge written elsewhere (in place into a part):
/// out [rows, Hq, D] of r.out's dtype, out_lse fp32 [rows, Hq], so check_attention judges it.
inline void copy_merged(AttnProblem& r, const HostTensor& out, const HostTensor& out_lse) {
  const std::size_t es = elem_size(r.out.dtype);
  for (int t = 0; t < r.rows; ++t)
    for (int h = 0; h < r.c.Hq; ++h) {
      std::memcpy(r.lse.at({t, h}), out_lse.at({t, h}), 4);
      for (int d = 0; d < r.c.D; ++d) std::memcpy(r.out.at({t, h, d}), out.at({t, h, d}), es);
    }
}

/// Tolerances of a merge of rounded parts: the attention ops' for 16-bit outputs; for fp32
/// parts and output only fp32 arithmetic error.
inline Tolerance merge_tolerance(DType dtype) {
  if (dtype != DType::fp32) return Tolerance::for_output(dtype);
  Tolerance t;
  t.rel_l2 = 1e-5, t.row_rel_l2 = 1e-5, t.max_abs = 1e-5, t.lse_abs = 1e-5;
  return t;
}

// ---------------------------------------------------------------------------------
// Synthetic parts and the merge formula in fp64, for shapes too large for the oracle.

/// Random parts: o ~ N(0, 1) rounded to dtype, lse uniform in [-spread, spread] with a
/// fraction `empty` of -inf (their o set to NaN: never to be read).
inline Parts random_parts(int64_t R, int H, int D, int K, DType dtype, uint64_t seed, double empty = 0.2,
                          double spread = 20.0) {
  Parts parts;
  parts.K = K;
  parts.o = make_tensor(dtype, {K, R, H, D});
  parts.lse = make_tensor(DType::fp32, {K, R, H});
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  const oracle::Format f = format_of(dtype);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int k = 0; k < K; ++k)
    for (int64_t r = 0; r < R; ++r)
      for (int h = 0; h < H; ++h) {
        const bool is_empty = uni(rng) < empty;
        parts.lse.typed<float>()[(k * R + r) * H + h] =
            is_empty ? -std::numeric_limits<float>::infinity() : static_cast<float>((2 * uni(rng) - 1) * spread);
        for (int d = 0; d < D; ++d) oracle::store(f, is_empty ? nan : normal(rng), parts.o.at({k, r, h, d}));
      }
  return parts;
}

/// The merge in fp64: M = max(lse_i, sink), w_i = exp(lse_i - M), Z = sum w_i + exp(sink - M),
/// o = sum w_i o_i / Z, lse = M + ln Z; o = 0 and lse = -inf when M = -inf. Empty parts unread.
inline void reference_merge(const HostTensor& o, const HostTensor& lse, const std::vector<double>* sinks,
                            std::vector<double>& ref_o, std::vector<double>& ref_lse) {
  const int64_t K = o.shape[0], R = o.shape[1], H = o.shape[2], D = o.shape[3];
  const double ninf = -std::numeric_limits<double>::infinity();
  ref_o.assign(static_cast<size_t>(R * H * D), 0.0);
  ref_lse.assign(static_cast<size_t>(R * H), ninf);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const double sink = sinks ? (*sinks)[h] : ninf;
      double m = sink;
      for (int64_t k = 0; k < K; ++k) m = std::max(m, lse.get({k, r, h}));
      if (m == ninf) continue;
      double z = sink == ninf ? 0.0 : std::exp(sink - m);
      double* out = ref_o.data() + (r * H + h) * D;
      for (int64_t k = 0; k < K; ++k) {
        const double l = lse.get({k, r, h});
        if (l == ninf) continue;
        const double w = std::exp(l - m);
        z += w;
        for (int64_t d = 0; d < D; ++d) out[d] += w * o.get({k, r, h, d});
      }
      for (int64_t d = 0; d < D; ++d) out[d] /= z;
      ref_lse[r * H + h] = m + std::log(z);
    }
}

/// out [R, H, D] and out_lse [R, H] against reference_merge: every element within a
/// rounding of dtype (plus fp32 arithmetic) of its row's largest |value|; M = -inf rows
/// exactly 0 and -inf; lse within 1e-5 + 1e-6 |lse|; no NaN. Values below the dtype's
/// subnormal range may round to 0.
inline ::testing::AssertionResult check_merge(const HostTensor& out, const HostTensor* out_lse,
                                              const std::vector<double>& ref_o, const std::vector<double>& ref_lse) {
  const int64_t R = out.shape[0], H = out.shape[1], D = out.shape[2];
  const double rel = out.dtype == DType::bf16 ? 1.0 / 256 : out.dtype == DType::fp16 ? 1.0 / 1024 : 1e-5;
  // Half the smallest subnormal: values below it round to 0.
  const double floor = std::ldexp(1.0, out.dtype == DType::bf16 ? -134 : out.dtype == DType::fp16 ? -25 : -150);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const double* want = ref_o.data() + (r * H + h) * D;
      const double wl = ref_lse[r * H + h];
      double row_max = 0;
      for (int64_t d = 0; d < D; ++d) row_max = std::max(row_max, std::fabs(want[d]));
      for (int64_t d = 0; d < D; ++d) {
        const double got = out.get({r, h, d});
        const bool ok = std::isinf(wl) ? got == 0.0 : std::fabs(got - want[d]) <= rel * row_max + floor;
        if (!ok) {
          return ::testing::AssertionFailure() << "out row " << r << " head " << h << " dim " << d << ": " << got
                                               << ", expected " << want[d] << " (row max " << row_max << ")";
        }
      }
      if (out_lse) {
        const double got = out_lse->get({r, h});
        const bool ok = std::isinf(wl) ? got == wl : std::fabs(got - wl) <= 1e-5 + 1e-6 * std::fabs(wl);
        if (!ok) {
          return ::testing::AssertionFailure() << "out_lse row " << r << " head " << h << ": " << got << ", expected "
                                               << wl;
        }
      }
    }
  return ::testing::AssertionSuccess();
}

}  // namespace ptest
