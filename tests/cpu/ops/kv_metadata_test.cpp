// append_kv (named slots only, fp8 quantisation), the number formats, and the
// metadata helpers against hand-computed values and the oracle's rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "oracle/test_util.h"
#include "pagedmha/error.h"
#include "pagedmha/numeric.h"

namespace {

using pagedmha::DType;
using namespace ptest;

// --- append_kv -----------------------------------------------------------------------

struct AppendCase {
  DType src, cache;
  CacheLayout layout;
  bool fused_src;  // k and v slices of one fused QKV buffer
};

// "bf16_to_fp8_e4m3_hnd4_fused": the test names and gtest's listings.
void PrintTo(const AppendCase& c, std::ostream* os) {
  *os << pagedmha::dtype_name(c.src) << "_to_" << pagedmha::dtype_name(c.cache) << "_" << layout_name(c.layout)
      << (c.fused_src ? "_fused" : "");
}

class AppendKv : public ::testing::TestWithParam<AppendCase> {};

/// True when `got` is a correctly rounded e4m3 encoding of x (the library divides in
/// fp32, so an exact tie in double may legitimately round either way).
bool fp8_ok(uint8_t got, double x) {
  const uint8_t want = static_cast<uint8_t>(oracle::encode_bits(oracle::Format::fp8_e4m3, x));
  if (got == want) return true;
  const double g = oracle::decode_bits(oracle::Format::fp8_e4m3, got);
  const double w = oracle::decode_bits(oracle::Format::fp8_e4m3, want);
  return std::isfinite(g) && std::fabs(std::fabs(g - x) - std::fabs(w - x)) <= 1e-6 * std::fabs(x);
}

TEST_P(AppendKv, WritesNamedSlotsOnly) {
  const AppendCase ac = GetParam();
  const int P = 16, Hkv = 2, D = 64, num_pages = 9, T = 21;
  const double k_scale = ac.cache == DType::fp8_e4m3 ? 0.37 : 1.0;
  const double v_scale = ac.cache == DType::fp8_e4m3 ? 2.5 : 1.0;
  PagedKv kv = make_paged_kv(ac.layout, num_pages, P, Hkv, D, ac.cache);
  std::mt19937 rng(11);
  // Random (finite) pool content, so "unchanged" is meaningful everywhere.
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t s = 0; s < num_pages * P; ++s)
    for (int h = 0; h < Hkv; ++h)
      for (int d = 0; d < D; ++d) {
        oracle::store(format_of(ac.cache), normal(rng), kv.kp(s, h, d));
        oracle::store(format_of(ac.cache), normal(rng), kv.vp(s, h, d));
      }
  const std::vector<uint8_t> k_before = *kv.k.storage, v_before = *kv.v.storage;

