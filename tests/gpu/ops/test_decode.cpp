// batch_decode on CUDA (plain decode and speculative verify) against the CPU path and
// the fp64 oracle, over the TESTING.md grid, with poisoned caches, tables and outputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <limits>

#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

// Lengths that end mid-page, on a page edge, around a 64/128-key tile, plus 0 and 1.
std::vector<int> lengths_for(int P, int batch, uint64_t seed) {
  const int picks[] = {0, 1, P - 1 > 0 ? P - 1 : 2, P, P + 1, 63, 64, 65, 127, 128, 129, 700, 1000};
  Rng rng(seed);
  std::vector<int> out;
  for (int b = 0; b < batch; ++b) out.push_back(picks[(b + rng.uniform(0, 12)) % 13]);
  return out;
}

struct HeadCfg {
  int hq, hkv;
};
const HeadCfg kHeads[] = {{8, 8}, {8, 4}, {8, 2}, {10, 2}, {12, 2}, {14, 2}, {16, 2}, {16, 1}, {71, 1}};
const int kPageSizes[] = {1, 3, 16, 32, 64, 128, 256};

TEST(GpuDecode, HeadDimsGroupsPageSizes) {
  REQUIRE_GPU();
  int i = 0;
  for (int D : {64, 128, 256}) {
    for (const HeadCfg& hc : kHeads) {
      AttnSpec s;
      s.head_dim = D;
      s.num_q_heads = hc.hq;
      s.num_kv_heads = hc.hkv;
      s.page_size = kPageSizes[i % 7];
      s.seq_lens = lengths_for(s.page_size, 6, i);
      s.seed = 100 + i++;
      AttnCase c = build_case(s);
      SCOPED_TRACE(describe(s));
      check_case(c, describe(s));
    }
  }
}

TEST(GpuDecode, EveryPageSize) {
  REQUIRE_GPU();
  for (int P : kPageSizes) {
    AttnSpec s;
    s.page_size = P;
    s.seq_lens = {P, P + 1, 2 * P - 1, 1, 0, 513};
    s.seed = 200 + P;
    AttnCase c = build_case(s);
    check_case(c, describe(s));
  }
}

TEST(GpuDecode, DtypesAndFp8Scales) {
  REQUIRE_GPU();
  struct Dt {
    DType q, kv;
    float ks, vs;
    double outlier;
  };
  const Dt dts[] = {{DType::fp16, DType::fp16, 1, 1, 0},
                    {DType::bf16, DType::fp8_e4m3, 0.37f, 2.5f, 20.0},
                    {DType::fp16, DType::fp8_e4m3, 1.0f, 1.0f, 0.0},
                    {DType::fp8_e4m3, DType::fp8_e4m3, 0.5f, 0.25f, 0.0}};
  int i = 0;
  for (const Dt& dt : dts) {
    for (int D : {64, 128, 256}) {
      AttnSpec s;
      s.q_dtype = dt.q;
      s.kv_dtype = dt.kv;
      s.k_scale = dt.ks;
      s.v_scale = dt.vs;
      s.outlier = dt.outlier;
      s.head_dim = D;
      s.page_size = kPageSizes[i % 7];
      s.seq_lens = lengths_for(s.page_size, 5, 300 + i);
      s.seed = 300 + i++;
      AttnCase c = build_case(s);
      check_case(c, describe(s));
    }
  }
}

TEST(GpuDecode, DoublingVScaleDoublesOutput) {
  REQUIRE_GPU();
  AttnSpec s;
  s.kv_dtype = DType::fp8_e4m3;
  s.k_scale = 0.37f;
  s.v_scale = 2.5f;
  s.seq_lens = {100, 257};
  AttnCase c = build_case(s);
  const Result a = run_gpu(c);
  c.spec.v_scale = 5.0f;  // same stored bytes, twice the scale
  const Result b = run_gpu(c);
  for (int r = 0; r < c.rows; ++r)
    for (int h = 0; h < s.num_q_heads; ++h)
      for (int d = 0; d < s.head_dim; ++d) {
        const double x = a.out.get(a.out.offset({r, h, d})), y = b.out.get(b.out.offset({r, h, d}));
        ASSERT_NEAR(y, 2 * x, 1e-2 * std::fabs(x) + 1e-6) << r << "," << h << "," << d;
      }
}

