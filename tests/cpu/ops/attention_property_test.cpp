// Properties that catch whole classes of faults (TESTING.md): equivalences between
// modes, batch independence, sinks and extreme logits, empty visible sets, scale
// linearity and strided views. Each compares computed values, never "it ran".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "oracle/test_util.h"

namespace {

using pagedmha::DType;
using pagedmha::TensorView;
using namespace ptest;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Rows [start, start + rows) of a [R, H, D] view, every `step`-th row.
TensorView rows_of(const HostTensor& t, int64_t start, int64_t rows, int64_t step = 1) {
  TensorView v = t.view();
  v.data = t.at({start, 0, 0});
  v.shape[0] = rows;
  v.strides[0] *= step;
  return v;
}

/// Close within about one ulp of the output dtype, lse within fp32 rounding: two
/// computations of the same math that may order their fp32 sums differently.
::testing::AssertionResult same_rows(const HostTensor& a, int a_row, const HostTensor& b, int b_row, int rows) {
  const int H = static_cast<int>(a.shape[1]), D = static_cast<int>(a.shape[2]);
  const double ulp = a.dtype == DType::fp16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < D; ++d) {
        const double x = a.get({a_row + r, h, d}), y = b.get({b_row + r, h, d});
        if (!std::isfinite(x) || !std::isfinite(y) || std::fabs(x - y) > ulp * std::max(std::fabs(x), std::fabs(y))) {
          return ::testing::AssertionFailure() << "row " << a_row + r << " vs " << b_row + r << " head " << h << " dim "
                                               << d << ": " << x << " vs " << y;
        }
      }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_lse(const HostTensor& a, int a_row, const HostTensor& b, int b_row, int rows) {
  const int H = static_cast<int>(a.shape[1]);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < H; ++h) {
      const double x = a.typed<float>()[(a_row + r) * H + h], y = b.typed<float>()[(b_row + r) * H + h];
      if (!(x == y || std::fabs(x - y) <= 2e-5 * (1 + std::fabs(y)))) {
        return ::testing::AssertionFailure() << "lse row " << a_row + r << " vs " << b_row + r << " head " << h << ": "
                                             << x << " vs " << y;
      }
    }
  return ::testing::AssertionSuccess();
}

AttnCase base_case() {
  AttnCase c;
  c.Hq = 8, c.Hkv = 2, c.D = 128, c.page_size = 16;
  return c;
}

/// Fresh poisoned output and lse for `rows` rows of `p`'s shape.
struct Outputs {
  HostTensor out, lse;
  Outputs(const AttnProblem& p, int rows)
      : out(make_tensor(p.out.dtype, {rows, p.c.Hq, p.c.D})), lse(make_tensor(DType::fp32, {rows, p.c.Hq})) {}
};

// --- verify with N queries == N sequential single-query decodes ---------------------

class VerifyVsDecodes : public ::testing::TestWithParam<DType> {};