  // Distinct slots: page 0's first slot (a padded write), page edges, the last slot.
  std::vector<int32_t> loc = {0, 15, 16, 17, num_pages * P - 1, 5 * P};
  std::set<int32_t> used(loc.begin(), loc.end());
  std::uniform_int_distribution<int> pick(0, num_pages * P - 1);
  while (static_cast<int>(loc.size()) < T) {
    const int s = pick(rng);
    if (used.insert(s).second) loc.push_back(s);
  }
  HostTensor k, v;
  if (ac.fused_src) {
    const int64_t width = 3LL * Hkv * D;  // [T, q|k|v heads, D]
    k = make_tensor(ac.src, {T, Hkv, D}, {width, D, 1}, T * width);
    v = k;
    k.offset = Hkv * D, v.offset = 2 * Hkv * D;
  } else {
    k = make_tensor(ac.src, {T, Hkv, D});
    v = make_tensor(ac.src, {T, Hkv, D});
  }
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < Hkv; ++h)
      for (int d = 0; d < D; ++d) {
        const double big = d == 7 ? 400.0 : 1.0;  // beyond 448 * scale: saturates
        k.set({t, h, d}, normal(rng) * big);
        v.set({t, h, d}, normal(rng) * big);
      }
  const HostTensor locs = make_int32(loc);
  pagedmha::append_kv(k.view(), v.view(), kv.k.view(), kv.v.view(), locs.view(), P, static_cast<float>(k_scale),
                      static_cast<float>(v_scale));

  // Named slots hold the (quantised) sources.
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < Hkv; ++h)
      for (int d = 0; d < D; ++d) {
        const double kx = k.get({t, h, d}), vx = v.get({t, h, d});
        if (ac.cache == DType::fp8_e4m3) {
          const double k32 = static_cast<float>(static_cast<float>(kx) / static_cast<float>(k_scale));
          const double v32 = static_cast<float>(static_cast<float>(vx) / static_cast<float>(v_scale));
          ASSERT_TRUE(fp8_ok(*static_cast<uint8_t*>(kv.kp(loc[t], h, d)), k32)) << "k token " << t << " dim " << d;
          ASSERT_TRUE(fp8_ok(*static_cast<uint8_t*>(kv.vp(loc[t], h, d)), v32)) << "v token " << t << " dim " << d;
        } else {
          ASSERT_EQ(kv.kget(loc[t], h, d), kx) << "k token " << t;
          ASSERT_EQ(kv.vget(loc[t], h, d), vx) << "v token " << t;
        }
      }
  // Every other byte of the pool is unchanged: restore the named slots from the
  // snapshot and the whole storage must equal it.
  std::vector<uint8_t> k_after = *kv.k.storage, v_after = *kv.v.storage;
  const size_t es = elem_size(ac.cache);
  for (int32_t s : loc)
    for (int h = 0; h < Hkv; ++h)
      for (int d = 0; d < D; ++d) {
        const size_t ko = static_cast<uint8_t*>(kv.kp(s, h, d)) - kv.k.base();
        const size_t vo = static_cast<uint8_t*>(kv.vp(s, h, d)) - kv.v.base();
        std::memcpy(k_after.data() + ko, k_before.data() + ko, es);
        std::memcpy(v_after.data() + vo, v_before.data() + vo, es);
        if (kv.k.storage == kv.v.storage) {  // interleaved: one storage holds both
          std::memcpy(k_after.data() + vo, k_before.data() + vo, es);
        }
      }
  if (kv.k.storage == kv.v.storage) v_after = k_after;
  EXPECT_TRUE(k_after == k_before) << "append_kv wrote a K slot outside out_cache_loc";
  EXPECT_TRUE(v_after == v_before) << "append_kv wrote a V slot outside out_cache_loc";

  // T = 0 writes nothing.
  const std::vector<uint8_t> snap = *kv.k.storage;
  HostTensor k0 = make_tensor(ac.src, {0, Hkv, D}), v0 = make_tensor(ac.src, {0, Hkv, D});
  HostTensor l0 = make_tensor(DType::int32, {0});
  pagedmha::append_kv(k0.view(), v0.view(), kv.k.view(), kv.v.view(), l0.view(), P, static_cast<float>(k_scale),
                      static_cast<float>(v_scale));
  EXPECT_TRUE(snap == *kv.k.storage);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, AppendKv,
    ::testing::Values(AppendCase{DType::bf16, DType::bf16, CacheLayout::nhd3, false},
                      AppendCase{DType::fp16, DType::fp16, CacheLayout::nhd4, true},
                      AppendCase{DType::bf16, DType::bf16, CacheLayout::hnd4, false},
                      AppendCase{DType::bf16, DType::bf16, CacheLayout::interleaved, true},
                      AppendCase{DType::bf16, DType::fp8_e4m3, CacheLayout::nhd3, false},
                      AppendCase{DType::fp16, DType::fp8_e4m3, CacheLayout::hnd4, true},
                      AppendCase{DType::bf16, DType::fp8_e4m3, CacheLayout::interleaved, false}),
    ::testing::PrintToStringParamName());

TEST(Fp8RoundTrip, WithinE4m3Rounding) {
  // Quantise through append_kv, dequantise (stored * scale): within half an e4m3 ulp
  // of the input (relative 2^-4 for normals, 2^-10 * scale absolute for subnormals),
  // or saturated at 448 * scale.
  const int T = 64, D = 64;
  const float scale = 0.37f;
  PagedKv kv = make_paged_kv(CacheLayout::nhd3, 5, 16, 1, D, DType::fp8_e4m3);
  HostTensor k = make_tensor(DType::bf16, {T, 1, D});
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> expo(-14.0, 10.0);
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < D; ++d) k.set({t, 0, d}, ((t + d) % 2 ? -1 : 1) * std::exp2(expo(rng)));
  std::vector<int32_t> loc(T);
  for (int t = 0; t < T; ++t) loc[t] = 16 + t;
  const HostTensor locs = make_int32(loc);
  pagedmha::append_kv(k.view(), k.view(), kv.k.view(), kv.v.view(), locs.view(), 16, scale, scale);
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < D; ++d) {
      const double x = k.get({t, 0, d});
      const double deq = kv.kget(loc[t], 0, d) * scale;
      const double a = std::fabs(x) / scale;
      if (a >= 448.0) {
        ASSERT_EQ(deq, std::copysign(448.0 * scale, x));
      } else if (a >= std::ldexp(1.0, -6)) {
        ASSERT_LE(std::fabs(deq - x), std::ldexp(std::fabs(x), -4) * (1 + 1e-6)) << x;
      } else {
        ASSERT_LE(std::fabs(deq - x), std::ldexp(1.0, -10) * scale * (1 + 1e-6)) << x;
      }
    }
}