TEST(GpuDecode, WindowsSinksSoftCap) {
  REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  int i = 0;
  for (int W : {-1, 0, 1, 127, 128, 4095}) {
    for (int variant = 0; variant < 3; ++variant) {
      AttnSpec s;
      s.num_q_heads = 8;
      s.num_kv_heads = 2;
      s.window_left = W;
      s.page_size = variant == 2 ? 3 : 16;
      s.seq_lens = {1, 2, 127, 128, 129, 300, 4200, 5000};
      if (variant >= 1) s.sinks = {-inf, 0.0f, 3.0f, 20.0f, -1.5f, 1.0f, -inf, 5.0f};
      if (variant == 2) {
        s.soft_cap = 30.0f;
        s.sm_scale = 1.0;  // big logits so the cap matters
      }
      s.release_before_window = W >= 0 && variant != 1;
      s.seed = 400 + i++;
      AttnCase c = build_case(s);
      check_case(c, describe(s));
    }
  }
}

TEST(GpuDecode, ExtremeSinksAndLogits) {
  REQUIRE_GPU();
  const std::vector<std::vector<float>> sink_sets = {{80, -80, 1e4f, -1e4f}, {20, 20, 20, 20}};
  int i = 0;
  for (const auto& sinks : sink_sets) {
    AttnSpec s;
    s.num_q_heads = 4;
    s.num_kv_heads = 1;
    s.sinks = sinks;
    s.seq_lens = {0, 1, 50, 600};
    s.seed = 500 + i++;
    AttnCase c = build_case(s);
    check_case(c, describe(s));
  }
  // Logits far below any finite sentinel (all < -6e4) with one clear maximum.
  AttnSpec s;
  s.num_q_heads = 2;
  s.num_kv_heads = 1;
  s.sm_scale = 1e4;  // |logits| ~ 1e4 * |q.k| ~ 1e5
  s.seq_lens = {37, 200};
  s.seed = 510;
  AttnCase c = build_case(s);
  check_case(c, "huge logits");
}

TEST(GpuDecode, StridedViewsAndHndCache) {
  REQUIRE_GPU();
  int i = 0;
  for (bool hnd : {false, true}) {
    for (int pad : {0, 8, 136}) {
      AttnSpec s;
      s.row_pad = pad;
      s.hnd = hnd;
      s.page_size = hnd ? 16 : 32;
      s.seq_lens = {5, 64, 333};
      s.q_len_per_req = 1 + (i % 3);
      s.seed = 600 + i++;
      AttnCase c = build_case(s);
      check_case(c, describe(s));
    }
  }
}

TEST(GpuDecode, VerifyQLenPerReq1To8) {
  REQUIRE_GPU();
  for (int n = 1; n <= 8; ++n) {
    AttnSpec s;
    s.q_len_per_req = n;
    s.num_q_heads = 16;
    s.num_kv_heads = 2;
    s.page_size = n % 2 ? 16 : 64;
    s.seq_lens = {1, n, n + 1, 97, 1024};  // seq_len 1 < n: padded graph rows (n > L)
    s.window_left = n == 4 ? 127 : -1;
    s.lse = n % 2 == 0;
    s.seed = 700 + n;
    AttnCase c = build_case(s);
    check_case(c, describe(s));
  }
}

// Verify with N queries == N single-query decodes of the same cache (query i sees
// KV length L - N + i + 1).
TEST(GpuDecode, VerifyEqualsSequentialDecodes) {
  REQUIRE_GPU();
  const int N = 4;
  AttnSpec s;
  s.q_len_per_req = N;
  s.seq_lens = {9, 130};
  s.seed = 750;
  AttnCase v = build_case(s);
  const Result rv = run_gpu(v);
  for (int i = 0; i < N; ++i) {
    AttnCase d = build_case(s);  // same seed: same cache, table and q
    d.spec.q_len_per_req = 1;
    d.q = Tensor(s.q_dtype, {2, s.num_q_heads, s.head_dim});
    for (int b = 0; b < 2; ++b) {
      d.seq_lens.i32(b) = s.seq_lens[b] - N + i + 1;
      for (int h = 0; h < s.num_q_heads; ++h)
        for (int x = 0; x < s.head_dim; ++x) d.q.set(d.q.offset({b, h, x}), v.q.get(v.q.offset({b * N + i, h, x})));
    }
    d.out = Tensor(s.q_dtype, {2, s.num_q_heads, s.head_dim});
    d.lse = Tensor(DType::fp32, {2, s.num_q_heads});
    d.rows = 2;
    d.qlen = {1, 1};
    d.first_row = {0, 1, 2};
    d.spec.seq_lens = {s.seq_lens[0] - N + i + 1, s.seq_lens[1] - N + i + 1};
    const Result rd = run_gpu(d);
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < s.num_q_heads; ++h)
        for (int x = 0; x < s.head_dim; ++x) {
          const double a = rv.out.get(rv.out.offset({b * N + i, h, x})), e = rd.out.get(rd.out.offset({b, h, x}));
          ASSERT_NEAR(a, e, 1e-2 * std::fabs(e) + 2e-3) << "query " << i << " request " << b;
        }
  }
}

