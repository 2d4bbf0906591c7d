// batch_decode on CUDA (plain decode and speculative verify) against the fp64 oracle,
// over the TESTING.md grid, with poisoned caches, tables, outputs and workspace.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "cuda/cuda_ops.h"
#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Lengths that end mid-page, on a page edge, around a 64/128-key tile, plus 0 and 1.
std::vector<int> lengths_for(int P, int batch, uint64_t seed) {
  const int picks[] = {0, 1, P - 1 > 0 ? P - 1 : 2, P, P + 1, 63, 64, 65, 127, 128, 129, 700, 1000};
  std::mt19937_64 rng(seed);
  std::vector<int> out;
  for (int b = 0; b < batch; ++b) out.push_back(picks[(b + rng() % 13) % 13]);
  return out;
}

struct HeadCfg {
  int hq, hkv;
};
const HeadCfg kHeads[] = {{8, 8}, {8, 4}, {8, 2}, {10, 2}, {12, 2}, {14, 2}, {16, 2}, {16, 1}, {71, 1}};
const int kPageSizes[] = {1, 3, 16, 32, 64, 128, 256};
const CacheLayout kLayouts[] = {CacheLayout::nhd4, CacheLayout::nhd3, CacheLayout::hnd4, CacheLayout::interleaved};

TEST(GpuDecode, HeadDimsGroupsPageSizes) {
  REQUIRE_GPU();
  int i = 0;
  for (int D : {64, 128, 256}) {
    for (const HeadCfg& hc : kHeads) {
      AttnCase c = gpu_case();
      c.D = D;
      c.Hq = hc.hq, c.Hkv = hc.hkv;
      c.page_size = kPageSizes[i % 7];
      c.layout = kLayouts[i % 4];
      c.kv_lens = lengths_for(c.page_size, 6, i);
      c.seed = 100 + i++;
      check_case(c);
    }
  }
}

TEST(GpuDecode, EveryPageSize) {
  REQUIRE_GPU();
  for (int P : kPageSizes) {
    AttnCase c = gpu_case();
    c.page_size = P;
    c.kv_lens = {P, P + 1, 2 * P - 1, 1, 0, 513};
    c.seed = 200 + P;
    check_case(c);
  }
}

TEST(GpuDecode, DtypesAndFp8Scales) {
  REQUIRE_GPU();
  struct Dt {
    DType q, kv;
    double ks, vs, outlier;
  };
  const Dt dts[] = {{DType::fp16, DType::fp16, 1, 1, 0},
                    {DType::bf16, DType::fp8_e4m3, 0.37, 2.5, 20.0},
                    {DType::fp16, DType::fp8_e4m3, 1.0, 1.0, 0.0},
                    {DType::fp8_e4m3, DType::fp8_e4m3, 0.5, 0.25, 0.0}};
  int i = 0;
  for (const Dt& dt : dts) {
    for (int D : {64, 128, 256}) {
      AttnCase c = gpu_case();
      c.q_dtype = dt.q, c.kv_dtype = dt.kv;
      c.k_scale = dt.ks, c.v_scale = dt.vs;
      c.outlier_gain = dt.outlier;
      c.D = D;
      c.page_size = kPageSizes[i % 7];
      c.kv_lens = lengths_for(c.page_size, 5, 300 + i);
      c.seed = 300 + i++;
      check_case(c);
    }
  }
}

TEST(GpuDecode, DoublingVScaleDoublesOutput) {
  REQUIRE_GPU();
  AttnCase c = gpu_case();
  c.kv_dtype = DType::fp8_e4m3;
  c.k_scale = 0.37, c.v_scale = 2.5;
  c.kv_lens = {100, 257};
  const AttnProblem a = build(c);
  DeviceMirror dev;
  run_gpu(a, dev);
  EXPECT_TRUE(check_attention(a, a.reference()));
  AttnProblem b = with_new_outputs(a);
  b.c.v_scale = 5.0;  // same stored bytes, twice the scale
  run_gpu(b, dev);
  for (int r = 0; r < a.rows; ++r)
    for (int h = 0; h < c.Hq; ++h)
      for (int d = 0; d < c.D; ++d) {
        const double x = a.out.get({r, h, d}), y = b.out.get({r, h, d});
        ASSERT_NEAR(y, 2 * x, 1e-2 * std::fabs(x) + 1e-6) << r << "," << h << "," << d;
      }
}