TEST_P(VerifyVsDecodes, SameRows) {
  AttnCase c = base_case();
  c.kv_dtype = GetParam();
  if (c.kv_dtype == DType::fp16) c.q_dtype = DType::fp16;
  if (c.kv_dtype == DType::fp8_e4m3) c.k_scale = 0.37, c.v_scale = 2.5;
  c.q_len_per_req = 4;
  c.kv_lens = {37, 4, 100, 16, 65};
  c.window_left = 20;
  c.sinks = SinkMode::mixed;
  const AttnProblem p = build(c);
  run_cpu(p);
  ASSERT_TRUE(check_attention(p, p.reference()));

  // The sequential path starts from a cache without the last N tokens and writes
  // each token (append_kv for bf16 / fp16; its stored bytes for fp8) before its step.
  AttnProblem s = p;
  s.kv.k.storage = std::make_shared<std::vector<uint8_t>>(*p.kv.k.storage);
  s.kv.v.storage = p.kv.v.storage == p.kv.k.storage ? s.kv.k.storage
                                                    : std::make_shared<std::vector<uint8_t>>(*p.kv.v.storage);
  const int B = p.batch, N = c.q_len_per_req;
  const size_t es = elem_size(c.kv_dtype);
  const uint32_t poison = poison_bits(c.kv_dtype);
  for (int b = 0; b < B; ++b)
    for (int j = c.kv_lens[b] - N; j < c.kv_lens[b]; ++j)
      for (int h = 0; h < c.Hkv; ++h)
        for (int d = 0; d < c.D; ++d) {
          std::memcpy(s.kv.kp(p.slots[b][j], h, d), &poison, es);
          std::memcpy(s.kv.vp(p.slots[b][j], h, d), &poison, es);
        }
  const auto ptable = p.page_table.view();
  for (int i = 0; i < N; ++i) {
    std::vector<int32_t> loc, lens;
    HostTensor k_new = make_tensor(c.kv_dtype == DType::fp16 ? DType::fp16 : DType::bf16, {B, c.Hkv, c.D});
    HostTensor v_new = make_tensor(k_new.dtype, {B, c.Hkv, c.D});
    for (int b = 0; b < B; ++b) {
      const int j = c.kv_lens[b] - N + i;
      loc.push_back(static_cast<int32_t>(p.slots[b][j]));
      lens.push_back(j + 1);
      for (int h = 0; h < c.Hkv; ++h)
        for (int d = 0; d < c.D; ++d) {
          if (c.kv_dtype == DType::fp8_e4m3) {
            std::memcpy(s.kv.kp(p.slots[b][j], h, d), p.kv.kp(p.slots[b][j], h, d), 1);
            std::memcpy(s.kv.vp(p.slots[b][j], h, d), p.kv.vp(p.slots[b][j], h, d), 1);
          } else {
            k_new.set({b, h, d}, p.kv.kget(p.slots[b][j], h, d));
            v_new.set({b, h, d}, p.kv.vget(p.slots[b][j], h, d));
          }
        }
    }
    HostTensor locs = make_int32(loc), seq = make_int32(lens);
    if (c.kv_dtype != DType::fp8_e4m3) {
      pagedmha::append_kv(k_new.view(), v_new.view(), s.kv.k.view(), s.kv.v.view(), locs.view(), c.page_size);
    }
    Outputs o(p, B);
    pagedmha::batch_decode(rows_of(p.q, i, B, N), s.kv.k.view(), s.kv.v.view(), ptable, seq.view(), c.page_size, 1,
                           o.out.view(), p.params(p.sinks.view()), o.lse.view());
    for (int b = 0; b < B; ++b) {
      EXPECT_TRUE(same_rows(p.out, b * N + i, o.out, b, 1)) << "step " << i << " request " << b;
      EXPECT_TRUE(same_lse(p.lse, b * N + i, o.lse, b, 1)) << "step " << i << " request " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, VerifyVsDecodes, ::testing::Values(DType::bf16, DType::fp16, DType::fp8_e4m3),
                         ::testing::PrintToStringParamName());

// --- prefill == chunked prefill with prefix == prefill then decodes -------------------

class PrefillChunks : public ::testing::TestWithParam<int> {};  // window_left

TEST_P(PrefillChunks, SameRows) {
  AttnCase c = base_case();
  c.decode = false;
  c.window_left = GetParam();
  c.sinks = c.window_left >= 0 ? SinkMode::mixed : SinkMode::none;
  c.release_window_pages = false;  // chunks start earlier than the full prompt's first query
  const int S = 150;
  c.q_lens = {S}, c.kv_lens = {S};
  const AttnProblem p = build(c);
  run_cpu(p);
  ASSERT_TRUE(check_attention(p, p.reference()));
  const auto prm = p.params(p.sinks.view());
  const auto pt = p.page_table.view();

  auto prefill = [&](int start, int n, int L, Outputs& o, int out_row) {
    HostTensor seq = make_int32({L}), cu = make_int32({0, n});
    TensorView out = o.out.view().slice(0, out_row, n), lse = o.lse.view().slice(0, out_row, n);
    pagedmha::batch_prefill(rows_of(p.q, start, n), p.kv.k.view(), p.kv.v.view(), pt, seq.view(), cu.view(),
                            c.page_size, n, out, prm, lse);
  };
  // Chunks of 64, 1 and 85 queries, each after the previous as its prefix.
  Outputs chunked(p, S);
  prefill(0, 64, 64, chunked, 0);
  prefill(64, 1, 65, chunked, 64);
  prefill(65, S - 65, S, chunked, 65);
  EXPECT_TRUE(same_rows(p.out, 0, chunked.out, 0, S));
  EXPECT_TRUE(same_lse(p.lse, 0, chunked.lse, 0, S));

  // Prefill of S - 3 tokens, then three single-query decodes.
  Outputs mixed(p, S);
  prefill(0, S - 3, S - 3, mixed, 0);
  for (int t = S - 3; t < S; ++t) {
    HostTensor seq = make_int32({t + 1});
    pagedmha::batch_decode(rows_of(p.q, t, 1), p.kv.k.view(), p.kv.v.view(), pt, seq.view(), c.page_size, 1,
                           mixed.out.view().slice(0, t, 1), prm, mixed.lse.view().slice(0, t, 1));
  }
  EXPECT_TRUE(same_rows(p.out, 0, mixed.out, 0, S));
  EXPECT_TRUE(same_lse(p.lse, 0, mixed.lse, 0, S));
}

INSTANTIATE_TEST_SUITE_P(Windows, PrefillChunks, ::testing::Values(-1, 31),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param < 0 ? std::string("no_window") : "window" + std::to_string(info.param);
                         });

// --- batch independence ------------------------------------------------------------

/// `p` with its requests reordered (new request b is old request perm[b]), padded
/// with `pad_lens.size()` rows of page 0 (table row all zeros), sharing the cache.
AttnProblem rebatch(const AttnProblem& p, const std::vector<int>& perm, const std::vector<int>& pad_lens) {
  AttnProblem r = p;
  const int B = static_cast<int>(perm.size() + pad_lens.size());
  r.batch = B;
  r.c.kv_lens.clear(), r.c.q_lens.clear(), r.q_lens.clear(), r.q_start.clear(), r.slots.clear();
  r.k_log.clear(), r.v_log.clear();
  std::vector<int32_t> cu = {0};
  for (int b = 0; b < B; ++b) {
    const bool pad = b >= static_cast<int>(perm.size());
    const int n = pad ? (p.c.decode ? p.c.q_len_per_req : 1) : p.q_lens[perm[b]];
    r.q_start.push_back(cu.back());
    r.q_lens.push_back(n);
    r.c.q_lens.push_back(n);
    cu.push_back(cu.back() + n);
    r.c.kv_lens.push_back(pad ? pad_lens[b - perm.size()] : p.c.kv_lens[perm[b]]);
    if (pad) {
      std::vector<int64_t> slots(r.c.kv_lens.back(), 0);
      for (size_t j = 0; j < slots.size(); ++j) slots[j] = static_cast<int64_t>(j);  // page 0
      r.slots.push_back(slots);
      r.k_log.emplace_back(slots.size() * p.c.Hkv * p.c.D, 0.0);
      r.v_log.emplace_back(slots.size() * p.c.Hkv * p.c.D, 0.0);
    } else {
      r.slots.push_back(p.slots[perm[b]]);
      r.k_log.push_back(p.k_log[perm[b]]);
      r.v_log.push_back(p.v_log[perm[b]]);
    }
  }
  r.rows = cu.back();
  r.q = make_tensor(p.q.dtype, {r.rows, p.c.Hq, p.c.D});
  std::mt19937 rng(7);
  std::normal_distribution<double> normal;
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < r.q_lens[b]; ++i)
      for (int h = 0; h < p.c.Hq; ++h)
        for (int d = 0; d < p.c.D; ++d) {
          const bool pad = b >= static_cast<int>(perm.size());
          r.q.set({r.q_start[b] + i, h, d}, pad ? normal(rng) : p.q.get({p.q_start[perm[b]] + i, h, d}));
        }
  r.page_table = make_tensor(DType::int32, {B, p.cols});
  for (int b = 0; b < B; ++b)
    for (int col = 0; col < p.cols; ++col)
      r.page_table.typed<int32_t>()[b * p.cols + col] =
          b < static_cast<int>(perm.size()) ? p.page_table.typed<int32_t>()[perm[b] * p.cols + col] : 0;
  std::vector<int32_t> lens(r.c.kv_lens.begin(), r.c.kv_lens.end());
  r.seq_lens = make_int32(lens);
  r.cu_seqlens_q = make_int32(cu);
  r.max_q_len = *std::max_element(r.q_lens.begin(), r.q_lens.end());
  r.out = make_tensor(p.out.dtype, {r.rows, p.c.Hq, p.c.D});
  r.lse = make_tensor(DType::fp32, {r.rows, p.c.Hq});
  return r;
}

