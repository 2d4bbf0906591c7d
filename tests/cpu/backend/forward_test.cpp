// End-to-end forwards through MhaBackend on the CPU against the fp64 oracle: KV save
// at the routed slots, then attention through the routed metadata slot.
#include <gtest/gtest.h>

#include "backend_fixture.h"

namespace btest {
namespace {

using V = std::vector<int32_t>;
constexpr int Hq = 8, Hkv = 2, D = 64;

struct Step {
  int P, C, max_bs, N = 1;
  DType kv_dtype = DType::bf16;
  std::mt19937 rng{1234};
  int num_pages;
  Ints r2p;  // row i (i >= 1) owns pages [1 + (i - 1) * cols, ...), reversed to catch order bugs
  Step(int P_, int C_, int max_bs_, int N_ = 1, DType kv = DType::bf16)
      : P(P_), C(C_), max_bs(max_bs_), N(N_), kv_dtype(kv), num_pages(0), r2p(V{}) {
    const int cols = (C + P - 1) / P;
    V t(static_cast<size_t>(max_bs + 1) * cols, 0);
    for (int i = 1; i <= max_bs; ++i)
      for (int c = 0; c < cols; ++c) t[static_cast<size_t>(i) * cols + c] = 1 + (i - 1) * cols + (cols - 1 - c);
    r2p = Ints(t, max_bs + 1, cols);
    num_pages = 1 + max_bs * cols;
  }
  int cols() const { return static_cast<int>(r2p.shape[1]); }
  const int32_t* row(int pool_row) const { return r2p.v.data() + static_cast<size_t>(pool_row) * cols(); }
  BackendConfig config() const {
    BackendConfig c;
    c.page_size = P;
    c.context_len = C;
    c.max_bs = max_bs;
    c.spec_num_tokens = N;
    c.kv_cache_dtype = kv_dtype;
    return c;
  }
};

// Checks that K was stored at `slots` (rounded to the cache format, with k_scale for fp8).
void expect_saved(Layer& layer, Floats& k, const V& slots) {
  const double scale = layer.fp8() ? layer.spec.k_scale : 1.0;
  for (size_t t = 0; t < slots.size(); ++t) {
    for (int e = 0; e < Hkv * D; ++e) {
      const double want = oracle::round_to(fmt(layer.k.dtype), k.get(static_cast<int64_t>(t) * Hkv * D + e) / scale);
      ASSERT_EQ(layer.k.get(int64_t{slots[t]} * Hkv * D + e), want) << "token " << t << " elem " << e;
    }
  }
}

TEST(BackendForward, DecodeSavesKvAndMatchesOracle) {
  Step st(16, 128, 4);
  Layer layer(Hq, Hkv, D, st.P, st.num_pages, st.kv_dtype, st.rng);
  MhaBackend be(st.config());
  Ints seq({1, 17, 100}), rpi({2, 3, 1});
  V slots;
  for (int r = 0; r < 3; ++r) slots.push_back(static_cast<int32_t>(oracle::slot_of(st.row(rpi.v[r]), seq.v[r] - 1, st.P)));
  Ints loc(slots);
  ForwardBatch fb = decode_batch(seq.view(), rpi.view(), st.r2p.view());
  be.init_forward_metadata(fb);
  Floats q(DType::bf16, {3, Hq * D}), k(DType::bf16, {3, Hkv * D}), v(DType::bf16, {3, Hkv * D}),
      out(DType::bf16, {3, Hq * D});
  q.randomize(st.rng), k.randomize(st.rng), v.randomize(st.rng);
  const TensorView o = be.forward_decode(q.view(), k.view(), v.view(), layer.spec, layer.kv(), loc.view(), 3, out.view());
  EXPECT_EQ(o.ndim, 2);
  EXPECT_EQ(o.size(1), Hq * D);
  expect_saved(layer, k, slots);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(close(rows_of(out, r, 1), layer.reference(rows_of(q, r, 1), 1, seq.v[r], st.row(rpi.v[r])))) << r;
  }
}

TEST(BackendForward, Fp8ScalesApplyOnReads) {
  Step st(16, 64, 2, 1, DType::fp8_e4m3);
  Layer layer(Hq, Hkv, D, st.P, st.num_pages, st.kv_dtype, st.rng);
  layer.spec.k_scale = 0.37f;
  layer.spec.v_scale = 2.5f;
  MhaBackend be(st.config());
  Ints seq({40, 9}), rpi({1, 2});
  ForwardBatch fb;
  fb.batch_size = 2;
  fb.seq_lens = seq.view();
  fb.req_pool_indices = rpi.view();
  fb.req_to_page = st.r2p.view();
  be.init_forward_metadata(fb);
  Floats q(DType::bf16, {2, Hq * D}), out(DType::bf16, {2, Hq * D}), out2(DType::bf16, {2, Hq * D});
  q.randomize(st.rng);
  be.forward_decode(q.view(), {}, {}, layer.spec, layer.kv(), {}, 2, out.view());
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(close(rows_of(out, r, 1), layer.reference(rows_of(q, r, 1), 1, seq.v[r], st.row(rpi.v[r])))) << r;
  }
  // Doubling v_scale doubles the output (upstream never applied v_scale).
  layer.spec.v_scale = 5.0f;
  be.forward_decode(q.view(), {}, {}, layer.spec, layer.kv(), {}, 2, out2.view());
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_NEAR(out2.get(i), 2 * out.get(i), 1e-2 * std::fabs(out.get(i)) + 1e-6);
}

