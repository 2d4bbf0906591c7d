// Finite inputs whose logits overflow fp32 (docs/semantics.md section 8.1, overflowing logits): a logit
// that overflows to +inf counts as the largest logit FLT_MAX * ln 2, so the output is
// the mean V of those keys and lse is finite; never NaN. Hand-computed expectations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"

namespace {

using namespace pagedmha;

const Device kCpu = Device::cpu();
const float kMaxLogit = static_cast<float>(std::numeric_limits<float>::max() * std::numbers::ln2);

// One request, one head, D 64, page size 4, L = 6 keys on pages {1, 0}. q = x; keys
// 0, 2, 3, 5 are x (logit overflows to +inf), key 1 is -x (-inf), key 4 is 0 (logit 0);
// V of key j is j. Output: mean V of keys {0, 2, 3, 5} = 2.5.
struct Overflow {
  static constexpr int D = 64, P = 4, L = 6;
  std::vector<uint16_t> q, kc, vc, o;
  std::vector<float> lse{-9.0f};
  std::vector<int32_t> table{1, 0}, lens{L}, cu{0, 1};
  explicit Overflow(float x) {
    q.assign(D, float_to_bf16(x));
    kc.assign(2 * P * D, 0);
    vc.assign(2 * P * D, 0);
    o.assign(D, float_to_bf16(-9.0f));
    for (int j = 0; j < L; ++j) {
      const int slot = table[j / P] * P + j % P;
      const float k = j == 1 ? -x : j == 4 ? 0.0f : x;
      for (int d = 0; d < D; ++d) {
        kc[slot * D + d] = float_to_bf16(k);
        vc[slot * D + d] = float_to_bf16(static_cast<float>(j));
      }
    }
  }
  TensorView Q() { return TensorView(q.data(), DType::bf16, kCpu, {1, 1, D}); }
  TensorView K() { return TensorView(kc.data(), DType::bf16, kCpu, {2 * P, 1, D}); }
  TensorView V() { return TensorView(vc.data(), DType::bf16, kCpu, {2 * P, 1, D}); }
  TensorView O() { return TensorView(o.data(), DType::bf16, kCpu, {1, 1, D}); }
  TensorView T() { return TensorView(table.data(), DType::int32, kCpu, {1, 2}); }
  TensorView S() { return TensorView(lens.data(), DType::int32, kCpu, {1}); }
  TensorView LSE() { return TensorView(lse.data(), DType::fp32, kCpu, {1, 1}); }
  TensorView CU() { return TensorView(cu.data(), DType::int32, kCpu, {2}); }

  void expect(const char* what) {
    for (int d = 0; d < D; ++d) ASSERT_EQ(bf16_to_float(o[d]), 2.5f) << what << " dim " << d;
    EXPECT_NEAR(lse[0], kMaxLogit, 1e-6 * kMaxLogit) << what;
  }
  void run_both(const AttentionParams& params, const char* what) {
    batch_decode(Q(), K(), V(), T(), S(), P, 1, O(), params, LSE());
    expect(what);
    o.assign(D, float_to_bf16(-9.0f));
    lse[0] = -9.0f;
    batch_prefill(Q(), K(), V(), T(), S(), CU(), P, 1, O(), params, LSE());
    expect(what);
  }
};

TEST(OverflowLogits, HugeScaleOverflowsToLargestLogit) {
  Overflow t(1.0f);  // q.k = 64; 64 * 1e37 > FLT_MAX
  AttentionParams p;
  p.bmm1_scale = 1e37f;
  t.run_both(p, "bmm1_scale 1e37");
}

TEST(OverflowLogits, HugeValuesOverflowInTheDotProduct) {
  Overflow t(1e30f);  // each product 1e60 overflows fp32
  AttentionParams p;
  p.bmm1_scale = 1.0f;
  t.run_both(p, "bf16 values 1e30");
}

TEST(OverflowLogits, SoftCapOfOverflowedLogitIsTheCap) {
  // Logits cap = 30 for the overflowing keys, 0 for key 4: weight e^-30 on V = 4 is
  // below half a bf16 ulp of 2.5, and lse = 30 + ln(4 + e^-30) .
  Overflow t(1.0f);
  AttentionParams p;
  p.bmm1_scale = 1e37f;
  p.logits_soft_cap = 30.0f;
  batch_decode(t.Q(), t.K(), t.V(), t.T(), t.S(), Overflow::P, 1, t.O(), p, t.LSE());
  for (int d = 0; d < Overflow::D; ++d) ASSERT_EQ(bf16_to_float(t.o[d]), 2.5f);
  EXPECT_NEAR(t.lse[0], 30.0 + std::log(4.0), 1e-5);
}

TEST(OverflowLogits, SoftCapOfLogitOverflowingToMinusInfIsMinusTheCap) {
  // Section 8.1: with a soft-cap c a logit that overflows to -inf is capped like any
  // other, to -c (key 1), not masked. c = 2: keys 0, 2, 3, 5 at 2, key 1 at -2, key 4 at 0.
  Overflow t(1.0f);
  AttentionParams p;
  p.bmm1_scale = 1e37f;
  p.logits_soft_cap = 2.0f;
  const double w = std::exp(2.0), w1 = std::exp(-2.0);
  const double z = 4 * w + w1 + 1.0;                // a masked key 1 would give 4 w + 1
  const double out = (10 * w + 1 * w1 + 4) / z;     // V of key j is j
  for (auto* op : {"decode", "prefill"}) {
    t.o.assign(Overflow::D, float_to_bf16(-9.0f));
    t.lse[0] = -9.0f;
    if (op[0] == 'd') {
      batch_decode(t.Q(), t.K(), t.V(), t.T(), t.S(), Overflow::P, 1, t.O(), p, t.LSE());
    } else {
      batch_prefill(t.Q(), t.K(), t.V(), t.T(), t.S(), t.CU(), Overflow::P, 1, t.O(), p, t.LSE());
    }
    EXPECT_NEAR(t.lse[0], std::log(z), 1e-5) << op;
    for (int d = 0; d < Overflow::D; ++d) ASSERT_EQ(bf16_to_float(t.o[d]), bf16_to_float(float_to_bf16(out))) << op;
  }
}

}  // namespace