struct BatchCase {
  bool decode;
  int n;  // decode q_len_per_req
};

// "decode3" (q_len_per_req 3) or "prefill": the test names and gtest's listings.
void PrintTo(const BatchCase& c, std::ostream* os) { *os << (c.decode ? "decode" + std::to_string(c.n) : "prefill"); }

class BatchIndependence : public ::testing::TestWithParam<BatchCase> {};

AttnProblem batch_problem(const BatchCase& bc) {
  AttnCase c = base_case();
  c.decode = bc.decode;
  c.q_len_per_req = bc.n;
  c.kv_lens = {300, 5, 129, 64, 1, 1000};
  if (!bc.decode) c.q_lens = {40, 5, 1, 64, 1, 7};
  c.sinks = SinkMode::mixed;
  return build(c);
}

TEST_P(BatchIndependence, PaddedRowsLeaveRealRowsBitwiseEqual) {
  const AttnProblem p = batch_problem(GetParam());
  run_cpu(p);
  ASSERT_TRUE(check_attention(p, p.reference()));
  std::vector<int> ident(p.batch);
  std::iota(ident.begin(), ident.end(), 0);
  const AttnProblem padded = rebatch(p, ident, {1, 0, 1});
  run_cpu(padded);
  EXPECT_TRUE(same_bits(p.out, 0, padded.out, 0, p.rows));
  EXPECT_TRUE(same_lse(p.lse, 0, padded.lse, 0, p.rows));
  // Padded rows read page 0 (zeros) only: o is exactly 0, never NaN.
  EXPECT_TRUE(check_attention(padded, padded.reference()));
}