TEST(BackendForward, VerifyEqualsOracleAndPaddedRowsStayFinite) {
  const int N = 3;
  Step st(4, 64, 3, N);
  Layer layer(Hq, Hkv, D, st.P, st.num_pages, st.kv_dtype, st.rng);
  MhaBackend be(st.config());
  Ints seq({9, 1, 30}), rpi({1, 0, 3});  // row 1: a padded graph row
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::target_verify;
  fb.batch_size = 3;
  fb.seq_lens = seq.view();
  fb.req_pool_indices = rpi.view();
  fb.req_to_page = st.r2p.view();
  be.init_forward_metadata(fb);
  Floats q(DType::bf16, {9, Hq * D}), out(DType::bf16, {9, Hq * D});
  q.randomize(st.rng);
  be.forward_decode(q.view(), {}, {}, layer.spec, layer.kv(), {}, 3, out.view());  // 9 / 3 > 1: prefill slot
  EXPECT_TRUE(close(rows_of(out, 0, N), layer.reference(rows_of(q, 0, N), N, 9, st.row(1))));
  EXPECT_TRUE(close(rows_of(out, 6, N), layer.reference(rows_of(q, 6, N), N, 30, st.row(3))));
  for (double x : rows_of(out, 3, N)) ASSERT_EQ(x, 0.0);  // page 0 is zero: finite, exactly 0
}

TEST(BackendForward, ExtendWithPrefixAndMixedRows) {
  Step st(8, 64, 3);
  Layer layer(Hq, Hkv, D, st.P, st.num_pages, st.kv_dtype, st.rng);
  MhaBackend be(st.config());
  // Row 0: prefix 3 + 6 new; row 1: a decode row inside a mixed batch (prefix 20 + 1).
  Ints seq({9, 21}), rpi({2, 1}), ext({6, 1}), pre({3, 20});
  V slots;
  for (int r = 0; r < 2; ++r)
    for (int p = pre.v[r]; p < seq.v[r]; ++p) slots.push_back(static_cast<int32_t>(oracle::slot_of(st.row(rpi.v[r]), p, st.P)));
  Ints loc(slots);
  ForwardBatch fb;
  fb.forward_mode = ForwardMode::mixed;
  fb.batch_size = 2;
  fb.seq_lens = seq.view();
  fb.req_pool_indices = rpi.view();
  fb.req_to_page = st.r2p.view();
  fb.extend_seq_lens_cpu = ext.view();
  fb.extend_prefix_lens_cpu = pre.view();
  be.init_forward_metadata(fb);
  Floats q(DType::bf16, {7, Hq * D}), k(DType::bf16, {7, Hkv * D}), v(DType::bf16, {7, Hkv * D}),
      out(DType::bf16, {7, Hq * D});
  q.randomize(st.rng), k.randomize(st.rng), v.randomize(st.rng);
  be.forward_extend(q.view(), k.view(), v.view(), layer.spec, layer.kv(), loc.view(), 2, out.view());
  expect_saved(layer, k, slots);
  EXPECT_TRUE(close(rows_of(out, 0, 6), layer.reference(rows_of(q, 0, 6), 6, 9, st.row(2))));
  EXPECT_TRUE(close(rows_of(out, 6, 1), layer.reference(rows_of(q, 6, 1), 1, 21, st.row(1))));
}

