// Exact CPU attention over a paged cache (docs/semantics.md section 1), shared by decode
// (uniform query lengths) and prefill (ragged). fp32 everywhere, output rounded once.
//
// Work item: one request, one KV head, a block of its query rows with all G query heads
// of that KV head. Keys are walked in blocks converted to fp32 once per item, and an
// online softmax with -inf masks keeps every visible logit exact however negative it is.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

#include "cpu/convert.h"
#include "cpu/cpu_ops.h"

namespace pagedmha::cpu {
namespace {

using detail::AttentionProblem;

constexpr int kKeyBlock = 64;       // keys converted to fp32 at a time
constexpr int kQueryVectors = 64;   // target (query row x head) vectors per work item
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// The largest logit whose log2 form (the CUDA kernels' units) is finite: FLT_MAX * ln 2.
constexpr float kMaxLogit = static_cast<float>(std::numeric_limits<float>::max() * std::numbers::ln2);

struct Request {
  int64_t row0;  // first query row
  int64_t n;     // query rows
  int64_t L;     // KV length
};

Request request(const AttentionProblem& p, int b) {
  if (p.cu_seqlens_q) return {p.cu_seqlens_q[b], int64_t{p.cu_seqlens_q[b + 1]} - p.cu_seqlens_q[b], p.seq_lens[b]};
  return {int64_t{b} * p.q_len_per_req, p.q_len_per_req, p.seq_lens[b]};
}


struct WorkItem {
  int b, g;
  int64_t i0, i1;  // query rows [i0, i1) of request b
  int64_t cost;    // rows x keys spanned, for load balance
};

struct Scratch {
  std::vector<float> q, acc, m, l, k, v, s, o;
  void reserve(int vectors, int d) {
    q.resize(static_cast<std::size_t>(vectors) * d);
    acc.resize(q.size());
    m.resize(vectors);
    l.resize(vectors);
    k.resize(static_cast<std::size_t>(kKeyBlock) * d);
    v.resize(k.size());
    s.resize(kKeyBlock);
    o.resize(d);
  }
};

// s[j] = dot(q, k[j]) for keys j in [a, e); four keys per pass reuse each q load.
inline void scores(const float* __restrict q, const float* __restrict k, int a, int e, int d, float* __restrict s) {
  int j = a;
  for (; j + 4 <= e; j += 4) {
    const float *k0 = k + j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int x = 0; x < d; ++x) {
      s0 += q[x] * k0[x];
      s1 += q[x] * k1[x];
      s2 += q[x] * k2[x];
      s3 += q[x] * k3[x];
    }
    s[j] = s0, s[j + 1] = s1, s[j + 2] = s2, s[j + 3] = s3;
  }
  for (; j < e; ++j) {
    const float* kj = k + j * d;
    float s0 = 0.0f;
#pragma omp simd reduction(+ : s0)
    for (int x = 0; x < d; ++x) s0 += q[x] * kj[x];
    s[j] = s0;
  }
}

// acc += sum_j p[j] * v[j] for j in [a, e); four keys per pass of acc.
inline void accumulate_pv(const float* __restrict p, const float* __restrict v, int a, int e, int d,
                          float* __restrict acc) {
  int j = a;
  for (; j + 4 <= e; j += 4) {
    const float *v0 = v + j * d, *v1 = v0 + d, *v2 = v1 + d, *v3 = v2 + d;
    const float p0 = p[j], p1 = p[j + 1], p2 = p[j + 2], p3 = p[j + 3];
#pragma omp simd
    for (int x = 0; x < d; ++x) acc[x] += p0 * v0[x] + p1 * v1[x] + p2 * v2[x] + p3 * v3[x];
  }
  for (; j < e; ++j) {
    const float* vj = v + j * d;
    const float pj = p[j];
#pragma omp simd
    for (int x = 0; x < d; ++x) acc[x] += pj * vj[x];
  }
}

// x86-64: also compiled for AVX2 + FMA, chosen at load time; the binary stays portable.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PAGEDMHA_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PAGEDMHA_CPU_CLONES
#endif

PAGEDMHA_CPU_CLONES void run_item(const AttentionProblem& p, const WorkItem& w, Scratch& sc) {
  const int G = p.num_q_heads / p.num_kv_heads;
  const int D = p.head_dim;
  const Request r = request(p, w.b);
  const int64_t rows = w.i1 - w.i0;
  const int M = static_cast<int>(rows * G);
  const auto pos = [&](int64_t i) { return r.L - r.n + i; };

  // Query vector m = (i - i0) * G + t holds query row i, head g * G + t.
  for (int64_t i = w.i0; i < w.i1; ++i) {
    for (int t = 0; t < G; ++t) {
      const int64_t h = int64_t{w.g} * G + t;
      const int m = static_cast<int>((i - w.i0) * G + t);
      load_row(offset(p.q, p.q_dtype, (r.row0 + i) * p.q_row_stride + h * p.q_head_stride), p.q_dtype, D,
               sc.q.data() + static_cast<std::size_t>(m) * D);
    }
  }
  std::fill_n(sc.acc.begin(), static_cast<std::size_t>(M) * D, 0.0f);
  std::fill_n(sc.m.begin(), M, kNegInf);
  std::fill_n(sc.l.begin(), M, 0.0f);

  const detail::KvCacheDesc& kv = p.kv;
  const int32_t* table = p.page_table + int64_t{w.b} * p.page_table_row_stride;
  const MaskVariant mask = p.mask();
  const KeySpan span = mask.rows_union(r.L, pos(w.i0), pos(w.i1 - 1));
  const float cap = p.logits_soft_cap;
  float* s = sc.s.data();

  for (int64_t kb = span.lo; kb < span.hi; kb += kKeyBlock) {
    const int kn = static_cast<int>(std::min<int64_t>(kKeyBlock, span.hi - kb));
    for (int jj = 0; jj < kn; ++jj) {
      const int64_t j = kb + jj;
      const int64_t page = table[j / kv.page_size];
      const int64_t tok = page * kv.k.page_stride + (j % kv.page_size) * kv.k.token_stride;
      const int64_t vtok = page * kv.v.page_stride + (j % kv.page_size) * kv.v.token_stride;
      load_row(offset(kv.k.data, kv.dtype, tok + w.g * kv.k.head_stride), kv.dtype, D, sc.k.data() + jj * D);
      load_row(offset(kv.v.data, kv.dtype, vtok + w.g * kv.v.head_stride), kv.dtype, D, sc.v.data() + jj * D);
    }
    for (int64_t i = w.i0; i < w.i1; ++i) {
      const KeySpan vis = mask.row(r.L, pos(i));
      const int a = static_cast<int>(std::max<int64_t>(vis.lo - kb, 0));
      const int e = static_cast<int>(std::min<int64_t>(vis.hi - kb, kn));
      if (e <= a) continue;
      for (int t = 0; t < G; ++t) {
        const int m = static_cast<int>((i - w.i0) * G + t);
        const float* qv = sc.q.data() + static_cast<std::size_t>(m) * D;
        scores(qv, sc.k.data(), a, e, D, s);
        float block_max = kNegInf;
        for (int jj = a; jj < e; ++jj) {
          // Overflowing logits count as kMaxLogit (docs/semantics.md section 8.1): no inf - inf, same as CUDA.
          float x = std::fmin(p.bmm1_scale * s[jj], kMaxLogit);
          if (cap > 0.0f) x = cap * std::tanh(x / cap);  // soft-cap before masking
          s[jj] = x;
          block_max = std::max(block_max, x);
        }
        const float m_new = std::max(sc.m[m], block_max);
        if (m_new == kNegInf) continue;  // every logit -inf: nothing to add, avoid inf - inf
        const float alpha = std::exp(sc.m[m] - m_new);  // 0 when the running max was -inf
        float* acc = sc.acc.data() + static_cast<std::size_t>(m) * D;
        if (alpha != 1.0f) {
#pragma omp simd
          for (int x = 0; x < D; ++x) acc[x] *= alpha;
        }
        float sum = 0.0f;
        for (int jj = a; jj < e; ++jj) {
          s[jj] = std::exp(s[jj] - m_new);
          sum += s[jj];
        }
        accumulate_pv(s, sc.v.data(), a, e, D, acc);
        sc.l[m] = sc.l[m] * alpha + sum;
        sc.m[m] = m_new;
      }
    }
  }

  // Finalise: the sink joins the denominator only; empty rows give o = 0, lse = -inf or sink.
  for (int64_t i = w.i0; i < w.i1; ++i) {
    for (int t = 0; t < G; ++t) {
      const int64_t h = int64_t{w.g} * G + t;
      const int m = static_cast<int>((i - w.i0) * G + t);
      const float* acc = sc.acc.data() + static_cast<std::size_t>(m) * D;
      float mx = sc.m[m], z = sc.l[m], rescale = 1.0f;
      if (p.sinks) {
        const float sink = p.sinks[h];
        const float m_new = std::max(mx, sink);
        if (m_new != kNegInf) {
          rescale = std::exp(mx - m_new);
          z = z * rescale + std::exp(sink - m_new);
          mx = m_new;
        }
      }
      const int64_t row = r.row0 + i;
      if (mx == kNegInf) {
        std::fill(sc.o.begin(), sc.o.end(), 0.0f);
      } else {
        const float f = p.bmm2_scale * rescale / z;
        for (int x = 0; x < D; ++x) sc.o[x] = acc[x] * f;
      }
      store_row(sc.o.data(), D, offset(p.out, p.out_dtype, row * p.out_row_stride + h * p.out_head_stride),
                p.out_dtype);
      if (p.lse) p.lse[row * p.lse_row_stride + h * p.lse_head_stride] = mx == kNegInf ? kNegInf : mx + std::log(z);
    }
  }
}

}  // namespace

