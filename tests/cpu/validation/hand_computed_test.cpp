// Hand-computed results (small cases worked out on paper) proving the CPU ops compute
// what docs/semantics.md says; the oracle grid in tests/cpu/ops/ covers the rest.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "op_fixtures.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"

namespace {

using namespace opfix;

// q = e0; k0 = e0, k1 = 0; v0 = 1, v1 = 5. With bmm1_scale = ln 3 the logits are
// ln 3 and 0, so the weights are 3/4 and 1/4: o = 2, lse = ln 4.
struct TwoKeys {
  static constexpr int D = 64, P = 2;
  std::vector<uint16_t> q, kc = bf16_fill(2 * P * D, 0.0f), vc = bf16_fill(2 * P * D, 0.0f);
  std::vector<uint16_t> o;
  std::vector<float> lse;
  std::vector<int32_t> table{1}, lens{2};
  int rows;
  explicit TwoKeys(int rows_ = 1) : rows(rows_) {
    q = bf16_fill(static_cast<std::size_t>(rows * D), 0.0f);
    for (int r = 0; r < rows; ++r) q[static_cast<std::size_t>(r * D)] = float_to_bf16(1.0f);
    o.assign(q.size(), float_to_bf16(-9.0f));
    lse.assign(rows, -9.0f);
    kc[P * D] = float_to_bf16(1.0f);  // slot 2 = page 1, offset 0
    for (int x = 0; x < D; ++x) {
      vc[P * D + x] = float_to_bf16(1.0f);
      vc[(P + 1) * D + x] = float_to_bf16(5.0f);
    }
  }
  TensorView Q() { return view(q, DType::bf16, {rows, 1, D}); }
  TensorView K() { return view(kc, DType::bf16, {2 * P, 1, D}); }
  TensorView V() { return view(vc, DType::bf16, {2 * P, 1, D}); }
  TensorView O() { return view(o, DType::bf16, {rows, 1, D}); }
  TensorView LSE() { return view(lse, DType::fp32, {rows, 1}); }
  float out(int r) {
    for (int x = 1; x < D; ++x) EXPECT_EQ(o[r * D + x], o[r * D]) << "row " << r << " not uniform";
    return bf16_to_float(o[static_cast<std::size_t>(r * D)]);
  }
};

AttentionParams ln3_params() {
  AttentionParams p;
  p.bmm1_scale = std::log(3.0f);
  return p;
}

TEST(HandComputed, DecodeTwoKeys) {
  TwoKeys t;
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), ln3_params(), t.LSE());
  EXPECT_EQ(t.out(0), 2.0f);
  EXPECT_NEAR(t.lse[0], std::log(4.0), 1e-6);
}

TEST(HandComputed, DecodeTwoKeysWithSinkAndVScale) {
  // Sink ln 4: Z = 3 + 1 + 4 = 8, o = bmm2 * (3 * 1 + 1 * 5) / 8 = bmm2 * 1; lse = ln 8.
  TwoKeys t;
  std::vector<float> sinks{std::log(4.0f)};
  AttentionParams p = ln3_params();
  p.sinks = view(sinks, DType::fp32, {1});
  p.bmm2_scale = 2.5f;
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), p, t.LSE());
  EXPECT_EQ(t.out(0), 2.5f);
  EXPECT_NEAR(t.lse[0], std::log(8.0), 1e-6);
}

TEST(HandComputed, PrefillCausalWindowAndNonCausal) {
  // Three queries over L = 2 keys: positions -1, 0, 1. Causal: row 0 sees nothing
  // (o = 0, lse = -inf), row 1 sees key 0 (o = 1), row 2 sees both (o = 2).
  TwoKeys t(3);
  std::vector<int32_t> cu{0, 3};
  auto run = [&](AttentionParams p) {
    batch_prefill(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}),
                  view(cu, DType::int32, {2}), 2, 3, t.O(), p, t.LSE());
  };
  AttentionParams p = ln3_params();
  run(p);
  EXPECT_EQ(t.out(0), 0.0f);
  EXPECT_EQ(t.lse[0], -kInf);
  EXPECT_EQ(t.out(1), 1.0f);
  EXPECT_NEAR(t.lse[1], std::log(3.0), 1e-6);
  EXPECT_EQ(t.out(2), 2.0f);
  p.window_left = 0;  // each query sees only itself: row 2 sees key 1
  run(p);
  EXPECT_EQ(t.out(1), 1.0f);
  EXPECT_EQ(t.out(2), 5.0f);
  EXPECT_NEAR(t.lse[2], 0.0, 1e-6);
  p.window_left = -1;
  p.causal = false;  // every query sees both keys
  run(p);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(t.out(r), 2.0f);
}