// --- number formats: the library's converters agree with the oracle's -----------------

TEST(NumberFormats, DecodersAgreeOnEveryCode) {
  for (uint32_t b = 0; b < 256; ++b) {
    const double o = oracle::decode_bits(oracle::Format::fp8_e4m3, b);
    const float l = pagedmha::fp8_e4m3_to_float(static_cast<uint8_t>(b));
    if (std::isnan(o)) ASSERT_TRUE(std::isnan(l)) << b;
    else ASSERT_EQ(o, l) << b;
  }
  for (uint32_t b = 0; b < 65536; ++b) {
    const double ob = oracle::decode_bits(oracle::Format::bf16, b), of = oracle::decode_bits(oracle::Format::fp16, b);
    const float lb = pagedmha::bf16_to_float(static_cast<uint16_t>(b)), lf = pagedmha::fp16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(ob)) ASSERT_TRUE(std::isnan(lb)) << b; else ASSERT_EQ(ob, lb) << b;
    if (std::isnan(of)) ASSERT_TRUE(std::isnan(lf)) << b; else ASSERT_EQ(of, lf) << b;
  }
  // Hand-checked values of e4m3fn.
  EXPECT_EQ(oracle::decode_bits(oracle::Format::fp8_e4m3, 0x7E), 448.0);
  EXPECT_EQ(oracle::decode_bits(oracle::Format::fp8_e4m3, 0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(oracle::decode_bits(oracle::Format::fp8_e4m3, 0x38), 1.0);
  EXPECT_TRUE(std::isnan(oracle::decode_bits(oracle::Format::fp8_e4m3, 0xFF)));
}

TEST(NumberFormats, EncodersAgreeIncludingTiesAndSaturation) {
  std::vector<float> xs = {0.0f, -0.0f, 448.0f, 464.0f, 465.0f, 1e6f, -1e6f, 65504.0f, 65519.0f, 65520.0f,
                           std::ldexp(1.0f, -10), std::ldexp(1.0f, -7), std::ldexp(3.0f, -11)};
  // Every midpoint between adjacent fp8 / bf16 / fp16 values (ties) and their neighbours.
  for (uint32_t b = 0; b < 0x7E; ++b) {
    const double lo = oracle::decode_bits(oracle::Format::fp8_e4m3, b), hi = oracle::decode_bits(oracle::Format::fp8_e4m3, b + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    xs.insert(xs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid});
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  for (int i = 0; i < 20000; ++i) xs.push_back(u(rng) * std::exp2(static_cast<float>(i % 40 - 30)));
  for (float x : xs) {
    ASSERT_EQ(oracle::encode_bits(oracle::Format::fp8_e4m3, x), uint32_t{pagedmha::float_to_fp8_e4m3(x)}) << x;
    ASSERT_EQ(oracle::encode_bits(oracle::Format::bf16, x), uint32_t{pagedmha::float_to_bf16(x)}) << x;
    ASSERT_EQ(oracle::encode_bits(oracle::Format::fp16, x), uint32_t{pagedmha::float_to_fp16(x)}) << x;
  }
}

// --- metadata helpers ---------------------------------------------------------------

std::vector<int32_t> ints(const HostTensor& t) {
  return std::vector<int32_t>(t.typed<int32_t>(), t.typed<int32_t>() + t.numel());
}

TEST(Metadata, CumsumLengths) {
  const HostTensor len = make_int32({3, 0, 5, 1});
  HostTensor out = make_tensor(DType::int32, {5});
  pagedmha::cumsum_lengths(len.view(), out.view());
  EXPECT_EQ(ints(out), (std::vector<int32_t>{0, 3, 3, 8, 9}));
  const HostTensor empty = make_tensor(DType::int32, {0});
  HostTensor one = make_tensor(DType::int32, {1});
  pagedmha::cumsum_lengths(empty.view(), one.view());
  EXPECT_EQ(ints(one), (std::vector<int32_t>{0}));
}

TEST(Metadata, ClampSeqLens) {
  HostTensor s = make_int32({0, 1, 5, 2, 3});
  HostTensor out = make_tensor(DType::int32, {5});
  pagedmha::clamp_seq_lens(s.view(), 3, out.view());
  EXPECT_EQ(ints(out), (std::vector<int32_t>{3, 3, 5, 3, 3}));
  EXPECT_EQ(ints(s), (std::vector<int32_t>{0, 1, 5, 2, 3}));
  pagedmha::clamp_seq_lens(s.view(), 2, s.view());  // in place
  EXPECT_EQ(ints(s), (std::vector<int32_t>{2, 2, 5, 2, 3}));
}

TEST(Metadata, ClampSeqLensTwoSidedWithRepeat) {
  HostTensor s = make_int32({0, 1, 5, 2, 9});
  HostTensor out = make_tensor(DType::int32, {16});
  pagedmha::clamp_seq_lens(s.view(), 3, 8, 3, out.view().slice(0, 0, 15));
  std::vector<int32_t> got = ints(out);
  EXPECT_EQ(got, (std::vector<int32_t>{3, 3, 3, 3, 3, 3, 5, 5, 5, 3, 3, 3, 8, 8, 8,
                                       static_cast<int32_t>(poison_bits(DType::int32))}));
  got.resize(15);
  EXPECT_EQ(got, oracle::clamp_seq_lens({0, 1, 5, 2, 9}, 3, 8, 3));
  pagedmha::clamp_seq_lens(s.view(), 2, 4, 1, s.view());  // in place
  EXPECT_EQ(ints(s), (std::vector<int32_t>{2, 2, 4, 2, 4}));
}

TEST(Metadata, DecodeWriteSlotsByHand) {
  // Page 64; row 0 owns pages [7, 9, 2], row 1 [4, ...], row 2 is padding (page 0).
  const int P = 64, cols = 3;
  const HostTensor table = make_int32({7, 9, 2, 4, 5, 6, 0, 0, 0});
  HostTensor t2 = table;
  t2.shape = {3, cols}, t2.strides = {cols, 1};
  const HostTensor seq = make_int32({65, 64, 1});
  HostTensor out = make_tensor(DType::int32, {3});
  pagedmha::decode_write_slots(t2.view(), seq.view(), P, 1, out.view());
  // seq_len 65 writes position 64: page column 1 (page 9), offset 0.
  EXPECT_EQ(ints(out), (std::vector<int32_t>{9 * 64 + 0, 4 * 64 + 63, 0}));
  // Verify, N = 3: positions 62, 63, 64 / 61, 62, 63 / max(-2, 0), max(-1, 0), 0.
  HostTensor out3 = make_tensor(DType::int32, {9});
  pagedmha::decode_write_slots(t2.view(), seq.view(), P, 3, out3.view());
  EXPECT_EQ(ints(out3), (std::vector<int32_t>{7 * 64 + 62, 7 * 64 + 63, 9 * 64, 4 * 64 + 61, 4 * 64 + 62, 4 * 64 + 63,
                                              0, 0, 0}));
  // Seq_len 0 writes the first slot of page_table[r, 0].
  const HostTensor seq0 = make_int32({0, 130, 2});
  pagedmha::decode_write_slots(t2.view(), seq0.view(), P, 1, out.view());
  EXPECT_EQ(ints(out), (std::vector<int32_t>{7 * 64, 6 * 64 + 1, 1}));
}

TEST(Metadata, ExtendWriteSlotsByHand) {
  const int P = 64;
  HostTensor table = make_int32({7, 9, 2, 4, 5, 6});
  table.shape = {2, 3}, table.strides = {3, 1};
  const HostTensor prefix = make_int32({63, 0});
  const HostTensor cu = make_int32({0, 3, 5});
  HostTensor out = make_tensor(DType::int32, {6});
  pagedmha::extend_write_slots(table.view(), prefix.view(), cu.view(), P, out.view());
  std::vector<int32_t> got = ints(out);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 5),
            (std::vector<int32_t>{7 * 64 + 63, 9 * 64, 9 * 64 + 1, 4 * 64, 4 * 64 + 1}));
  EXPECT_EQ(got[5], static_cast<int32_t>(poison_bits(DType::int32))) << "wrote past cu_seqlens_q[bs]";
}

