// gather_page_table_with_padding, the metadata helpers and debug validation on CUDA,
// against the oracle; untouched regions checked to stay poisoned.
#include <gtest/gtest.h>

#include <random>

#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

int uniform(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

/// A [rows, cols] int32 tensor holding `values` (row-major).
HostTensor int32_matrix(const std::vector<int32_t>& values, int64_t rows, int64_t cols) {
  HostTensor t = make_tensor(DType::int32, {rows, cols});
  std::memcpy(t.data(), values.data(), values.size() * 4);
  return t;
}

TEST(GpuMetadata, GatherPageTable) {
  REQUIRE_GPU();
  int i = 0;
  for (int P : {1, 16, 64}) {
    for (int bs : {1, 7, 256}) {
      std::mt19937_64 rng(4000 + i++);
      const int max_req = 300, max_pages = 40, cols = 33;
      std::vector<int32_t> r2p(static_cast<size_t>(max_req + 1) * max_pages, 0);
      for (size_t x = max_pages; x < r2p.size(); ++x) r2p[x] = uniform(rng, 1, 1 << 30);
      std::vector<int32_t> idx, lens;
      for (int r = 0; r < bs + 5; ++r) {
        idx.push_back(r % 4 == 3 ? 0 : uniform(rng, 1, max_req));
        const int picks[] = {0, 1, P, P + 1, cols * P, uniform(rng, 0, cols * P)};
        lens.push_back(picks[uniform(rng, 0, 5)]);
      }
      DeviceMirror dev;
      const HostTensor t_r2p = int32_matrix(r2p, max_req + 1, max_pages);
      const HostTensor out = make_tensor(DType::int32, {bs + 3, cols + 4});  // rows >= bs, cols >= cols: poison
      std::vector<int32_t> expect = int_values(out);
      oracle::gather_page_table(r2p, max_pages, idx, lens, expect, cols + 4, bs, cols, P);
      pagedmha::gather_page_table_with_padding(dev.view(t_r2p), dev.view(make_int32(idx)), dev.view(make_int32(lens)),
                                               dev.view(out), bs, cols, P);
      dev.download(out);
      EXPECT_EQ(int_values(out), expect) << "P=" << P << " bs=" << bs;
    }
  }
}

TEST(GpuMetadata, CumsumLengths) {
  REQUIRE_GPU();
  for (int n : {0, 1, 5, 1023, 1024, 1025, 4097, 100000}) {
    std::mt19937_64 rng(4100 + n);
    std::vector<int32_t> len(n);
    for (auto& x : len) x = uniform(rng, 0, 9000);
    DeviceMirror dev;
    const HostTensor out = make_tensor(DType::int32, {n + 1});
    pagedmha::cumsum_lengths(dev.view(make_int32(len)), dev.view(out));
    dev.download(out);
    EXPECT_EQ(int_values(out), oracle::cumsum_lengths(len)) << "n=" << n;
  }
}

TEST(GpuMetadata, ClampSeqLensInPlaceAndOut) {
  REQUIRE_GPU();
  std::mt19937_64 rng(4200);
  std::vector<int32_t> len(1000);
  for (auto& x : len) x = uniform(rng, 0, 12);
  for (int min_len : {0, 1, 4, 8}) {
    DeviceMirror dev;
    const HostTensor in = make_int32(len), out = make_tensor(DType::int32, {1000});
    pagedmha::clamp_seq_lens(dev.view(in), min_len, dev.view(out));
    pagedmha::clamp_seq_lens(dev.view(in), min_len, dev.view(in));  // in place
    dev.download(out);
    dev.download(in);
    const auto expect = oracle::clamp_seq_lens(len, min_len);
    EXPECT_EQ(int_values(out), expect);
    EXPECT_EQ(int_values(in), expect);
  }
}

TEST(GpuMetadata, DecodeAndExtendWriteSlots) {
  REQUIRE_GPU();
  for (int P : {1, 3, 16, 256}) {
    std::mt19937_64 rng(4300 + P);
    const int bs = 37, cols = 12;
    std::vector<int32_t> table(bs * cols);
    for (auto& x : table) x = uniform(rng, 1, 100000);
    DeviceMirror dev;
    const HostTensor t_table = int32_matrix(table, bs, cols);
    for (int N = 1; N <= 8; ++N) {
      std::vector<int32_t> lens(bs);
      for (int r = 0; r < bs; ++r) lens[r] = r == 0 ? 0 : uniform(rng, 1, cols * P);
      const HostTensor out = make_tensor(DType::int32, {bs * N});
      pagedmha::decode_write_slots(dev.view(t_table), dev.view(make_int32(lens)), P, N, dev.view(out));
      dev.download(out);
      EXPECT_EQ(int_values(out), oracle::decode_write_slots(table, cols, lens, P, N)) << "P=" << P << " N=" << N;
    }
    std::vector<int32_t> prefix(bs), ext(bs);
    for (int r = 0; r < bs; ++r) {
      prefix[r] = uniform(rng, 0, cols * P / 2);
      ext[r] = r % 5 == 0 ? 0 : uniform(rng, 1, cols * P - prefix[r]);
    }
    const auto cu = oracle::cumsum_lengths(ext);
    const HostTensor out = make_tensor(DType::int32, {cu.back() + 3});  // the tail stays poisoned
    std::vector<int32_t> expect = int_values(out);
    const auto slots = oracle::extend_write_slots(table, cols, prefix, cu, P);
    std::copy(slots.begin(), slots.end(), expect.begin());
    pagedmha::extend_write_slots(dev.view(t_table), dev.view(make_int32(prefix)), dev.view(make_int32(cu)), P,
                                 dev.view(out));
    dev.download(out);
    EXPECT_EQ(int_values(out), expect) << "extend P=" << P;
  }
}

// Debug validation names the first bad page id / slot; off, the same calls are silent.
TEST(GpuMetadata, DebugValidation) {
  REQUIRE_GPU();
  AttnCase c = gpu_case();
  c.kv_lens = {40, 70};
  AttnProblem p = build(c);
  const int32_t bad_page = static_cast<int32_t>(p.kv.num_pages) + 5;
  p.page_table.typed<int32_t>()[1 * p.cols + 2] = bad_page;
  pagedmha::set_debug_validation(true);
  try {
    run_gpu(p);
    ADD_FAILURE() << "bad page id not reported";
  } catch (const pagedmha::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("page_table[1, 2]"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(bad_page)), std::string::npos) << m;
  }
  // A slot outside the pool.
  DeviceMirror dev;
  HostTensor k = make_tensor(DType::bf16, {2, c.Hkv, c.D}), v = make_tensor(DType::bf16, {2, c.Hkv, c.D});
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < c.Hkv; ++h)
      for (int d = 0; d < c.D; ++d) k.set({t, h, d}, 1.0), v.set({t, h, d}, 1.0);
  const HostTensor loc = make_int32({5, static_cast<int32_t>(p.kv.num_pages * c.page_size)});
  try {
    pagedmha::append_kv(dev.view(k), dev.view(v), dev.view(p.kv.k), dev.view(p.kv.v), dev.view(loc), c.page_size);
    ADD_FAILURE() << "bad slot not reported";
  } catch (const pagedmha::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out_cache_loc[1]"), std::string::npos) << e.what();
  }
  pagedmha::set_debug_validation(false);
  // Valid inputs pass validation.
  pagedmha::set_debug_validation(true);
  const AttnProblem ok = build(c);
  EXPECT_NO_THROW(run_gpu(ok));
  pagedmha::set_debug_validation(false);
}

}  // namespace
}  // namespace gpu_test