TEST(HandComputed, EmptyRowsGiveZeroAndSinkLse) {
  TwoKeys t;
  t.lens = {0};
  t.table = {-1};  // never read
  std::vector<float> sinks{2.5f};
  AttentionParams p = ln3_params();
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), p, t.LSE());
  EXPECT_EQ(t.out(0), 0.0f);
  EXPECT_EQ(t.lse[0], -kInf);
  p.sinks = view(sinks, DType::fp32, {1});
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), p, t.LSE());
  EXPECT_EQ(t.out(0), 0.0f);
  EXPECT_EQ(t.lse[0], 2.5f);
}

TEST(HandComputed, LogitsFarBelowAnySentinel) {
  // Logits -65536 and -76800: the argmax key (v = 1) takes all the weight.
  TwoKeys t;
  t.q[0] = float_to_bf16(-256.0f);
  t.kc[TwoKeys::P * TwoKeys::D] = float_to_bf16(256.0f);
  t.kc[(TwoKeys::P + 1) * TwoKeys::D] = float_to_bf16(300.0f);
  AttentionParams p;
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), p, t.LSE());
  EXPECT_EQ(t.out(0), 1.0f);
  EXPECT_EQ(t.lse[0], -65536.0f);
}

TEST(HandComputed, SoftCapBeforeSoftmax) {
  // bmm1_scale 2, cap 1: logits tanh(2) and 0.
  TwoKeys t;
  AttentionParams p;
  p.bmm1_scale = 2.0f;
  p.logits_soft_cap = 1.0f;
  batch_decode(t.Q(), t.K(), t.V(), view(t.table, DType::int32, {1, 1}), view(t.lens, DType::int32, {1}), 2, 1,
               t.O(), p, t.LSE());
  const double w = std::exp(std::tanh(2.0));
  EXPECT_NEAR(t.out(0), (w * 1 + 5) / (w + 1), 1e-2);
  EXPECT_NEAR(t.lse[0], std::log(w + 1), 1e-6);
}

TEST(HandComputed, GqaHeadsMapToContiguousGroups) {
  // Hq 4, Hkv 2: heads 0, 1 read KV head 0 (v = 3), heads 2, 3 read KV head 1 (v = 7).
  const int D = 64, P = 1;
  std::vector<uint16_t> q = bf16_fill(4 * D, 0.1f), o(4 * D), kc = bf16_fill(2 * 2 * D, 0.2f), vc(2 * 2 * D);
  for (int x = 0; x < D; ++x) {
    vc[2 * D + x] = float_to_bf16(3.0f);      // slot 1 (page 1), head 0
    vc[2 * D + D + x] = float_to_bf16(7.0f);  // slot 1, head 1
  }
  std::vector<int32_t> table{1}, lens{1};
  batch_decode(view(q, DType::bf16, {1, 4, D}), view(kc, DType::bf16, {2, 2, D}), view(vc, DType::bf16, {2, 2, D}),
               view(table, DType::int32, {1, 1}), view(lens, DType::int32, {1}), P, 1, view(o, DType::bf16, {1, 4, D}),
               AttentionParams{});
  for (int h = 0; h < 4; ++h) EXPECT_EQ(bf16_to_float(o[h * D]), h < 2 ? 3.0f : 7.0f) << "head " << h;
}

TEST(HandComputed, AppendKvQuantisesToFp8AndTouchesNothingElse) {
  Append a;
  a.k[0] = float_to_bf16(1000.0f);  // token 0, head 0, dim 0: saturates to 448
  std::vector<uint8_t> kc8(32 * 2 * 64, 0x11), vc8(32 * 2 * 64, 0x11);
  append_kv(a.K(), a.V(), view(kc8, DType::fp8_e4m3, {32, 2, 64}), view(vc8, DType::fp8_e4m3, {32, 2, 64}), a.L(),
            4, /*k_scale=*/0.5f, /*v_scale=*/4.0f);
  for (int s = 0; s < 32; ++s) {
    const bool written = s == 4 || s == 5 || s == 31;
    for (int e = 0; e < 2 * 64; ++e) {
      const std::size_t i = static_cast<std::size_t>(s * 128 + e);
      const uint8_t kx = written ? (s == 4 && e == 0 ? 0x7E : float_to_fp8_e4m3(2.0f)) : 0x11;
      const uint8_t vx = written ? float_to_fp8_e4m3(0.5f) : 0x11;
      ASSERT_EQ(kc8[i], kx) << "slot " << s << " elem " << e;
      ASSERT_EQ(vc8[i], vx) << "slot " << s << " elem " << e;
    }
  }
  EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.0f);
}