TEST(Metadata, RandomAgainstOracleRules) {
  std::mt19937 rng(9);
  for (int iter = 0; iter < 20; ++iter) {
    const int bs = 1 + iter % 7, P = std::vector<int>{1, 3, 16, 64, 256}[iter % 5], cols = 6, N = 1 + iter % 4;
    std::vector<int32_t> table(bs * cols), lens(bs), prefix(bs), ext(bs);
    for (auto& x : table) x = static_cast<int32_t>(rng() % 1000);
    for (int r = 0; r < bs; ++r) {
      lens[r] = static_cast<int32_t>(rng() % (cols * P + 1));
      prefix[r] = static_cast<int32_t>(rng() % (cols * P / 2 + 1));
      ext[r] = static_cast<int32_t>(rng() % (cols * P - prefix[r] + 1));
    }
    HostTensor t = make_int32(table);
    t.shape = {bs, cols}, t.strides = {cols, 1};
    const HostTensor l = make_int32(lens), pre = make_int32(prefix);
    const std::vector<int32_t> cu = oracle::cumsum_lengths(ext);
    const HostTensor cut = make_int32(cu);
    HostTensor o1 = make_tensor(DType::int32, {bs * N}), o2 = make_tensor(DType::int32, {std::max(cu.back(), 1)});
    pagedmha::decode_write_slots(t.view(), l.view(), P, N, o1.view());
    EXPECT_EQ(ints(o1), oracle::decode_write_slots(table, cols, lens, P, N));
    pagedmha::extend_write_slots(t.view(), pre.view(), cut.view(), P, o2.view());
    std::vector<int32_t> got = ints(o2);
    got.resize(cu.back());
    EXPECT_EQ(got, oracle::extend_write_slots(table, cols, prefix, cu, P));
    HostTensor cs = make_tensor(DType::int32, {bs + 1});
    const HostTensor ext_t = make_int32(ext);
    pagedmha::cumsum_lengths(ext_t.view(), cs.view());
    EXPECT_EQ(ints(cs), cu);
  }
}