TEST(BackendForward, CacheGroupsRouteEachLayerThroughItsTable) {
  Step st(4, 32, 2);
  Layer full(Hq, Hkv, D, st.P, st.num_pages, st.kv_dtype, st.rng);
  Layer sliding(Hq, Hkv, D, st.P, st.num_pages, st.kv_dtype, st.rng);
  full.spec.group_id = "full_attention";
  sliding.spec.group_id = "sliding_attention";
  sliding.spec.window_left = 4;
  MhaBackend be(st.config());
  Ints seq({14}), rpi({1});
  // The sliding table released pages wholly before the window (0 holes), -1 tails.
  Ints tfull({5, 9, 2, 7, -1, -1, -1, -1}, 1, 8), tslide({0, 0, 3, 8, -1, -1, -1, -1}, 1, 8);
  ForwardBatch fb;
  fb.batch_size = 1;
  fb.seq_lens = seq.view();
  fb.req_pool_indices = rpi.view();
  fb.group_tables = {{"full_attention", tfull.view()}, {"sliding_attention", tslide.view()}};
  be.init_forward_metadata(fb);
  for (Layer* layer : {&full, &sliding}) {
    Floats q(DType::bf16, {1, Hq * D}), k(DType::bf16, {1, Hkv * D}), v(DType::bf16, {1, Hkv * D}),
        out(DType::bf16, {1, Hq * D});
    q.randomize(st.rng), k.randomize(st.rng), v.randomize(st.rng);
    be.forward_decode(q.view(), k.view(), v.view(), layer->spec, layer->kv(), {}, 1, out.view());
    const Ints& t = layer == &full ? tfull : tslide;
    expect_saved(*layer, k, V{t.v[3] * 4 + 1});  // position 13: column 3, offset 1
    EXPECT_TRUE(close(rows_of(out, 0, 1), layer->reference(rows_of(q, 0, 1), 1, 14, t.v.data())));
  }
}

TEST(BackendForward, BlockDraftRowsSeeTheWholeBlock) {
  const int N = 4;
  Step st(4, 32, 2, N);
  BackendConfig c = st.config();
  c.is_draft = true;
  c.draft_block_decode = true;
  Layer layer(Hq, Hkv, D, st.P, st.num_pages, st.kv_dtype, st.rng);
  MhaBackend be(c);
  Ints seq({11, 2}), rpi({2, 1});
  ForwardBatch fb;
  fb.batch_size = 2;
  fb.seq_lens = seq.view();
  fb.req_pool_indices = rpi.view();
  fb.req_to_page = st.r2p.view();
  be.init_forward_metadata(fb);
  Floats q(DType::bf16, {8, Hq * D}), out(DType::bf16, {8, Hq * D});
  q.randomize(st.rng);
  be.forward_decode(q.view(), {}, {}, layer.spec, layer.kv(), {}, 2, out.view());
  const int L[2] = {11, 4};  // clamp(block_end, N, C)
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < N; ++j)
      EXPECT_TRUE(close(rows_of(out, r * N + j, 1), layer.reference(rows_of(q, r * N + j, 1), 1, L[r], st.row(rpi.v[r]))))
          << r << " " << j;
}

TEST(BackendForward, ForwardWithoutMetadataIsAnError) {
  Step st(4, 32, 2);
  Layer layer(Hq, Hkv, D, st.P, st.num_pages, st.kv_dtype, st.rng);
  MhaBackend be(st.config());
  Floats q(DType::bf16, {1, Hq * D}), out(DType::bf16, {1, Hq * D});
  EXPECT_THROW(be.forward_decode(q.view(), {}, {}, layer.spec, layer.kv(), {}, 1, out.view()), Error);
}

}  // namespace
}  // namespace btest