// docs/semantics.md section 2: with fp8 KV the Hopper decode, like the Hopper prefill,
// computes S = Q K^T in fp16 (decode_sm90/policy.h kQkF16), so bf16 query entries beyond
// 65504 saturate there; the portable decode keeps them (check_queries_past_fp16_range).
// The answer also shows which decode ran: every layout and page size here must reach the
// Hopper decode where the library says its build and the device use it
// (decode_fp8_qk_in_fp16), else the case fails.
TEST(GpuDecode, Fp8KvQueriesPastFp16RangeSaturateOnHopper) {
  REQUIRE_GPU();
  const CacheLayout kLayouts[] = {CacheLayout::nhd4, CacheLayout::hnd4, CacheLayout::interleaved};
  int i = 0;
  for (int D : {64, 128}) {
    const bool saturates = pagedmha::cuda::decode_fp8_qk_in_fp16(0, D);
    for (const CacheLayout layout : kLayouts) {
      for (int P : {8, 16, 256}) {
        AttnCase c = gpu_case();
        c.Hq = 4, c.Hkv = 1, c.D = D;
        c.layout = layout;
        c.page_size = P;
        c.kv_lens = {300, 200, 4100};
        c.seed = 2700 + i++;
        check_queries_past_fp16_range(c, saturates);
      }
    }
  }
}

TEST(GpuDecode, WindowsSinksSoftCap) {
  REQUIRE_GPU();
  int i = 0;
  for (int W : {-1, 0, 1, 127, 128, 4095}) {
    for (int variant = 0; variant < 3; ++variant) {
      AttnCase c = gpu_case();
      c.window_left = W;
      c.page_size = variant == 2 ? 3 : 16;
      c.kv_lens = {1, 2, 127, 128, 129, 300, 4200, 5000};
      if (variant >= 1) {
        c.sinks = SinkMode::custom;
        c.custom_sinks = {-kInf, 0.0, 3.0, 20.0, -1.5, 1.0, -kInf, 5.0};
      }
      if (variant == 2) {
        c.soft_cap = 30.0;
        c.sm_scale = 1.0;  // big logits so the cap matters
      }
      c.release_window_pages = W >= 0 && variant != 1;
      c.seed = 400 + i++;
      check_case(c);
    }
  }
}

TEST(GpuDecode, ExtremeSinksAndLogits) {
  REQUIRE_GPU();
  int i = 0;
  for (SinkMode mode : {SinkMode::extreme, SinkMode::custom}) {  // +-80, +-1e4; all 20
    AttnCase c = gpu_case();
    c.Hq = 4, c.Hkv = 1;
    c.sinks = mode;
    if (mode == SinkMode::custom) c.custom_sinks = {20, 20, 20, 20};
    c.kv_lens = {0, 1, 50, 600};
    c.seed = 500 + i++;
    check_case(c);
  }
  // Logits far below any finite sentinel (all < -6e4) with one clear maximum. At
  // |logit| ~ 3e5 one fp32 ulp of the dot product is ~0.03, so lse gets 1e-5 relative.
  AttnCase c = gpu_case();
  c.name = "huge logits";
  c.Hq = 2, c.Hkv = 1;
  c.sm_scale = 1e4;  // |logits| ~ 1e4 * |q.k| ~ 1e5
  c.kv_lens = {37, 200};
  c.seed = 510;
  Tolerance tol = Tolerance::for_output(c.q_dtype);
  tol.lse_rel = 1e-5;
  check_case(c, 0, &tol);
}

TEST(GpuDecode, OverflowingLogitsNeverNaN) {
  REQUIRE_GPU();
  for (int splits : {0, 1, 4}) {
    AttnCase c = gpu_case();
    c.kv_lens = {0, 1, 50, 600};
    c.seed = 520 + splits;
    check_overflowing_logits(c, splits);
    c.soft_cap = 30.0;
    check_overflowing_logits(c, splits);
  }
}

TEST(GpuDecode, StridedViewsAndHndCache) {
  REQUIRE_GPU();
  int i = 0;
  for (CacheLayout layout : {CacheLayout::nhd4, CacheLayout::hnd4}) {
    for (int pad : {0, 8, 136}) {  // elements past Hq * D in each q and out row
      AttnCase c = gpu_case();
      c.q_layout = c.out_layout = RowLayout::padded;
      c.row_pad = pad;
      c.layout = layout;
      c.page_size = layout == CacheLayout::hnd4 ? 16 : 32;
      c.kv_lens = {5, 64, 333};
      c.q_len_per_req = 1 + (i % 3);
      c.seed = 600 + i++;
      check_case(c);
    }
  }
}