void attention(const AttentionProblem& p) {
  const int G = p.num_q_heads / p.num_kv_heads;
  const int64_t rows_per_item = std::max(1, kQueryVectors / G);

  std::vector<WorkItem> items;
  for (int b = 0; b < p.batch; ++b) {
    const Request r = request(p, b);
    for (int64_t i0 = 0; i0 < r.n; i0 += rows_per_item) {
      const int64_t i1 = std::min(r.n, i0 + rows_per_item);
      const KeySpan span = p.mask().rows_union(r.L, r.L - r.n + i0, r.L - r.n + i1 - 1);
      const int64_t cost = (i1 - i0) * (span.size() + 1);
      for (int g = 0; g < p.num_kv_heads; ++g) items.push_back({b, g, i0, i1, cost});
    }
  }
  // Longest items first so dynamic scheduling finishes evenly (long causal prefills).
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& x, const WorkItem& y) { return x.cost > y.cost; });

  const int64_t num_items = static_cast<int64_t>(items.size());
  const int vectors = static_cast<int>(rows_per_item * G);
#pragma omp parallel if (num_items > 1)
  {
    Scratch sc;
    sc.reserve(vectors, p.head_dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < num_items; ++it) run_item(p, items[it], sc);
  }
}

}  // namespace pagedmha::cpu
