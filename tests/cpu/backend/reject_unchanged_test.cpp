// A rejected forward call changes nothing (issue: the backend wrote the step's K/V before
// the attention arguments were checked): for every kind of rejected argument, decode and
// extend steps, the pool and the output are bitwise what they were, and the error names
// the backend call and the layer field (not an inner op's parameter).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>

#include "backend_fixture.h"
#include "common/error_text.h"
#include "pagedmha/ops.h"

namespace btest {
namespace {

using V = std::vector<int32_t>;
constexpr int Hq = 4, Hkv = 2, D = 64, P = 4, C = 32, kMaxBs = 4;

uint64_t checksum(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

struct Case {
  const char* name;
  std::function<void(LayerSpec&)> layer;  // edits the layer
  std::vector<const char*> what;           // pieces the message must hold
  bool f32_q = false, strided_q = false, f32_out = false;
};

// req_to_page [kMaxBs + 1, C / P]: row i >= 1 holds pages 1 + (i - 1) C / P on (row 0: padding).
Ints pool_table() {
  V t(static_cast<size_t>(kMaxBs + 1) * (C / P), 0);
  for (int i = 1; i <= kMaxBs; ++i)
    for (int c = 0; c < C / P; ++c) t[static_cast<size_t>(i) * (C / P) + c] = 1 + (i - 1) * (C / P) + c;
  return Ints(t, kMaxBs + 1, C / P);
}

BackendConfig step_config() {
  BackendConfig cfg;
  cfg.page_size = P, cfg.context_len = C, cfg.max_bs = kMaxBs;
  cfg.num_q_heads = Hq, cfg.num_kv_heads = Hkv, cfg.head_dim = D;
  return cfg;
}

struct DebugOn {
  DebugOn() { set_debug_validation(true); }
  ~DebugOn() { set_debug_validation(false); }
};

// The metadata of a step over the pool_table() rows `rpi`: a decode step of lengths
// `lens`, or an extend step of `ext` new tokens after `prefix` cached ones per request.
struct StepBatch {
  Ints r2p = pool_table(), seq, rpi, ext{V{}}, prefix{V{}};
  ForwardBatch fb;
  StepBatch(const V& rpi_, const V& lens) : seq(lens), rpi(rpi_) {
    fb.forward_mode = ForwardMode::decode;
    fb.batch_size = static_cast<int>(lens.size());
    fb.seq_lens = seq.view();
    fb.req_pool_indices = rpi.view();
    fb.req_to_page = r2p.view();
  }
  StepBatch(const V& rpi_, const V& ext_, const V& prefix_) : StepBatch(rpi_, sum(ext_, prefix_)) {
    ext = Ints(ext_);
    prefix = Ints(prefix_);
    fb.forward_mode = ForwardMode::extend;
    fb.extend_seq_lens_cpu = ext.view();
    fb.extend_prefix_lens_cpu = prefix.view();
  }
  StepBatch(const StepBatch&) = delete;  // fb points into the members
  StepBatch& operator=(const StepBatch&) = delete;
  static V sum(const V& a, const V& b) {
    V out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
    return out;
  }
};

class RejectUnchanged : public ::testing::TestWithParam<bool> {};  // param: extend step

TEST_P(RejectUnchanged, PoolAndOutputBitwiseUnchanged) {
  const bool extend = GetParam();
  std::mt19937 rng(11);
  Layer layer(Hq, Hkv, D, P, 1 + kMaxBs * (C / P), DType::bf16, rng);
  MhaBackend be(step_config());
  // Two requests of lengths 5 and 6: decode (one token each) or extend (3 + 2 new tokens
  // after 2 + 4 cached).
  const StepBatch batch = extend ? StepBatch({1, 2}, {3, 2}, {2, 4}) : StepBatch({1, 2}, {5, 6});
  be.init_forward_metadata(batch.fb);
  const int T = extend ? 5 : 2;
  // Slots of the new tokens: request 1 uses pages 1.., request 2 pages 9..
  Ints loc(extend ? V{1 * P + 2, 1 * P + 3, 2 * P + 0, 9 * P + 0, 9 * P + 1} : V{1 * P + 0, 10 * P + 1});
  Floats q(DType::bf16, {T, Hq * D}), k(DType::bf16, {T, Hkv * D}), v(DType::bf16, {T, Hkv * D}),
      out(DType::bf16, {T, Hq * D}), q32(DType::fp32, {T, Hq * D}), out32(DType::fp32, {T, Hq * D});
  q.randomize(rng), k.randomize(rng), v.randomize(rng), out.randomize(rng);
  Floats q_wide(DType::bf16, {T, Hq, 2 * D});  // last dim strided: every other element
  q_wide.randomize(rng);
  const int64_t strided_shape[3] = {T, Hq, D}, strided_strides[3] = {int64_t{Hq} * 2 * D, 2 * D, 2};
  const TensorView q_strided =
      TensorView::from_arrays(q_wide.bytes.data(), DType::bf16, Device::cpu(), 3, strided_shape, strided_strides);
  float sinks_nan[Hq] = {0.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f, 2.0f}, sinks3[3] = {0, 1, 2};

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Case> cases = {
      {"window_left -2", [](LayerSpec& l) { l.window_left = -2; }, {"layer.window_left", "-2"}},
      {"soft-cap -1", [](LayerSpec& l) { l.logits_soft_cap = -1.0f; }, {"layer.logits_soft_cap"}},
      {"soft-cap NaN", [&](LayerSpec& l) { l.logits_soft_cap = nan; }, {"layer.logits_soft_cap", "nan"}},
      {"NaN sinks", [&](LayerSpec& l) { l.sinks = TensorView(sinks_nan, DType::fp32, Device::cpu(), {Hq}); },
       {"layer.sinks", "index 1"}},
      {"sinks of 3", [&](LayerSpec& l) { l.sinks = TensorView(sinks3, DType::fp32, Device::cpu(), {3}); },
       {"layer.sinks", "[4]", "[3]"}},
      // The step passed no cache-group tables: a named group must not fall back to the
      // shared table (in a hybrid model that table belongs to another group).
      {"group without tables", [](LayerSpec& l) { l.group_id = "sliding_attention"; },
       {"layer.group_id", "sliding_attention"}},
      // The cache is bf16, which ignores the scales; a scale that cannot be meant still is
      // an error, as it is for fp8.
      {"k_scale 0", [](LayerSpec& l) { l.k_scale = 0.0f; }, {"layer.k_scale: expected a finite value > 0, got 0"}},
      {"v_scale -1", [](LayerSpec& l) { l.v_scale = -1.0f; }, {"layer.v_scale: expected a finite value > 0, got -1"}},
      {"k_scale inf", [](LayerSpec& l) { l.k_scale = std::numeric_limits<float>::infinity(); }, {"layer.k_scale", "inf"}},
      {"v_scale NaN", [&](LayerSpec& l) { l.v_scale = nan; }, {"layer.v_scale", "nan"}},
      {"fp32 q", [](LayerSpec&) {}, {"MhaBackend", "q"}, true},
      {"strided q", [](LayerSpec&) {}, {"MhaBackend", "q"}, false, true},
      {"fp32 out", [](LayerSpec&) {}, {"MhaBackend", "out"}, false, false, true},
  };
  for (const Case& c : cases) {
    LayerSpec spec = layer.spec;
    c.layer(spec);
    const uint64_t k0 = checksum(layer.k.bytes), v0 = checksum(layer.v.bytes), o0 = checksum(out.bytes);
    const TensorView qv = c.f32_q ? q32.view() : c.strided_q ? q_strided : q.view();
    const TensorView ov = c.f32_out ? out32.view() : out.view();
    try {
      if (extend) {
        be.forward_extend(qv, k.view(), v.view(), spec, layer.kv(), loc.view(), 2, ov);
      } else {
        be.forward_decode(qv, k.view(), v.view(), spec, layer.kv(), loc.view(), 2, ov);
      }
      ADD_FAILURE() << c.name << ": expected an Error";
    } catch (const Error& e) {
      for (const char* w : c.what) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << c.name << ": " << e.what();
      EXPECT_EQ(std::string(e.what()).find("batch_decode"), std::string::npos) << c.name << ": " << e.what();
      EXPECT_EQ(std::string(e.what()).find("batch_prefill"), std::string::npos) << c.name << ": " << e.what();
    }
    EXPECT_EQ(checksum(layer.k.bytes), k0) << c.name << ": K pool changed";
    EXPECT_EQ(checksum(layer.v.bytes), v0) << c.name << ": V pool changed";
    EXPECT_EQ(checksum(out.bytes), o0) << c.name << ": out changed";
  }
  // The same call with a valid layer writes the pool (so the checks above could fail).
  const uint64_t k0 = checksum(layer.k.bytes);
  if (extend) {
    be.forward_extend(q.view(), k.view(), v.view(), layer.spec, layer.kv(), loc.view(), 2, out.view());
  } else {
    be.forward_decode(q.view(), k.view(), v.view(), layer.spec, layer.kv(), loc.view(), 2, out.view());
  }
  EXPECT_NE(checksum(layer.k.bytes), k0);
}

// Debug validation's range checks ran inside the attention ops, after the step's K / V
// were written: a rejected step had changed the pool. Now they run first, on the keys as
// they will be after the write (a slot the step fills read from its new row).
TEST(RejectUnchangedDebug, RangeChecksRunBeforeTheWrite) {
  const DebugOn debug;
  std::mt19937 rng(12);
  Layer layer(Hq, Hkv, D, P, 1 + kMaxBs * (C / P), DType::bf16, rng);
  StepBatch batch({1, 2}, {5, 6});
  ForwardBatch& fb = batch.fb;
  MhaBackend be(step_config());
  be.init_forward_metadata(fb);
  // The new tokens' slots: position 4 of request 1 (page 2), position 5 of request 2 (page 10).
  Ints loc({2 * P + 0, 10 * P + 1});
  Floats q(DType::bf16, {2, Hq * D}), k(DType::bf16, {2, Hkv * D}), v(DType::bf16, {2, Hkv * D}),
      out(DType::bf16, {2, Hq * D});
  q.randomize(rng), k.randomize(rng), v.randomize(rng), out.randomize(rng);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const int64_t row = int64_t{Hkv} * D;  // elements per cache slot
  const auto step = [&] {
    return testutil::error_of([&] { be.forward_decode(q.view(), k.view(), v.view(), layer.spec, layer.kv(), loc.view(), 2, out.view()); });
  };
  struct Poison {
    const char* name;
    Floats* t;
    int64_t at;
    double x;
    const char* what;
  } cases[] = {
      {"NaN in q", &q, Hq * D + 5, nan, ": q: expected finite values"},
      {"inf in the new k read by request 2", &k, row + 3, inf, ": k: expected finite values"},
      {"NaN in a cache row read (request 1, key 1: slot 5)", &layer.k, 5 * row + 7, nan,
       ": k_cache: expected finite values"},
  };
  for (const Poison& c : cases) {
    const double kept = c.t->get(c.at);
    c.t->set(c.at, c.x);
    const uint64_t k0 = checksum(layer.k.bytes), v0 = checksum(layer.v.bytes), o0 = checksum(out.bytes);
    const std::string msg = step();
    EXPECT_NE(msg.find(c.what), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find("2^56"), std::string::npos) << c.name << ": " << msg;
    EXPECT_EQ(checksum(layer.k.bytes), k0) << c.name << ": K pool changed";
    EXPECT_EQ(checksum(layer.v.bytes), v0) << c.name << ": V pool changed";
    EXPECT_EQ(checksum(out.bytes), o0) << c.name << ": out changed";
    c.t->set(c.at, kept);
  }
  // A bad value in a slot this step overwrites is not read: the step runs and writes it.
  layer.k.set(2 * P * row + 1, nan);
  EXPECT_EQ(step(), "");
  EXPECT_EQ(layer.k.get(2 * P * row + 1), k.get(1));
  // A new row no query reads (request 1's token aimed at slot 31, past its length: a
  // padding row) is not judged either.
  loc = Ints({31, 10 * P + 1});
  k.set(7, nan);
  EXPECT_EQ(step(), "");
  // The caches the step writes may not lie over what its attention reads (here the
  // lengths inside the V pool): an error before anything is written.
  const uint64_t k0 = checksum(layer.k.bytes), v0 = checksum(layer.v.bytes);
  fb.seq_lens = TensorView(layer.v.bytes.data(), DType::int32, Device::cpu(), {2});
  const int32_t lens[2] = {5, 6};
  std::memcpy(layer.v.bytes.data(), lens, sizeof(lens));
  const uint64_t v1 = checksum(layer.v.bytes);
  be.init_forward_metadata(fb);
  const std::string msg = step();
  EXPECT_NE(msg.find("v_cache: expected memory disjoint from batch.seq_lens"), std::string::npos) << msg;
  EXPECT_EQ(checksum(layer.k.bytes), k0);
  EXPECT_EQ(checksum(layer.v.bytes), v1);
  (void)v0;
}

// The same on an extend step (the prefill pre-check): 3 and 2 new tokens after 2 and 4
// cached ones, each new key read by the later queries of its request.
TEST(RejectUnchangedDebug, ExtendStepChecksTheKeysItWillRead) {
  const DebugOn debug;
  std::mt19937 rng(13);
  Layer layer(Hq, Hkv, D, P, 1 + kMaxBs * (C / P), DType::bf16, rng);
  StepBatch batch({1, 2}, {3, 2}, {2, 4});
  MhaBackend be(step_config());
  be.init_forward_metadata(batch.fb);
  // Positions 2, 3, 4 of request 1 (pages 1, 1, 2) and 4, 5 of request 2 (page 10).
  Ints loc({1 * P + 2, 1 * P + 3, 2 * P + 0, 10 * P + 0, 10 * P + 1});
  Floats q(DType::bf16, {5, Hq * D}), k(DType::bf16, {5, Hkv * D}), v(DType::bf16, {5, Hkv * D}),
      out(DType::bf16, {5, Hq * D});
  q.randomize(rng), k.randomize(rng), v.randomize(rng), out.randomize(rng);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t row = int64_t{Hkv} * D;
  const auto step = [&] {
    return testutil::error_of([&] { be.forward_extend(q.view(), k.view(), v.view(), layer.spec, layer.kv(), loc.view(), 2, out.view()); });
  };
  struct Poison {
    Floats* t;
    int64_t at;
    const char* what;
  } cases[] = {{&v, 1 * row + 2, ": v: expected finite values"},  // token 1: request 1, position 3
               {&layer.v, (9 * P + 1) * row, ": v_cache: expected finite values"},  // request 2, key 1
               {&q, 4 * Hq * D, ": q: expected finite values"}};
  for (const Poison& c : cases) {
    const double kept = c.t->get(c.at);
    c.t->set(c.at, nan);
    const uint64_t k0 = checksum(layer.k.bytes), v0 = checksum(layer.v.bytes), o0 = checksum(out.bytes);
    const std::string msg = step();
    EXPECT_NE(msg.find(c.what), std::string::npos) << msg;
    EXPECT_EQ(checksum(layer.k.bytes), k0) << c.what;
    EXPECT_EQ(checksum(layer.v.bytes), v0) << c.what;
    EXPECT_EQ(checksum(out.bytes), o0) << c.what;
    c.t->set(c.at, kept);
  }
  EXPECT_EQ(step(), "");
}

// An extend step whose trailing one-token rows run as a decode batch: an error in those
// rows says where the decode batch's row indices start in the step.
TEST(RejectUnchangedDebug, DecodeRowsOfAMixedStepSayWhereTheirIndicesStart) {
  const DebugOn debug;
  std::mt19937 rng(14);
  Layer layer(Hq, Hkv, D, P, 1 + kMaxBs * (C / P), DType::bf16, rng);
  StepBatch batch({1, 2, 3}, {3, 1, 1}, {2, 4, 5});
  MhaBackend be(step_config());
  be.init_forward_metadata(batch.fb);
  ASSERT_EQ(be.prefill_metadata()->decode_rows, 2);
  Ints loc({1 * P + 2, 1 * P + 3, 2 * P + 0, 10 * P + 0, 18 * P + 1});
  Floats q(DType::bf16, {5, Hq * D}), k(DType::bf16, {5, Hkv * D}), v(DType::bf16, {5, Hkv * D}),
      out(DType::bf16, {5, Hq * D});
  q.randomize(rng), k.randomize(rng), v.randomize(rng), out.randomize(rng);
  const auto step = [&] {
    return testutil::error_of([&] { be.forward_extend(q.view(), k.view(), v.view(), layer.spec, layer.kv(), loc.view(), 3, out.view()); });
  };
  ASSERT_EQ(step(), "");
  q.set(4 * Hq * D + D, std::numeric_limits<double>::quiet_NaN());  // token 4 (request 2), head 1
  const uint64_t k0 = checksum(layer.k.bytes), o0 = checksum(out.bytes);
  const std::string msg = step();
  EXPECT_NE(msg.find(": q: expected finite values"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at row 1, head 1"), std::string::npos) << msg;
  const std::string note =
      "(request indices and q rows count from the step's decode rows: their request 0 is request 1 of the "
      "batch, their q row 0 is row 3; token indices are the step's)";
  EXPECT_NE(msg.find(note), std::string::npos) << msg;
  EXPECT_EQ(checksum(layer.k.bytes), k0);
  EXPECT_EQ(checksum(out.bytes), o0);
  // A new key of a decode row (token 4, request 2: the decode rows' request 1) keeps its
  // token index; its request is the decode rows'.
  q.set(4 * Hq * D + D, 0.5);
  k.set(4 * Hkv * D + 3, std::numeric_limits<double>::quiet_NaN());
  const std::string kmsg = step();
  EXPECT_NE(kmsg.find(": k: expected finite values"), std::string::npos) << kmsg;
  EXPECT_NE(kmsg.find("token 4 (key 5 of request 1)"), std::string::npos) << kmsg;
  EXPECT_NE(kmsg.find(note), std::string::npos) << kmsg;
  EXPECT_EQ(checksum(layer.k.bytes), k0);
  k.set(4 * Hkv * D + 3, 0.25);
  // A prefill row's error needs no such note: its indices are the step's.
  q.set(1 * Hq * D, std::numeric_limits<double>::quiet_NaN());
  const std::string pre = step();
  EXPECT_NE(pre.find(": q: expected finite values"), std::string::npos) << pre;
  EXPECT_EQ(pre.find("indices count from"), std::string::npos) << pre;
}

// With an fp8 cache the softmax scale is layer.scaling * layer.k_scale: two finite
// factors whose float product rounds to 0 (a uniform softmax) or overflows are refused,
// naming both, before anything is written.
TEST(RejectUnchanged, Fp8ScaleProductFloat32CannotHold) {
  std::mt19937 rng(15);
  Layer layer(Hq, Hkv, D, P, 1 + kMaxBs * (C / P), DType::fp8_e4m3, rng);
  BackendConfig cfg = step_config();
  cfg.kv_cache_dtype = DType::fp8_e4m3;
  MhaBackend be(cfg);
  StepBatch batch({1}, {5});
  be.init_forward_metadata(batch.fb);
  Ints loc({1 * P + 0});
  Floats q(DType::bf16, {1, Hq * D}), k(DType::bf16, {1, Hkv * D}), v(DType::bf16, {1, Hkv * D}),
      out(DType::bf16, {1, Hq * D});
  q.randomize(rng), k.randomize(rng), v.randomize(rng), out.randomize(rng);
  const uint64_t k0 = checksum(layer.k.bytes), o0 = checksum(out.bytes);
  for (const auto& [scaling, k_scale, shown] :
       {std::tuple{1e-30f, 1e-20f, "1e-30 * 1e-20 = 0"}, std::tuple{1e30f, 1e20f, "1e+30 * 1e+20 = inf"}}) {
    layer.spec.scaling = scaling;
    layer.spec.k_scale = k_scale;
    const std::string msg = testutil::error_of(
        [&] { be.forward_decode(q.view(), k.view(), v.view(), layer.spec, layer.kv(), loc.view(), 1, out.view()); });
    EXPECT_NE(msg.find("MhaBackend.forward_decode: layer.scaling: expected a value whose product with layer.k_scale"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(shown), std::string::npos) << msg;
    EXPECT_EQ(checksum(layer.k.bytes), k0);
    EXPECT_EQ(checksum(out.bytes), o0);
  }
}

INSTANTIATE_TEST_SUITE_P(Steps, RejectUnchanged, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "extend" : "decode"; });

}  // namespace
}  // namespace btest