TEST(HandComputed, AppendKvInto4dHndViewMatchesNhd) {
  // An HND buffer [pages, Hkv, P, D] seen as [pages, P, Hkv, D] through strides.
  Append a;
  for (std::size_t i = 0; i < a.k.size(); ++i) a.k[i] = float_to_bf16(static_cast<float>(i % 97));
  std::vector<uint16_t> hnd(32 * 2 * 64, 0), hnd_v(32 * 2 * 64, 0);
  TensorView k4(hnd.data(), DType::bf16, kCpu, {8, 4, 2, 64}, {512, 64, 256, 1});
  TensorView v4(hnd_v.data(), DType::bf16, kCpu, {8, 4, 2, 64}, {512, 64, 256, 1});
  append_kv(a.K(), a.V(), k4, v4, a.L(), 4);
  append_kv(a.K(), a.V(), a.KC(), a.VC(), a.L(), 4);
  for (int t = 0; t < 3; ++t) {
    const int s = a.loc[t];
    for (int h = 0; h < 2; ++h) {
      for (int x = 0; x < 64; ++x) {
        const uint16_t want = a.k[static_cast<std::size_t>((t * 2 + h) * 64 + x)];
        ASSERT_EQ(hnd[static_cast<std::size_t>((s / 4) * 512 + h * 256 + (s % 4) * 64 + x)], want);
        ASSERT_EQ(a.kc[static_cast<std::size_t>((s * 2 + h) * 64 + x)], want);
      }
    }
  }
}

TEST(HandComputed, GatherPadsWithDummyPageAndLeavesTheRest) {
  Gather g;
  g.run(/*bs=*/2, /*cols=*/4);
  // Row 0: request 2, 9 tokens -> 3 pages; row 1: request 1, 3 tokens -> 1 page.
  const std::vector<int32_t> row0{20, 21, 22, 0, -7, -7, -7, -7}, row1{10, 0, 0, 0, -7, -7, -7, -7};
  EXPECT_EQ(std::vector<int32_t>(g.out.begin(), g.out.begin() + 8), row0);
  EXPECT_EQ(std::vector<int32_t>(g.out.begin() + 8, g.out.begin() + 16), row1);
  EXPECT_EQ(std::vector<int32_t>(g.out.begin() + 16, g.out.end()), std::vector<int32_t>(8, -7));
}

TEST(HandComputed, MetadataHelpers) {
  std::vector<int32_t> lens{3, 0, 5}, cu(4);
  cumsum_lengths(view(lens, DType::int32, {3}), view(cu, DType::int32, {4}));
  EXPECT_EQ(cu, (std::vector<int32_t>{0, 3, 3, 8}));

  std::vector<int32_t> clamped(3);
  clamp_seq_lens(view(lens, DType::int32, {3}), 2, view(clamped, DType::int32, {3}));
  EXPECT_EQ(clamped, (std::vector<int32_t>{3, 2, 5}));
  std::vector<int32_t> expanded(6);  // block-diffusion form: clamp to [2, 4], two rows each
  clamp_seq_lens(view(lens, DType::int32, {3}), 2, 4, 2, view(expanded, DType::int32, {6}));
  EXPECT_EQ(expanded, (std::vector<int32_t>{3, 3, 2, 2, 4, 4}));

  // Page size 4; request 0 pages {7, 9}, request 1 pages {3, 0}.
  std::vector<int32_t> table{7, 9, 3, 0}, seq{6, 1}, slots(4);
  decode_write_slots(view(table, DType::int32, {2, 2}), view(seq, DType::int32, {2}), 4, 2,
                     view(slots, DType::int32, {4}));
  // Request 0 positions 4, 5 -> page 9; request 1 positions max(-1, 0) = 0 and 0 -> page 3.
  EXPECT_EQ(slots, (std::vector<int32_t>{36, 37, 12, 12}));

  std::vector<int32_t> prefix{3, 0}, cuq{0, 2, 3}, ext(3);
  extend_write_slots(view(table, DType::int32, {2, 2}), view(prefix, DType::int32, {2}),
                     view(cuq, DType::int32, {3}), 4, view(ext, DType::int32, {3}));
  EXPECT_EQ(ext, (std::vector<int32_t>{31, 36, 12}));  // positions 3, 4 of request 0; 0 of request 1
}

}  // namespace
