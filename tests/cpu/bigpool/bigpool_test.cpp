// A pool above 2^31 elements with page ids above 65,535 (docs/semantics.md section 2):
// fp8, Hkv = 1, D = 64, page 256, 131,136 pages (2.15e9 elements per buffer).
// The pool is a lazily backed anonymous mapping: only the pages the test writes
// are resident. Each page gets its own V pattern (its id in base-64 digits), and the
// pages that a 32-bit-wrapped or 16-bit-truncated address would hit get theirs, so a
// wrong offset shows up as a wrong value rather than a crash or a lucky zero.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "oracle/oracle.h"
#include "pagedmha/ops.h"

namespace {

using pagedmha::Device;
using pagedmha::DType;
using pagedmha::TensorView;

constexpr int P = 256, D = 64;
constexpr int64_t kPages = 131072 + 64;
constexpr int64_t kPageElems = static_cast<int64_t>(P) * D;
constexpr int64_t kElems = kPages * kPageElems;  // > 2^31

struct Mapping {
  uint8_t* data = nullptr;
  Mapping() {
    void* m = mmap(nullptr, kElems, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data = m == MAP_FAILED ? nullptr : static_cast<uint8_t*>(m);
  }
  ~Mapping() {
    if (data) munmap(data, kElems);
  }
};

/// e4m3 code of dim d of every token in page `page`: dims 0..3 spell the page id in
/// base 64 (codes 0x10..0x4F, positive normals), the rest a page-dependent filler.
uint8_t pattern(int64_t page, int d) {
  if (d < 4) return static_cast<uint8_t>(0x10 + ((page >> (6 * d)) & 63));
  return static_cast<uint8_t>(0x28 + (page * 7 + d) % 24);
}

void fill_page(uint8_t* pool, int64_t page) {
  for (int t = 0; t < P; ++t)
    for (int d = 0; d < D; ++d) pool[page * kPageElems + static_cast<int64_t>(t) * D + d] = pattern(page, d);
}

/// The pages a broken address computation would read instead of `page`.
std::vector<int64_t> decoys(int64_t page) {
  const int64_t off = page * kPageElems;
  std::vector<int64_t> v = {page & 0xFFFF, (off & 0xFFFFFFFFLL) / kPageElems, (off & 0x7FFFFFFFLL) / kPageElems};
  std::vector<int64_t> r;
  for (int64_t x : v)
    if (x != page && x > 0 && x < kPages) r.push_back(x);
  return r;
}

TEST(BigPool, PagesAbove65535InAPoolAbove2To31Elements) {
  ASSERT_GT(kElems, int64_t{1} << 31);
  Mapping pool;
  ASSERT_NE(pool.data, nullptr) << "mmap of " << kElems << " bytes failed";
  // Requests: the last page alone (output must be exactly its V), pages around the
  // 16-bit boundary ending mid-page, and a high page followed by a low one.
  const int64_t last = kPages - 1;
  const std::vector<std::vector<int32_t>> tables = {
      {static_cast<int32_t>(last)}, {65535, 65536, 70000, static_cast<int32_t>(last)}, {131071, 3}};
  const std::vector<int32_t> lens = {P, 3 * P + 5, P + 100};
  std::set<int64_t> filled;
  for (const auto& t : tables)
    for (int32_t page : t) {
      filled.insert(page);
      for (int64_t d : decoys(page)) filled.insert(d);
    }
  for (int64_t page : filled) fill_page(pool.data, page);

  const int B = static_cast<int>(tables.size()), cols = 4, Hq = 2;
  std::vector<int32_t> table(B * cols, 0);
  for (int b = 0; b < B; ++b)
    for (size_t c = 0; c < tables[b].size(); ++c) table[b * cols + c] = tables[b][c];
  std::vector<uint16_t> q(B * Hq * D);
  std::mt19937 rng(1);
  std::normal_distribution<double> normal(0.0, 0.3);
  std::vector<double> qd(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = static_cast<uint16_t>(oracle::encode_bits(oracle::Format::bf16, normal(rng)));
    qd[i] = oracle::decode_bits(oracle::Format::bf16, q[i]);
  }
  std::vector<uint16_t> out(q.size(), 0x7FC1);
  std::vector<float> lse(B * Hq, 0.0f);
  // K and V are the same buffer (read-only here): each token's key is its page's pattern.
  TensorView cache(pool.data, DType::fp8_e4m3, Device::cpu(), {kPages * P, 1, D});
  TensorView qv(q.data(), DType::bf16, Device::cpu(), {B, Hq, D});
  TensorView ov(out.data(), DType::bf16, Device::cpu(), {B, Hq, D});
  TensorView tv(table.data(), DType::int32, Device::cpu(), {B, cols});
  std::vector<int32_t> seq(lens);
  TensorView sv(seq.data(), DType::int32, Device::cpu(), {B});
  TensorView lv(lse.data(), DType::fp32, Device::cpu(), {B, Hq});
  pagedmha::AttentionParams prm;
  prm.bmm1_scale = 0.125f;
  prm.bmm2_scale = 1.0f;
  pagedmha::batch_decode(qv, cache, cache, tv, sv, P, 1, ov, prm, lv);

  oracle::AttentionSpec spec;
  spec.num_q_heads = Hq, spec.num_kv_heads = 1, spec.head_dim = D, spec.bmm1_scale = 0.125;
  for (int b = 0; b < B; ++b) {
    std::vector<double> kv(static_cast<size_t>(lens[b]) * D);
    for (int j = 0; j < lens[b]; ++j)
      for (int d = 0; d < D; ++d)
        kv[static_cast<size_t>(j) * D + d] =
            oracle::decode_bits(oracle::Format::fp8_e4m3, pattern(tables[b][j / P], d));
    std::vector<double> o(Hq * D), l(Hq);
    oracle::attention(spec, 1, lens[b], qd.data() + b * Hq * D, kv.data(), kv.data(), o.data(), l.data());
    for (int h = 0; h < Hq; ++h) {
      EXPECT_NEAR(lse[b * Hq + h], l[h], 1e-4 * (1 + std::fabs(l[h]))) << "request " << b;
      for (int d = 0; d < D; ++d) {
        const double got = oracle::decode_bits(oracle::Format::bf16, out[(b * Hq + h) * D + d]);
        if (b == 0) {  // one page: every visible V equals the page's pattern
          ASSERT_EQ(got, oracle::decode_bits(oracle::Format::fp8_e4m3, pattern(last, d))) << "dim " << d;
        } else {
          ASSERT_NEAR(got, o[h * D + d], 1e-2 * std::fabs(o[h * D + d]) + 1e-6) << "request " << b << " dim " << d;
        }
      }
    }
  }

  // append_kv into the last page and page 65536: only the named slots change.
  const std::vector<int32_t> loc = {static_cast<int32_t>(last * P + 7), 65536 * P + 3};
  std::vector<uint16_t> src(2 * D);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<uint16_t>(oracle::encode_bits(oracle::Format::bf16, 0.5 + 0.01 * static_cast<double>(i)));
  std::vector<int32_t> locv(loc);
  TensorView kvsrc(src.data(), DType::bf16, Device::cpu(), {2, 1, D});
  TensorView lcv(locv.data(), DType::int32, Device::cpu(), {2});
  std::vector<uint8_t> before_neighbours;
  for (int32_t s : loc)
    for (int64_t e : {static_cast<int64_t>(s) - 1, static_cast<int64_t>(s) + 1})
      before_neighbours.insert(before_neighbours.end(), pool.data + e * D, pool.data + (e + 1) * D);
  // append_kv rejects K and V aliasing (it writes both): V goes to a second sparse pool.
  Mapping vpool;
  ASSERT_NE(vpool.data, nullptr);
  TensorView vcache(vpool.data, DType::fp8_e4m3, Device::cpu(), {kPages * P, 1, D});
  pagedmha::append_kv(kvsrc, kvsrc, cache, vcache, lcv, P, 1.0f, 1.0f);
  std::vector<uint8_t> after_neighbours;
  for (int32_t s : loc)
    for (int64_t e : {static_cast<int64_t>(s) - 1, static_cast<int64_t>(s) + 1})
      after_neighbours.insert(after_neighbours.end(), pool.data + e * D, pool.data + (e + 1) * D);
  EXPECT_EQ(before_neighbours, after_neighbours);
  for (int t = 0; t < 2; ++t)
    for (int d = 0; d < D; ++d) {
      const double x = oracle::decode_bits(oracle::Format::bf16, src[t * D + d]);
      ASSERT_EQ(uint32_t{pool.data[static_cast<int64_t>(loc[t]) * D + d]}, oracle::encode_bits(oracle::Format::fp8_e4m3, x))
          << "token " << t << " dim " << d;
    }
  // The decoys of those pages were not written.
  for (int32_t s : loc)
    for (int64_t dp : decoys(s / P))
      for (int d = 0; d < D; ++d) ASSERT_EQ(pool.data[dp * kPageElems + (s % P) * D + d], pattern(dp, d));
}

}  // namespace
