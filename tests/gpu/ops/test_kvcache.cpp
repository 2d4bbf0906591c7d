// append_kv on CUDA: bf16/fp16 copies and fp8 e4m3 quantisation, against the CPU path
// and the oracle's encoding, byte for byte over the whole pool (no other slot changes).
#include <gtest/gtest.h>

#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

struct AppendCase {
  DType src, dst;
  int P, D, Hkv, T;
  bool hnd, strided_src;
  float ks, vs;
};

void check_append(const AppendCase& a, uint64_t seed) {
  SCOPED_TRACE(std::string("append_kv ") + pagedmha::dtype_name(a.src) + "->" + pagedmha::dtype_name(a.dst) +
               " P=" + std::to_string(a.P) + " D=" + std::to_string(a.D) + " Hkv=" + std::to_string(a.Hkv) +
               " T=" + std::to_string(a.T) + " hnd=" + std::to_string(a.hnd) + " strided=" + std::to_string(a.strided_src));
  Rng rng(seed);
  const int64_t num_pages = 2 + (a.T + a.P - 1) / a.P + 3;
  const int64_t page_elems = static_cast<int64_t>(a.P) * a.Hkv * a.D;
  const std::vector<int64_t> st = a.hnd ? std::vector<int64_t>{page_elems, a.D, static_cast<int64_t>(a.P) * a.D, 1}
                                        : std::vector<int64_t>{page_elems, static_cast<int64_t>(a.Hkv) * a.D, a.D, 1};
  Tensor kc(a.dst, {num_pages, a.P, a.Hkv, a.D}, st), vc(a.dst, {num_pages, a.P, a.Hkv, a.D}, st);
  // Random bytes everywhere: any stray write changes a checked byte.
  for (Tensor* t : {&kc, &vc})
    for (auto& b : t->host) b = static_cast<uint8_t>(rng.uniform(0, 255));
  // Sources: a k / v slice of a fused [T, 3, Hkv, D]-like buffer when strided.
  const int64_t row = a.strided_src ? 3LL * a.Hkv * a.D : static_cast<int64_t>(a.Hkv) * a.D;
  Tensor k(a.src, {a.T, a.Hkv, a.D}, {row, a.D, 1}), v(a.src, {a.T, a.Hkv, a.D}, {row, a.D, 1});
  for (int t = 0; t < a.T; ++t)
    for (int h = 0; h < a.Hkv; ++h)
      for (int d = 0; d < a.D; ++d) {
        const double boost = d == 5 ? 20.0 : 1.0;  // an outlier channel (saturates fp8 at small scales)
        k.set(k.offset({t, h, d}), rng.normal() * boost);
        v.set(v.offset({t, h, d}), rng.normal() * boost * 3);
      }
  // Distinct slots outside page 0, in random order.
  std::vector<int32_t> slots;
  for (int64_t s = a.P; s < num_pages * a.P; ++s) slots.push_back(static_cast<int32_t>(s));
  std::shuffle(slots.begin(), slots.end(), rng.gen);
  slots.resize(a.T);
  Tensor loc = int32_tensor(slots);

  // Expected pool: the initial bytes with each named slot replaced (oracle encoding).
  Tensor ek = kc.clone(), ev = vc.clone();
  for (int t = 0; t < a.T; ++t)
    for (int h = 0; h < a.Hkv; ++h)
      for (int d = 0; d < a.D; ++d) {
        const int64_t page = slots[t] / a.P, off = slots[t] % a.P;
        for (int kv = 0; kv < 2; ++kv) {
          const Tensor& src = kv ? v : k;
          Tensor& dst = kv ? ev : ek;
          const double x = src.get(src.offset({t, h, d}));
          const float scale = kv ? a.vs : a.ks;
          // fp8 stores saturate_rne(x / scale) with the quotient taken in fp32.
          const double y = a.dst == DType::fp8_e4m3 ? static_cast<double>(static_cast<float>(x) / scale) : x;
          dst.set(dst.offset({page, off, h, d}), y);
        }
      }
  Tensor ck = kc.clone(), cv = vc.clone();
  pagedmha::append_kv(k.cpu(), v.cpu(), ck.cpu(), cv.cpu(), loc.cpu(), a.P, a.ks, a.vs);
  for (Tensor* t : {&kc, &vc, &k, &v, &loc}) t->upload();
  pagedmha::append_kv(k.gpu(), v.gpu(), kc.gpu(), vc.gpu(), loc.gpu(), a.P, a.ks, a.vs);
  pagedmha::synchronize();
  const std::vector<uint8_t> gk = kc.download(), gv = vc.download();
  EXPECT_TRUE(ck.host == ek.host) << "CPU K pool differs from the oracle encoding";
  EXPECT_TRUE(cv.host == ev.host) << "CPU V pool differs from the oracle encoding";
  size_t bad_k = 0, bad_v = 0;
  for (size_t i = 0; i < gk.size(); ++i) bad_k += gk[i] != ek.host[i];
  for (size_t i = 0; i < gv.size(); ++i) bad_v += gv[i] != ev.host[i];
  EXPECT_EQ(bad_k, 0u) << "GPU K pool bytes differing from expected";
  EXPECT_EQ(bad_v, 0u) << "GPU V pool bytes differing from expected";
  // fp8 round trip: dequantised value within e4m3 rounding (2^-4 relative) unless saturated.
  if (a.dst == DType::fp8_e4m3) {
    for (int t = 0; t < a.T; ++t)
      for (int d = 0; d < a.D; ++d) {
        const int64_t page = slots[t] / a.P, off = slots[t] % a.P;
        const double x = k.get(k.offset({t, 0, d}));
        const double q = oracle::load(oracle::Format::fp8_e4m3, gk.data() + kc.offset({page, off, 0, d})) * a.ks;
        if (std::fabs(x / a.ks) < 448) {
          ASSERT_NEAR(q, x, std::fabs(x) * 0.0625 + std::ldexp(1.0, -10) * a.ks) << "t=" << t << " d=" << d;
        } else {
          ASSERT_EQ(q, std::copysign(448.0 * a.ks, x));
        }
      }
  }
}

TEST(GpuAppendKv, Grid) {
  REQUIRE_GPU();
  const DType pairs[][2] = {{DType::bf16, DType::bf16},
                            {DType::fp16, DType::fp16},
                            {DType::bf16, DType::fp8_e4m3},
                            {DType::fp16, DType::fp8_e4m3}};
  const int pages[] = {1, 3, 16, 64, 256};
  const int tokens[] = {0, 1, 37, 300};
  int i = 0;
  for (const auto& pr : pairs)
    for (int D : {64, 128, 256})
      for (int Hkv : {1, 8}) {
        AppendCase a{pr[0], pr[1], pages[i % 5], D, Hkv, tokens[i % 4], i % 2 == 1, i % 3 == 0, 0.37f, 2.5f};
        check_append(a, 3000 + i++);
      }
}

TEST(GpuAppendKv, UnitScaleAndSmallScaleSaturation) {
  REQUIRE_GPU();
  check_append({DType::bf16, DType::fp8_e4m3, 16, 128, 4, 64, false, false, 1.0f, 1.0f}, 3100);
  check_append({DType::bf16, DType::fp8_e4m3, 16, 128, 4, 64, false, false, 0.01f, 0.02f}, 3101);
}

}  // namespace
}  // namespace gpu_test
