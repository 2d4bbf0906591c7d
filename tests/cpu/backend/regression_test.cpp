// Regressions of defects an adversarial review found in MhaBackend: each test fails on the
// code before its fix (silent truncation, clamping or mis-routing instead of an error).
#include <gtest/gtest.h>

#include <cmath>

#include "backend_fixture.h"

namespace btest {
namespace {

using V = std::vector<int32_t>;
constexpr int Hq = 4, Hkv = 2, D = 64, P = 4, C = 32, kMaxBs = 4;

// Error whose message contains every piece of `what`.
template <class F>
void expect_error(F&& call, std::initializer_list<const char*> what) {
  try {
    call();
    ADD_FAILURE() << "expected Error";
  } catch (const Error& e) {
    for (const char* w : what) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

BackendConfig config(int N = 1, int context_len = C) { return make_config(P, context_len, kMaxBs, N); }

struct Fixture {
  std::mt19937 rng{7};
  Layer layer{Hq, Hkv, D, P, 1 + kMaxBs * (C / P), DType::bf16, rng};
  Ints r2p;
  Fixture() : r2p(V{}) {
    V t(static_cast<size_t>(kMaxBs + 1) * (C / P), 0);
    for (int i = 1; i <= kMaxBs; ++i)
      for (int c = 0; c < C / P; ++c) t[static_cast<size_t>(i) * (C / P) + c] = 1 + (i - 1) * (C / P) + c;
    r2p = Ints(t, kMaxBs + 1, C / P);
  }
  ForwardBatch decode(Ints& seq, Ints& rpi, int bs) {
    ForwardBatch fb = decode_batch(seq.view(), rpi.view(), r2p.view());
    fb.batch_size = bs;
    return fb;
  }
};

// D1: a slot list (or k) shorter than the step's tokens wrote only the common prefix.
TEST(BackendRegression, ShortWriteSlotsOrKvRowsAreErrors) {
  Fixture f;
  MhaBackend be(config());
  Ints seq({5, 6}), rpi({1, 2});
  be.init_forward_metadata(f.decode(seq, rpi, 2));
  Floats q(DType::bf16, {2, Hq * D}), k(DType::bf16, {2, Hkv * D}), v(DType::bf16, {2, Hkv * D}),
      out(DType::bf16, {2, Hq * D}), k1(DType::bf16, {1, Hkv * D});
  Ints one({4}), two({4, 9});
  expect_error([&] { be.forward_decode(q.view(), k.view(), v.view(), f.layer.spec, f.layer.kv(), one.view(), 2, out.view()); },
               {"out_cache_loc", ">= 2", "[1]"});
  expect_error([&] { be.forward_decode(q.view(), k1.view(), v.view(), f.layer.spec, f.layer.kv(), two.view(), 2, out.view()); },
               {"k:", "2 rows", "[1, 128]"});
  expect_error([&] { be.forward_decode(q.view(), k.view(), k1.view(), f.layer.spec, f.layer.kv(), two.view(), 2, out.view()); },
               {"v:", "2 rows"});
}

// D1, extend: 5 tokens with 3 slots.
TEST(BackendRegression, ExtendShortWriteSlotsIsAnError) {
  Fixture f;
  MhaBackend be(config());
  Ints seq({3, 2}), rpi({1, 2}), ext({3, 2});
  ForwardBatch fb = f.decode(seq, rpi, 2);
  fb.forward_mode = ForwardMode::extend;
  fb.extend_seq_lens_cpu = ext.view();
  be.init_forward_metadata(fb);
  Floats q(DType::bf16, {5, Hq * D}), k(DType::bf16, {5, Hkv * D}), v(DType::bf16, {5, Hkv * D}), out(DType::bf16, {5, Hq * D});
  Ints loc({4, 5, 6});
  expect_error([&] { be.forward_extend(q.view(), k.view(), v.view(), f.layer.spec, f.layer.kv(), loc.view(), 2, out.view()); },
               {"out_cache_loc", ">= 5"});
}

// D6: two tables under one id gave write slots from one and reads from the other.
TEST(BackendRegression, DuplicateGroupIdsAreErrors) {
  Fixture f;
  MhaBackend be(config());
  Ints seq({5}), rpi({1}), t1({1, 2, 3, 4, 5, 6, 7, 8}, 1, 8), t2({9, 10, 11, 12, 13, 14, 15, 16}, 1, 8);
  ForwardBatch fb = f.decode(seq, rpi, 1);
  fb.group_tables = {{"g", t1.view()}, {"g", t2.view()}};
  expect_error([&] { be.init_forward_metadata(fb); }, {"group_tables", "'g' twice"});
  Ints buf({1, 1});
  expect_error([&] { be.init_cuda_graph_state(2, buf.view(), {"a", "a"}); }, {"cache_group_ids", "'a' twice"});
  be.init_cuda_graph_state(2, buf.view(), {"g"});
  expect_error([&] { be.init_forward_metadata_capture_cuda_graph(1, ForwardMode::decode, {"g", "g"}); }, {"'g' twice"});
  be.init_forward_metadata_capture_cuda_graph(1, ForwardMode::decode, {"g"});
  fb.seq_lens = buf.view();
  expect_error([&] { be.init_forward_metadata_replay_cuda_graph(fb); }, {"group_tables", "'g' twice"});
}

// D7: with one group in the step, a layer naming another group was silently served by it.
TEST(BackendRegression, LoneGroupServesOnlyUnnamedOrMatchingLayers) {
  Fixture f;
  MhaBackend be(config());
  Ints seq({5}), rpi({1}), t({3, 4, -1, -1, -1, -1, -1, -1}, 1, 8);
  ForwardBatch fb = f.decode(seq, rpi, 1);
  fb.group_tables = {{"full_attention", t.view()}};
  be.init_forward_metadata(fb);
  LayerSpec unnamed, named, other;
  named.group_id = "full_attention";
  other.group_id = "sliding_attention";
  EXPECT_EQ(values(be.select_out_cache_loc(unnamed, ForwardMode::decode, {})), (V{4 * 4}));
  EXPECT_EQ(values(be.select_out_cache_loc(named, ForwardMode::decode, {})), (V{4 * 4}));
  expect_error([&] { be.select_out_cache_loc(other, ForwardMode::decode, {}); }, {"layer.group_id", "sliding_attention"});
}

// D8: seq_lens above context_len were clamped (verify) so queries read a truncated prefix.
TEST(BackendRegression, SeqLensAboveContextLenAreErrors) {
  Fixture f;
  for (int N : {1, 3}) {
    MhaBackend be(config(N, 30));  // 8 pages hold 32 tokens: only the C check catches 31
    Ints seq({31, 5}), rpi({1, 2});
    expect_error([&] { be.init_forward_metadata(f.decode(seq, rpi, 2)); }, {"seq_lens", "0..30", "31 at 0"});
    Ints buf({5, 31});
    be.init_cuda_graph_state(2, buf.view());
    be.init_forward_metadata_capture_cuda_graph(2, ForwardMode::decode);
    ForwardBatch fb = f.decode(buf, rpi, 2);
    expect_error([&] { be.init_forward_metadata_replay_cuda_graph(fb); }, {"seq_lens", "31 at 1"});
  }
}

// D9: prefix + extend != seq_lens put K/V where attention never looks.
TEST(BackendRegression, ExtendLengthsMustMatchSeqLens) {
  Fixture f;
  MhaBackend be(config());
  Ints seq({5, 6}), rpi({1, 2}), ext({3, 2}), pre({0, 0});
  ForwardBatch fb = f.decode(seq, rpi, 2);
  fb.forward_mode = ForwardMode::extend;
  fb.extend_seq_lens_cpu = ext.view();
  fb.extend_prefix_lens_cpu = pre.view();
  expect_error([&] { be.init_forward_metadata(fb); }, {"seq_lens", "prefix + extend length = 3 at 0", "got 5"});
  fb.extend_prefix_lens_cpu = {};  // absent: no prefix
  expect_error([&] { be.init_forward_metadata(fb); }, {"seq_lens"});
  Ints good_pre({2, 4});
  fb.extend_prefix_lens_cpu = good_pre.view();
  be.init_forward_metadata(fb);
  EXPECT_EQ(values(be.prefill_metadata()->cu_seqlens_k), (V{0, 5, 11}));
}

// forward_decode's bs was never compared with the step (0 accepted, 1 on bs 2 misrouted).
TEST(BackendRegression, ForwardBsMustMatchTheStep) {
  Fixture f;
  MhaBackend be(config());
  Ints seq({5, 6}), rpi({1, 2});
  be.init_forward_metadata(f.decode(seq, rpi, 2));
  Floats q(DType::bf16, {2, Hq * D}), out(DType::bf16, {2, Hq * D});
  for (int bs : {0, 1, 3})
    expect_error([&] { be.forward_decode(q.view(), {}, {}, f.layer.spec, f.layer.kv(), {}, bs, out.view()); },
                 {"bs:", "expected 2 (this step's batch_size)"});
}

// scaling left at its default 0 gave uniform attention; 0 now means D^-0.5, NaN is an error.
TEST(BackendRegression, DefaultScalingIsInverseSqrtHeadDim) {
  Fixture f;
  MhaBackend be(config());
  Ints seq({13}), rpi({2});
  be.init_forward_metadata(f.decode(seq, rpi, 1));
  Floats q(DType::bf16, {1, Hq * D}), out(DType::bf16, {1, Hq * D});
  q.randomize(f.rng, 3.0);  // sharp logits: uniform weights would be far off
  f.layer.spec.scaling = 0.0f;
  be.forward_decode(q.view(), {}, {}, f.layer.spec, f.layer.kv(), {}, 1, out.view());
  f.layer.spec.scaling = 1.0f / std::sqrt(float(D));
  EXPECT_TRUE(close(rows_of(out, 0, 1), f.layer.reference(rows_of(q, 0, 1), 1, 13, f.r2p.v.data() + 2 * (C / P))));
  f.layer.spec.scaling = NAN;
  expect_error([&] { be.forward_decode(q.view(), {}, {}, f.layer.spec, f.layer.kv(), {}, 1, out.view()); }, {"layer.scaling"});
}

// Graph replay: a live table missing the row of a real request padded it with page 0.
TEST(BackendRegression, ReplayTableMissingARealRowIsAnError) {
  Fixture f;
  MhaBackend be(config());
  Ints buf({1, 1, 1, 1});
  be.init_cuda_graph_state(4, buf.view(), {"a"});
  be.init_forward_metadata_capture_cuda_graph(2, ForwardMode::decode, {"a"});
  Ints t({3, 3, 3, 3, 3, 3, 3, 3}, 1, 8);
  ForwardBatch fb;
  fb.batch_size = 2;
  fb.seq_lens = buf.view();
  fb.group_tables = {{"a", t.view()}};
  buf.v = {5, 6, 1, 1};  // request 1 is real but has no table row
  expect_error([&] { be.init_forward_metadata_replay_cuda_graph(fb); }, {"group_tables['a']", "row 1 has seq_len 6"});
  buf.v = {5, 1, 1, 1};  // a padded row may lack one
  be.init_forward_metadata_replay_cuda_graph(fb);
  EXPECT_EQ(values(be.decode_metadata()->groups[0].out_cache_loc), (V{3 * 4 + 0, 0}));
}

}  // namespace
}  // namespace btest