TEST_P(BatchIndependence, PermutingRequestsPermutesOutputs) {
  const AttnProblem p = batch_problem(GetParam());
  run_cpu(p);
  const std::vector<int> perm = {5, 2, 0, 4, 1, 3};
  const AttnProblem q = rebatch(p, perm, {});
  run_cpu(q);
  for (int b = 0; b < p.batch; ++b) {
    EXPECT_TRUE(same_bits(q.out, q.q_start[b], p.out, p.q_start[perm[b]], p.q_lens[perm[b]])) << "request " << b;
    EXPECT_TRUE(same_lse(q.lse, q.q_start[b], p.lse, p.q_start[perm[b]], p.q_lens[perm[b]])) << "request " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, BatchIndependence,
                         ::testing::Values(BatchCase{true, 1}, BatchCase{true, 3}, BatchCase{false, 0}),
                         ::testing::PrintToStringParamName());

// --- extreme logits, sinks, empty sets, scales ---------------------------------------

/// Overwrites K of (request b, position j, kv head h) with a constant, in the cache
/// and in the oracle's copy.
void set_key(AttnProblem& p, int b, int j, double value) {
  for (int h = 0; h < p.c.Hkv; ++h)
    for (int d = 0; d < p.c.D; ++d) {
      oracle::store(format_of(p.c.kv_dtype), value, p.kv.kp(p.slots[b][j], h, d));
      p.k_log[b][(static_cast<size_t>(j) * p.c.Hkv + h) * p.c.D + d] = p.kv.kget(p.slots[b][j], h, d);
    }
}

class FarBelowSentinel : public ::testing::TestWithParam<DType> {};

TEST_P(FarBelowSentinel, OutputIsTheArgmaxValue) {
  // q = 1, k_j = -1096 everywhere (logit -70144) except one key at -1000 (-64000):
  // every logit is below -6e4, the softmax is one-hot, o = v of that key, not 0.
  for (bool decode : {true, false}) {
    AttnCase c = base_case();
    c.q_dtype = c.kv_dtype = GetParam();
    c.D = 64, c.sm_scale = 1.0, c.decode = decode;
    c.kv_lens = {50, 20};
    if (!decode) c.q_lens = {4, 20};
    AttnProblem p = build(c);
    const int argmax[2] = {17, 0};  // visible to every query of both requests
    for (int b = 0; b < 2; ++b) {
      for (int j = 0; j < c.kv_lens[b]; ++j) set_key(p, b, j, j == argmax[b] ? -1000.0 : -1096.0);
      for (int i = 0; i < p.q_lens[b]; ++i)
        for (int h = 0; h < c.Hq; ++h)
          for (int d = 0; d < c.D; ++d) p.q.set({p.q_start[b] + i, h, d}, 1.0);
    }
    run_cpu(p);
    const Reference ref = p.reference();
    ASSERT_TRUE(check_attention(p, ref));
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < p.q_lens[b]; ++i)
        for (int h = 0; h < c.Hq; ++h) {
          EXPECT_FLOAT_EQ(p.lse.typed<float>()[(p.q_start[b] + i) * c.Hq + h], -64000.0f);
          for (int d = 0; d < c.D; ++d) {
            const double want = p.v_log[b][(static_cast<size_t>(argmax[b]) * c.Hkv + h / (c.Hq / c.Hkv)) * c.D + d];
            ASSERT_EQ(p.out.get({p.q_start[b] + i, h, d}), want) << "decode " << decode << " b " << b << " h " << h;
          }
        }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FarBelowSentinel, ::testing::Values(DType::bf16, DType::fp16),
                         ::testing::PrintToStringParamName());

TEST(Sinks, MinusInfinityZeroTwentyAndExtremes) {
  AttnCase c = base_case();
  c.q_len_per_req = 2;
  c.kv_lens = {1, 77, 300};
  const AttnProblem base = build(c);
  run_cpu(base);
  ASSERT_TRUE(check_attention(base, base.reference()));
  double vmax = 0;
  for (int r = 0; r < base.rows; ++r)
    for (int h = 0; h < c.Hq; ++h)
      for (int d = 0; d < c.D; ++d) vmax = std::max(vmax, std::fabs(base.out.get({r, h, d})));

  for (double s : {-kInf, 0.0, 20.0, 1e4, -1e4, 80.0, -80.0}) {
    AttnCase cs = c;
    cs.sinks = SinkMode::custom;
    cs.custom_sinks.assign(c.Hq, s);
    const AttnProblem p = build(cs);  // same seed: same q, K, V as base
    run_cpu(p);
    EXPECT_TRUE(check_attention(p, p.reference())) << "sink " << s;
    if (s == -kInf || s == -1e4) {  // no effect
      EXPECT_TRUE(same_rows(p.out, 0, base.out, 0, p.rows)) << "sink " << s;
      EXPECT_TRUE(same_lse(p.lse, 0, base.lse, 0, p.rows)) << "sink " << s;
    }
    if (s >= 20.0) {  // the sink takes (almost) all the mass: o -> 0
      for (int r = 0; r < p.rows; ++r)
        for (int h = 0; h < c.Hq; ++h)
          for (int d = 0; d < c.D; ++d) {
            const double o = p.out.get({r, h, d});
            ASSERT_LE(std::fabs(o), 1e-6 * vmax) << "sink " << s;
            if (s == 1e4) ASSERT_EQ(o, 0.0);
          }
    }
  }
}

TEST(EmptyVisibleSet, ZeroOutputAndLse) {
  for (bool with_sink : {false, true}) {
    AttnCase c = base_case();
    c.decode = false;
    c.q_lens = {6, 1, 3};
    c.kv_lens = {2, 0, 0};  // 4 queries before the first key; two empty requests
    c.sinks = with_sink ? SinkMode::mixed : SinkMode::none;
    const AttnProblem p = build(c);
    run_cpu(p);
    const Reference ref = p.reference();
    EXPECT_TRUE(check_attention(p, ref));
    for (int r : {0, 1, 2, 3, 6, 7, 8, 9}) {
      for (int h = 0; h < c.Hq; ++h) {
        ASSERT_EQ(ref.visible[r * c.Hq + h], 0);
        const float want = with_sink ? static_cast<float>(p.sink_values[h]) : -std::numeric_limits<float>::infinity();
        EXPECT_EQ(p.lse.typed<float>()[r * c.Hq + h], want) << "row " << r << " head " << h;
        for (int d = 0; d < c.D; ++d) ASSERT_EQ(p.out.get({r, h, d}), 0.0);
      }
    }
    // Decode rows with L = 0 too.
    AttnCase d = base_case();
    d.kv_lens = {0, 5, 0};
    d.sinks = c.sinks;
    const AttnProblem q = build(d);
    run_cpu(q);
    EXPECT_TRUE(check_attention(q, q.reference()));
  }
}

TEST(Fp8Scales, DoublingVScaleDoublesTheOutput) {
  AttnCase c = base_case();
  c.kv_dtype = DType::fp8_e4m3, c.k_scale = 0.37, c.v_scale = 2.5, c.outlier_gain = 20;
  c.q_len_per_req = 2;
  c.kv_lens = {1, 200, 33};
  const AttnProblem a = build(c);
  run_cpu(a);
  ASSERT_TRUE(check_attention(a, a.reference()));
  AttnProblem b = a;
  b.c.v_scale = 5.0;
  b.out = make_tensor(a.out.dtype, {a.rows, c.Hq, c.D});
  b.lse = make_tensor(DType::fp32, {a.rows, c.Hq});
  run_cpu(b);
  for (int r = 0; r < a.rows; ++r)
    for (int h = 0; h < c.Hq; ++h) {
      ASSERT_EQ(a.lse.typed<float>()[r * c.Hq + h], b.lse.typed<float>()[r * c.Hq + h]);
      for (int d = 0; d < c.D; ++d) ASSERT_EQ(2.0 * a.out.get({r, h, d}), b.out.get({r, h, d})) << r << " " << h;
    }
}

TEST(Prefill, MaxQLenIsOnlyAnUpperBound) {
  AttnCase c = base_case();
  c.decode = false;
  c.q_lens = {7, 1, 30}, c.kv_lens = {7, 40, 100};
  const AttnProblem p = build(c);
  const auto v = p.host_views();
  pagedmha::batch_prefill(v.q, v.k_cache, v.v_cache, v.page_table, v.seq_lens, v.cu_seqlens_q, c.page_size,
                          4 * p.max_q_len + 3, v.out, p.params(v.sinks), v.lse);
  EXPECT_TRUE(check_attention(p, p.reference()));
}

TEST(StridedViews, DegenerateAndFusedAndTransposed) {
  // Batch 1, Hq = Hkv = 1: size-1 dims with stride 0.
  AttnCase c = base_case();
  c.Hq = 1, c.Hkv = 1, c.D = 64;
  c.kv_lens = {70};
  c.q_layout = c.out_layout = RowLayout::degenerate;
  {
    const AttnProblem p = build(c);
    run_cpu(p);
    EXPECT_TRUE(check_attention(p, p.reference()));
  }
  c.decode = false, c.q_lens = {1};
  {
    const AttnProblem p = build(c);
    run_cpu(p);
    EXPECT_TRUE(check_attention(p, p.reference()));
  }
  // q a slice of a fused QKV buffer, out transposed; and the reverse.
  for (auto [ql, ol] : {std::pair{RowLayout::fused, RowLayout::transposed}, {RowLayout::transposed, RowLayout::fused}}) {
    AttnCase s = base_case();
    s.decode = false, s.q_lens = {3, 9}, s.kv_lens = {3, 40};
    s.q_layout = ql, s.out_layout = ol;
    const AttnProblem p = build(s);
    run_cpu(p);
    EXPECT_TRUE(check_attention(p, p.reference()));
  }
}

}  // namespace
