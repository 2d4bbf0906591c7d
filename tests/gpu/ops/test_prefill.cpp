// batch_prefill on CUDA (ragged queries, cached prefixes, non-causal, windows, sinks,
// soft-cap, lse) against the CPU path and the fp64 oracle, with poisoning.
#include <gtest/gtest.h>

#include <limits>

#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

// (prefix, extend) pairs: no prefix, prefix mid-page, prefix on a page edge, empty
// queries, an empty request, and more queries than keys (n > L: first queries see none).
AttnSpec ragged(int P, uint64_t seed) {
  AttnSpec s;
  s.decode = false;
  s.page_size = P;
  const int prefix[] = {0, 5, P, 0, 0, 130, 64};
  const int extend[] = {77, 1, 65, 0, 0, 190, 128};
  for (int i = 0; i < 7; ++i) {
    s.seq_lens.push_back(prefix[i] + extend[i]);
    s.q_lens.push_back(extend[i]);
  }
  s.seq_lens.push_back(3);  // n > L
  s.q_lens.push_back(9);
  s.seed = seed;
  return s;
}

TEST(GpuPrefill, HeadDimsGroupsPageSizes) {
  REQUIRE_GPU();
  const int heads[][2] = {{8, 8}, {8, 2}, {10, 2}, {12, 2}, {14, 2}, {16, 1}, {64, 1}};
  const int pages[] = {1, 3, 16, 32, 64, 128, 256};
  int i = 0;
  for (int D : {64, 128, 256}) {
    for (const auto& h : heads) {
      AttnSpec s = ragged(pages[i % 7], 2000 + i);
      s.num_q_heads = h[0];
      s.num_kv_heads = h[1];
      s.head_dim = D;
      ++i;
      AttnCase c = build_case(s);
      check_case(c, describe(s));
    }
  }
}

TEST(GpuPrefill, FeaturesAndDtypes) {
  REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  int i = 0;
  for (int W : {-1, 0, 1, 127, 128}) {
    for (int variant = 0; variant < 4; ++variant) {
      AttnSpec s = ragged(variant == 3 ? 3 : 16, 2100 + i++);
      s.window_left = W;
      s.causal = variant != 1;
      if (variant >= 1) s.sinks = {-inf, 0.0f, 3.0f, 20.0f, -1.0f, 1.0f, 80.0f, -80.0f};
      if (variant == 2) {
        s.soft_cap = 20.0f;
        s.sm_scale = 0.5;
      }
      if (variant == 3) {
        s.q_dtype = DType::fp16;
        s.kv_dtype = DType::fp16;
        s.row_pad = 24;
        s.lse = false;
      }
      s.release_before_window = W >= 0 && variant == 0;
      AttnCase c = build_case(s);
      check_case(c, describe(s));
    }
  }
}

TEST(GpuPrefill, Fp8CacheAndHnd) {
  REQUIRE_GPU();
  int i = 0;
  for (DType q : {DType::bf16, DType::fp16}) {
    for (bool hnd : {false, true}) {
      AttnSpec s = ragged(hnd ? 32 : 64, 2200 + i++);
      s.q_dtype = q;
      s.kv_dtype = DType::fp8_e4m3;
      s.k_scale = 0.37f;
      s.v_scale = 2.5f;
      s.outlier = 20.0;
      s.hnd = hnd;
      AttnCase c = build_case(s);
      check_case(c, describe(s));
    }
  }
}

// Longer requests: a 2k prompt, and a 512-token chunk after a 3k prefix with a window.
TEST(GpuPrefill, LongerPromptsAndChunks) {
  REQUIRE_GPU();
  AttnSpec s;
  s.decode = false;
  s.num_q_heads = 8;
  s.num_kv_heads = 1;
  s.page_size = 64;
  s.seq_lens = {2048, 3584};
  s.q_lens = {2048, 512};
  s.seed = 2300;
  AttnCase c = build_case(s);
  check_case(c, "2k prompt + 512 after 3k");
  s.window_left = 1023;
  s.release_before_window = true;
  s.seed = 2301;
  AttnCase w = build_case(s);
  check_case(w, "same, window 1023");
}

// Prefill of a prompt == prefill in two chunks (second with the first as prefix).
TEST(GpuPrefill, ChunkedEqualsWhole) {
  REQUIRE_GPU();
  AttnSpec s;
  s.decode = false;
  s.seq_lens = {300};
  s.q_lens = {300};
  s.seed = 2400;
  AttnCase whole = build_case(s);
  const Result rw = run_gpu(whole);
  AttnCase tail = build_case(s);  // same cache and q; queries are the last 120 rows
  const int n = 120;
  tail.q = Tensor(s.q_dtype, {n, s.num_q_heads, s.head_dim});
  for (int r = 0; r < n; ++r)
    for (int h = 0; h < s.num_q_heads; ++h)
      for (int d = 0; d < s.head_dim; ++d) tail.q.set(tail.q.offset({r, h, d}), whole.q.get(whole.q.offset({300 - n + r, h, d})));
  tail.out = Tensor(s.q_dtype, {n, s.num_q_heads, s.head_dim});
  tail.lse = Tensor(DType::fp32, {n, s.num_q_heads});
  tail.cu_seqlens_q = int32_tensor({0, n});
  tail.rows = n;
  tail.qlen = {n};
  tail.first_row = {0, n};
  const Result rt = run_gpu(tail);
  for (int r = 0; r < n; ++r)
    for (int h = 0; h < s.num_q_heads; ++h)
      for (int d = 0; d < s.head_dim; ++d) {
        const double a = rt.out.get(rt.out.offset({r, h, d})), e = rw.out.get(rw.out.offset({300 - n + r, h, d}));
        ASSERT_NEAR(a, e, 1e-2 * std::fabs(e) + 2e-3) << r << "," << h << "," << d;
      }
}

}  // namespace
}  // namespace gpu_test