TEST(GpuDecode, VerifyQLenPerReq1To8) {
  REQUIRE_GPU();
  for (int n = 1; n <= 8; ++n) {
    AttnCase c = gpu_case();
    c.q_len_per_req = n;
    c.Hq = 16, c.Hkv = 2;
    c.page_size = n % 2 ? 16 : 64;
    c.kv_lens = {1, n, n + 1, 97, 1024};  // seq_len 1 < n: padded graph rows (n > L)
    c.window_left = n == 4 ? 127 : -1;
    c.with_lse = n % 2 == 0;
    c.seed = 700 + n;
    check_case(c);
  }
}

// Verify with N queries == N single-query decodes of the same cache (query i sees
// KV length L - N + i + 1).
TEST(GpuDecode, VerifyEqualsSequentialDecodes) {
  REQUIRE_GPU();
  const int N = 4;
  AttnCase c = gpu_case();
  c.q_len_per_req = N;
  c.kv_lens = {9, 130};
  c.seed = 750;
  const AttnProblem v = build(c);
  DeviceMirror dev;
  run_gpu(v, dev);
  ASSERT_TRUE(check_attention(v, v.reference()));
  for (int i = 0; i < N; ++i) {
    // The same problem as a decode of rows i, N + i of q, with the shorter lengths.
    AttnProblem d = v;
    d.c.q_len_per_req = 1;
    d.out = make_tensor(v.out.dtype, {2, c.Hq, c.D});
    d.lse = make_tensor(DType::fp32, {2, c.Hq});
    const HostTensor seq = make_int32({c.kv_lens[0] - N + i + 1, c.kv_lens[1] - N + i + 1});
    AttnViews dv = dev.views(v);
    dv.q = row_slice(dv.q, i, 2, N);
    dv.seq_lens = dev.view(seq);
    dv.out = dev.view(d.out);
    dv.lse = dev.view(d.lse);
    launch(d, dv);
    dev.download(d.out);
    for (int b = 0; b < 2; ++b) EXPECT_TRUE(close_rows(v.out, b * N + i, d.out, b, 1)) << "query " << i;
  }
}

// Forced split counts, from 1 to more splits than keys (first/last splits empty),
// each against the oracle, and all equal to num_splits = 1 within one output ulp.
TEST(GpuDecode, NumSplitsForcedAndIndependent) {
  REQUIRE_GPU();
  AttnCase c = gpu_case();
  c.Hkv = 1;
  c.kv_lens = {1, 3, 17, 64, 65, 1000, 4097};
  c.q_len_per_req = 2;
  c.sinks = SinkMode::custom;
  c.custom_sinks = {0.5, -kInf, 2.0, 10.0, -3.0, 0.0, 1.0, 4.0};
  c.seed = 800;
  check_split_counts(c, {0, 2, 3, 5, 8, 16, 33, 64, 200});
}

// 256 rows, most padded (seq_len 0 or 1 on the dummy page 0), mixed with real ones.
TEST(GpuDecode, Batch256WithPaddedRows) {
  REQUIRE_GPU();
  AttnCase c = gpu_case();
  c.Hkv = 1;
  c.page_size = 64;
  std::mt19937_64 rng(900);
  for (int b = 0; b < 256; ++b) c.kv_lens.push_back(b % 3 == 0 ? 2 + static_cast<int>(rng() % 899) : b % 3 - 1);
  c.seed = 900;
  c.name = "batch 256 padded";
  AttnProblem p = build(c);
  // Padded rows point at page 0 (graph padding), not at pages of their own.
  for (int b = 0; b < 256; ++b)
    if (c.kv_lens[b] <= 1) p.page_table.typed<int32_t>()[static_cast<int64_t>(b) * p.cols] = 0;
  follow_table(p, c.kv_lens);
  run_gpu(p);
  EXPECT_TRUE(check_attention(p, p.reference(/*from_cache=*/true)));
}

// One long request: 128k keys (and a verify step over it).
TEST(GpuDecode, Long128k) {
  REQUIRE_GPU();
  for (int n : {1, 3}) {
    AttnCase c = gpu_case();
    c.Hkv = 1;
    c.page_size = 64;
    c.q_len_per_req = n;
    c.kv_lens = {131072 - n + 1};
    c.seed = 1000 + n;
    check_case(c);
  }
}

}  // namespace
}  // namespace gpu_test