// Forced split counts, from 1 to more splits than keys (first/last splits empty),
// each against the oracle, and all equal to num_splits = 1 within fp32 rounding.
TEST(GpuDecode, NumSplitsForcedAndIndependent) {
  REQUIRE_GPU();
  AttnSpec s;
  s.num_q_heads = 8;
  s.num_kv_heads = 1;
  s.page_size = 16;
  s.seq_lens = {1, 3, 17, 64, 65, 1000, 4097};
  s.q_len_per_req = 2;
  s.sinks = {0.5f, -std::numeric_limits<float>::infinity(), 2.0f, 10.0f, -3.0f, 0.0f, 1.0f, 4.0f};
  s.seed = 800;
  AttnCase c = build_case(s);
  const Reference ref = oracle_reference(c);
  const Result one = run_gpu(c, 1);
  expect_matches(c, one, ref, "num_splits=1");
  for (int k : {0, 2, 3, 5, 8, 16, 33, 64, 200}) {
    const std::string what = "num_splits=" + std::to_string(k);
    const Result r = run_gpu(c, k);
    expect_matches(c, r, ref, what);
    int64_t diff = 0;
    for (int row = 0; row < c.rows; ++row)
      for (int h = 0; h < s.num_q_heads; ++h) {
        for (int d = 0; d < s.head_dim; ++d) {
          const double a = r.out.get(r.out.offset({row, h, d})), b = one.out.get(one.out.offset({row, h, d}));
          diff += std::fabs(a - b) > std::ldexp(std::max(std::fabs(a), std::fabs(b)), -7) + 1e-7;  // 1 bf16 ulp
        }
        float la, lb;
        std::memcpy(&la, r.lse.ptr(r.lse.offset({row, h})), 4);
        std::memcpy(&lb, one.lse.ptr(one.lse.offset({row, h})), 4);
        if (!(std::isinf(la) && la == lb)) diff += std::fabs(la - lb) > 1e-5 * std::max(1.0f, std::fabs(lb));
      }
    EXPECT_EQ(diff, 0) << what << ": differs from num_splits=1 beyond fp32 rounding";
  }
}

// 256 rows, most padded (seq_len 0 or 1 on page 0), mixed with real ones.
TEST(GpuDecode, Batch256WithPaddedRows) {
  REQUIRE_GPU();
  AttnSpec s;
  s.num_q_heads = 8;
  s.num_kv_heads = 1;
  s.page_size = 64;
  Rng rng(900);
  for (int b = 0; b < 256; ++b) s.seq_lens.push_back(b % 3 == 0 ? rng.uniform(2, 900) : b % 3 - 1);
  s.seed = 900;
  AttnCase c = build_case(s);
  // Padded rows point at the dummy page 0 (graph padding), not at pages of their own.
  for (int b = 0; b < 256; ++b)
    if (s.seq_lens[b] <= 1) c.page_table.i32(static_cast<int64_t>(b) * c.cols) = 0;
  check_case(c, "batch 256 padded");
}

// One long request: 128k keys (and a verify step over it).
TEST(GpuDecode, Long128k) {
  REQUIRE_GPU();
  for (int n : {1, 3}) {
    AttnSpec s;
    s.num_q_heads = 8;
    s.num_kv_heads = 1;
    s.page_size = 64;
    s.q_len_per_req = n;
    s.seq_lens = {131072 - n + 1};
    s.seed = 1000 + n;
    AttnCase c = build_case(s);
    check_case(c, "128k n=" + std::to_string(n));
  }
}

}  // namespace
}  // namespace gpu_test
