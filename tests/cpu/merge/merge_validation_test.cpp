// merge_attention_states: hand-computed results (exact weights, the sink counted once,
// empty parts) and argument validation (each error names the op, the argument and the
// value; nothing is written before it is raised).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/error_text.h"
#include "pagedmha/error.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"

namespace {

using namespace pagedmha;
constexpr float kInf = std::numeric_limits<float>::infinity();
const Device kCpu = Device::cpu();

using testutil::error_of;

#define EXPECT_ERROR(call, ...)                                                                          \
  do {                                                                                                   \
    const std::string msg_ = error_of([&] { call; });                                                    \
    for (const std::string frag_ : {"merge_attention_states", __VA_ARGS__}) {                            \
      EXPECT_NE(msg_.find(frag_), std::string::npos) << "missing \"" << frag_ << "\" in: " << msg_;     \
    }                                                                                                    \
  } while (0)

// K parts of T rows, Hq heads, D = 64 in fp32; o[k][t][h][d] = value(k, d).
struct Fixture {
  int K, T, H, D = 64;
  std::vector<float> o, lse, out, out_lse;
  Fixture(int k, int t, int h, const std::function<float(int, int)>& value, const std::vector<float>& lse_per_part)
      : K(k), T(t), H(h) {
    for (int i = 0; i < K; ++i)
      for (int r = 0; r < T * H; ++r)
        for (int d = 0; d < D; ++d) o.push_back(value(i, d));
    for (int i = 0; i < K; ++i)
      for (int r = 0; r < T * H; ++r) lse.push_back(lse_per_part[i]);
    out.assign(static_cast<size_t>(T) * H * D, std::nanf(""));
    out_lse.assign(static_cast<size_t>(T) * H, std::nanf(""));
  }
  TensorView O() { return TensorView(o.data(), DType::fp32, kCpu, {K, T, H, D}); }
  TensorView L() { return TensorView(lse.data(), DType::fp32, kCpu, {K, T, H}); }
  TensorView Out() { return TensorView(out.data(), DType::fp32, kCpu, {T, H, D}); }
  TensorView OutLse() { return TensorView(out_lse.data(), DType::fp32, kCpu, {T, H}); }
  void run(const TensorView& sinks = {}) { merge_attention_states(O(), L(), Out(), OutLse(), sinks); }
};

// ---------------------------------------------------------------------------------
// Hand-computed results.

TEST(MergeHand, WeightsFromLse) {
  // lse = ln 1, ln 3: weights 1/4 and 3/4 of parts holding 4 and 8 -> 7; lse = ln 4.
  Fixture f(2, 2, 2, [](int k, int) { return k == 0 ? 4.0f : 8.0f; }, {0.0f, std::log(3.0f)});
  f.run();
  for (float x : f.out) EXPECT_NEAR(x, 7.0f, 1e-5f);
  for (float x : f.out_lse) EXPECT_NEAR(x, std::log(4.0f), 1e-6f);
}

TEST(MergeHand, SinkCountedOnce) {
  // Two parts of lse 0 (one key of logit 0 each, values 3 and 6) and a sink 0: Z = 3,
  // out = (3 + 6) / 3 = 3, lse = ln 3. Per head: sink -inf gives 4.5 and ln 2.
  Fixture f(2, 1, 2, [](int k, int) { return k == 0 ? 3.0f : 6.0f; }, {0.0f, 0.0f});
  std::vector<float> sinks{0.0f, -kInf};
  f.run(TensorView(sinks.data(), DType::fp32, kCpu, {2}));
  for (int d = 0; d < 64; ++d) {
    EXPECT_NEAR(f.out[d], 3.0f, 1e-6f);
    EXPECT_NEAR(f.out[64 + d], 4.5f, 1e-6f);
  }
  EXPECT_NEAR(f.out_lse[0], std::log(3.0f), 1e-6f);
  EXPECT_NEAR(f.out_lse[1], std::log(2.0f), 1e-6f);
}

TEST(MergeHand, EmptyPartsGiveZeroNotNaN) {
  // Part 1 is empty and holds NaN: ignored. All parts empty: out 0, lse -inf; with a
  // finite sink: out 0, lse = the sink.
  Fixture f(2, 1, 1, [](int k, int d) { return k == 0 ? static_cast<float>(d) : std::nanf(""); }, {1.5f, -kInf});
  f.run();
  for (int d = 0; d < 64; ++d) EXPECT_EQ(f.out[d], static_cast<float>(d));
  EXPECT_EQ(f.out_lse[0], 1.5f);

  Fixture g(3, 1, 1, [](int, int) { return std::nanf(""); }, {-kInf, -kInf, -kInf});
  g.run();
  for (float x : g.out) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(g.out_lse[0], -kInf);
  std::vector<float> sink{2.5f};
  g.run(TensorView(sink.data(), DType::fp32, kCpu, {1}));
  for (float x : g.out) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(g.out_lse[0], 2.5f);
}

TEST(MergeHand, FarApartLseNoOverflow) {
  // lse 1e30 and -1e30: the second weight underflows to 0 (its NaN o unread); finite lse.
  Fixture f(2, 1, 1, [](int k, int) { return k == 0 ? 2.0f : std::nanf(""); }, {1e30f, -1e30f});
  f.run();
  for (float x : f.out) EXPECT_EQ(x, 2.0f);
  EXPECT_EQ(f.out_lse[0], 1e30f);
}

TEST(MergeHand, Bf16RoundedOnce) {
  // Parts 1 and 1 + 2^-8 (exact in bf16) with equal weights: 1 + 2^-9, a tie that rounds
  // to even (1.0) once; rounding each weighted term first would not give that.
  std::vector<uint16_t> o(2 * 64), out(64, 0x7FC1);
  for (int d = 0; d < 64; ++d) o[d] = float_to_bf16(1.0f), o[64 + d] = float_to_bf16(1.0f + 1.0f / 256);
  std::vector<float> lse{0.0f, 0.0f};
  merge_attention_states(TensorView(o.data(), DType::bf16, kCpu, {2, 1, 1, 64}),
                         TensorView(lse.data(), DType::fp32, kCpu, {2, 1, 1}),
                         TensorView(out.data(), DType::bf16, kCpu, {1, 1, 64}));
  for (uint16_t x : out) EXPECT_EQ(bf16_to_float(x), 1.0f);
}

// ---------------------------------------------------------------------------------
// Validation.

TEST(MergeValidation, ShapesAndDtypes) {
  Fixture f(2, 3, 2, [](int, int) { return 1.0f; }, {0.0f, 0.0f});
  std::vector<float> buf(4096, 0.0f);
  const auto fp32 = [&](std::initializer_list<int64_t> shape) { return TensorView(buf.data(), DType::fp32, kCpu, shape); };
  EXPECT_ERROR(merge_attention_states(fp32({3, 2, 64}), f.L(), f.Out()), "o", "4 dims", "[3, 2, 64]");
  EXPECT_ERROR(merge_attention_states(fp32({2, 3, 2, 96}), f.L(), f.Out()), "o", "head dim", "96");
  EXPECT_ERROR(merge_attention_states(TensorView(buf.data(), DType::int32, kCpu, {2, 3, 2, 64}), f.L(), f.Out()), "o",
               "bf16 or fp16 or fp32", "int32");
  EXPECT_ERROR(merge_attention_states(f.O(), fp32({2, 3, 3}), f.Out()), "lse", "[2, 3, 2]", "[2, 3, 3]");
  EXPECT_ERROR(merge_attention_states(f.O(), TensorView(buf.data(), DType::bf16, kCpu, {2, 3, 2}), f.Out()), "lse",
               "fp32", "bf16");
  EXPECT_ERROR(merge_attention_states(f.O(), f.L(), fp32({3, 2, 128})), "out", "[3, 2, 64]", "[3, 2, 128]");
  EXPECT_ERROR(merge_attention_states(f.O(), f.L(), TensorView(buf.data(), DType::bf16, kCpu, {3, 2, 64})), "out",
               "fp32", "bf16");
  EXPECT_ERROR(merge_attention_states(f.O(), f.L(), f.Out(), fp32({2, 3})), "out_lse", "[3, 2]", "[2, 3]");
  EXPECT_ERROR(merge_attention_states(f.O(), f.L(), f.Out(), f.OutLse(), fp32({3})), "sinks", "[2]", "[3]");
  EXPECT_ERROR(merge_attention_states(f.O(), f.L(), f.Out(), {}, TensorView(buf.data(), DType::bf16, kCpu, {2})),
               "sinks", "fp32", "bf16");
  TensorView strided = f.O();
  strided.strides[3] = 2;
  EXPECT_ERROR(merge_attention_states(strided, f.L(), f.Out()), "o", "contiguous last dim");
  TensorView bad = f.Out();
  bad.strides[0] = 0;
  EXPECT_ERROR(merge_attention_states(f.O(), f.L(), bad), "out", "do not overlap");
  TensorView on_gpu = f.Out();
  on_gpu.device = Device::cuda(0);
  EXPECT_ERROR(merge_attention_states(f.O(), f.L(), on_gpu), "out", "device cpu", "cuda:0");
}

TEST(MergeValidation, ValuesOfLseAndSinks) {
  Fixture f(2, 3, 2, [](int, int) { return 1.0f; }, {0.0f, 0.0f});
  f.lse[7] = std::nanf("");
  EXPECT_ERROR(f.run(), "lse", "finite values or -inf", "nan", "[1, 0, 1]");
  f.lse[7] = kInf;
  EXPECT_ERROR(f.run(), "lse", "inf");
  f.lse[7] = 0.0f;
  std::vector<float> sinks{0.0f, std::nanf("")};
  EXPECT_ERROR(f.run(TensorView(sinks.data(), DType::fp32, kCpu, {2})), "sinks", "finite values or -inf", "index 1");
  // Nothing was written by the rejected calls.
  for (float x : f.out) ASSERT_TRUE(std::isnan(x));
  for (float x : f.out_lse) ASSERT_TRUE(std::isnan(x));
}

TEST(MergeValidation, InPlaceOrDisjoint) {
  Fixture f(3, 2, 2, [](int k, int) { return static_cast<float>(k + 1); }, {0.0f, 0.0f, -kInf});
  const TensorView o = f.O(), l = f.L();
  const auto part = [](const TensorView& t, int64_t k) {
    TensorView v = t.slice(0, k, 1);
    for (int d = 1; d < t.ndim; ++d) v.shape[d - 1] = t.shape[d], v.strides[d - 1] = t.strides[d];
    v.ndim = t.ndim - 1;
    return v;
  };
  // out shifted by one head inside o: shares elements with o[1] and o[2] without being one.
  TensorView shifted = part(o, 1);
  shifted.data = static_cast<float*>(shifted.data) + 64;
  shifted.shape[0] = 1;
  EXPECT_ERROR(merge_attention_states(o.slice(1, 0, 1), l.slice(1, 0, 1), shifted), "out", "o[i] itself (in place)",
               "o[1]");
  // out_lse inside lse but not one part; out_lse over out; out over lse; out_lse over o.
  TensorView lse_shift = part(l, 0);
  lse_shift.data = static_cast<float*>(lse_shift.data) + 1;
  lse_shift.shape[0] = 1;
  EXPECT_ERROR(merge_attention_states(o.slice(1, 0, 1), l.slice(1, 0, 1), f.Out().slice(0, 0, 1), lse_shift),
               "out_lse", "lse[i] itself", "lse[0]");
  const TensorView out_as_lse(f.out.data(), DType::fp32, kCpu, {2, 2});
  EXPECT_ERROR(merge_attention_states(o, l, f.Out(), out_as_lse), "out_lse", "disjoint from out");
  std::vector<float> shared(128, 0.0f);  // lse [3, 1, 1] at 0, out [1, 1, 64] from 2
  const TensorView small_lse(shared.data(), DType::fp32, kCpu, {3, 1, 1});
  const TensorView out_over_lse(shared.data() + 2, DType::fp32, kCpu, {1, 1, 64});
  EXPECT_ERROR(merge_attention_states(o.slice(1, 0, 1).slice(2, 0, 1), small_lse, out_over_lse), "out",
               "disjoint from lse");
  const TensorView lse_over_o(f.o.data(), DType::fp32, kCpu, {2, 2});
  EXPECT_ERROR(merge_attention_states(o, l, f.Out(), lse_over_o), "out_lse", "disjoint from o");
  // A reversed view (negative stride) whose data pointer lies past o's end but whose
  // elements reach back into o.
  std::vector<float> buf(3 * 2 * 2 * 64 + 8, 0.0f);
  const TensorView o2(buf.data(), DType::fp32, kCpu, {3, 2, 2, 64});
  const int64_t rev_shape[] = {2, 2}, rev_strides[] = {-2, 1};  // elements at +0, +1, -2, -1
  const TensorView rev =
      TensorView::from_arrays(buf.data() + 3 * 2 * 2 * 64 + 1, DType::fp32, kCpu, 2, rev_shape, rev_strides);
  EXPECT_ERROR(merge_attention_states(o2, l, f.Out(), rev), "out_lse", "disjoint from o");
  for (float x : f.out) ASSERT_TRUE(std::isnan(x));

  // Exactly a part: accepted, in place (o[1] = 2, o[0] = 1 with equal weights -> 1.5).
  merge_attention_states(o, l, part(o, 1), part(l, 1));
  for (int r = 0; r < 2 * 2; ++r)
    for (int d = 0; d < 64; ++d) ASSERT_EQ(f.o[(2 * 2 + r) * 64 + d], 1.5f);
  for (int r = 0; r < 2 * 2; ++r) ASSERT_NEAR(f.lse[2 * 2 + r], std::log(2.0f), 1e-6f);
}

}  // namespace