TEST(Metadata, GatherPageTableWithPadding) {
  // req_to_page [5, 8], row 0 the padding row (zeros).
  const int max_pages = 8, P = 64;
  std::vector<int32_t> r2p(5 * max_pages, 0);
  for (int r = 1; r < 5; ++r)
    for (int c = 0; c < max_pages; ++c) r2p[r * max_pages + c] = 100 * r + c + 1;
  HostTensor req_to_page = make_int32(r2p);
  req_to_page.shape = {5, max_pages}, req_to_page.strides = {max_pages, 1};
  const HostTensor idx = make_int32({3, 0, 1, 4});
  const HostTensor seq = make_int32({65, 1, 0, 100});
  // out [4, 6]: bs = 3 rows, cols = 4; row 3 and columns 4, 5 untouched.
  HostTensor out = make_tensor(DType::int32, {4, 6});
  pagedmha::gather_page_table_with_padding(req_to_page.view(), idx.view(), seq.view(), out.view(), 3, 4, P);
  const int32_t X = static_cast<int32_t>(poison_bits(DType::int32));
  EXPECT_EQ(ints(out), (std::vector<int32_t>{301, 302, 0, 0, X, X,  //
                                              0, 0, 0, 0, X, X,      //
                                              0, 0, 0, 0, X, X,      //
                                              X, X, X, X, X, X}));
  // Against the oracle's rule on a wider case.
  HostTensor out2 = make_tensor(DType::int32, {4, 8});
  pagedmha::gather_page_table_with_padding(req_to_page.view(), idx.view(), seq.view(), out2.view(), 4, 8, 16);
  std::vector<int32_t> want(32, X);
  oracle::gather_page_table(r2p, max_pages, {3, 0, 1, 4}, {65, 1, 0, 100}, want, 8, 4, 8, 16);
  EXPECT_EQ(ints(out2), want);
}

TEST(Metadata, GatherRejectsColsAboveCapacity) {
  HostTensor req_to_page = make_int32(std::vector<int32_t>(2 * 4, 0));
  req_to_page.shape = {2, 4}, req_to_page.strides = {4, 1};
  const HostTensor idx = make_int32({1}), seq = make_int32({5});
  HostTensor out = make_tensor(DType::int32, {1, 8});
  EXPECT_THROW(pagedmha::gather_page_table_with_padding(req_to_page.view(), idx.view(), seq.view(), out.view(), 1, 5, 4),
               pagedmha::Error);
}

}  // namespace
