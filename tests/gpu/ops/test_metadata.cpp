// gather_page_table_with_padding, the metadata helpers and debug validation on CUDA,
// against the oracle and the CPU path; untouched regions checked to stay poisoned.
#include <gtest/gtest.h>

#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

std::vector<int32_t> as_vec(const std::vector<uint8_t>& bytes, size_t n, size_t first = 0) {
  std::vector<int32_t> v(n);
  std::memcpy(v.data(), bytes.data() + first * 4, n * 4);
  return v;
}

TEST(GpuMetadata, GatherPageTable) {
  REQUIRE_GPU();
  int i = 0;
  for (int P : {1, 16, 64}) {
    for (int bs : {1, 7, 256}) {
      Rng rng(4000 + i++);
      const int max_req = 300, max_pages = 40, cols = 33;
      std::vector<int32_t> r2p(static_cast<size_t>(max_req + 1) * max_pages, 0);
      for (size_t x = max_pages; x < r2p.size(); ++x) r2p[x] = rng.uniform(1, 1 << 30);
      std::vector<int32_t> idx, lens;
      for (int r = 0; r < bs + 5; ++r) {
        idx.push_back(r % 4 == 3 ? 0 : rng.uniform(1, max_req));
        const int picks[] = {0, 1, P, P + 1, cols * P, rng.uniform(0, cols * P)};
        lens.push_back(picks[rng.uniform(0, 5)]);
      }
      Tensor t_r2p(DType::int32, {max_req + 1, max_pages});
      std::memcpy(t_r2p.host.data(), r2p.data(), r2p.size() * 4);
      Tensor t_idx = int32_tensor(idx), t_lens = int32_tensor(lens);
      Tensor out(DType::int32, {bs + 3, cols + 4});  // 0xFF poison: rows >= bs, cols >= cols untouched
      std::vector<int32_t> expect(out.host.size() / 4);
      std::memcpy(expect.data(), out.host.data(), out.host.size());
      oracle::gather_page_table(r2p, max_pages, idx, lens, expect, cols + 4, bs, cols, P);
      Tensor cpu = out.clone();
      pagedmha::gather_page_table_with_padding(t_r2p.cpu(), t_idx.cpu(), t_lens.cpu(), cpu.cpu(), bs, cols, P);
      for (Tensor* t : {&t_r2p, &t_idx, &t_lens, &out}) t->upload();
      pagedmha::gather_page_table_with_padding(t_r2p.gpu(), t_idx.gpu(), t_lens.gpu(), out.gpu(), bs, cols, P);
      pagedmha::synchronize();
      EXPECT_EQ(as_vec(out.download(), expect.size()), expect) << "P=" << P << " bs=" << bs;
      EXPECT_EQ(as_vec(cpu.host, expect.size()), expect) << "cpu P=" << P << " bs=" << bs;
    }
  }
}

TEST(GpuMetadata, CumsumLengths) {
  REQUIRE_GPU();
  for (int n : {0, 1, 5, 1023, 1024, 1025, 4097, 100000}) {
    Rng rng(4100 + n);
    std::vector<int32_t> len(n);
    for (auto& x : len) x = rng.uniform(0, 9000);
    Tensor in = int32_tensor(len), out(DType::int32, {n + 1});
    in.upload();
    out.upload();
    pagedmha::cumsum_lengths(in.gpu(), out.gpu());
    pagedmha::synchronize();
    EXPECT_EQ(as_vec(out.download(), n + 1), oracle::cumsum_lengths(len)) << "n=" << n;
  }
}

TEST(GpuMetadata, ClampSeqLensInPlaceAndOut) {
  REQUIRE_GPU();
  Rng rng(4200);
  std::vector<int32_t> len(1000);
  for (auto& x : len) x = rng.uniform(0, 12);
  for (int min_len : {0, 1, 4, 8}) {
    Tensor in = int32_tensor(len), out(DType::int32, {1000});
    in.upload();
    out.upload();
    pagedmha::clamp_seq_lens(in.gpu(), min_len, out.gpu());
    pagedmha::clamp_seq_lens(in.gpu(), min_len, in.gpu());  // in place
    pagedmha::synchronize();
    const auto expect = oracle::clamp_seq_lens(len, min_len);
    EXPECT_EQ(as_vec(out.download(), 1000), expect);
    EXPECT_EQ(as_vec(in.download(), 1000), expect);
  }
}

TEST(GpuMetadata, DecodeAndExtendWriteSlots) {
  REQUIRE_GPU();
  for (int P : {1, 3, 16, 256}) {
    Rng rng(4300 + P);
    const int bs = 37, cols = 12;
    std::vector<int32_t> table(bs * cols);
    for (auto& x : table) x = rng.uniform(1, 100000);
    Tensor t_table(DType::int32, {bs, cols});
    std::memcpy(t_table.host.data(), table.data(), table.size() * 4);
    t_table.upload();
    for (int N = 1; N <= 8; ++N) {
      std::vector<int32_t> lens(bs);
      for (int r = 0; r < bs; ++r) lens[r] = r == 0 ? 0 : rng.uniform(1, cols * P);
      Tensor t_lens = int32_tensor(lens), out(DType::int32, {bs * N});
      Tensor cpu = out.clone();
      pagedmha::decode_write_slots(t_table.cpu(), t_lens.cpu(), P, N, cpu.cpu());
      t_lens.upload();
      out.upload();
      pagedmha::decode_write_slots(t_table.gpu(), t_lens.gpu(), P, N, out.gpu());
      pagedmha::synchronize();
      const auto expect = oracle::decode_write_slots(table, cols, lens, P, N);
      EXPECT_EQ(as_vec(out.download(), expect.size()), expect) << "P=" << P << " N=" << N;
      EXPECT_EQ(as_vec(cpu.host, expect.size()), expect) << "cpu P=" << P << " N=" << N;
    }
    std::vector<int32_t> prefix(bs), ext(bs);
    for (int r = 0; r < bs; ++r) {
      prefix[r] = rng.uniform(0, cols * P / 2);
      ext[r] = r % 5 == 0 ? 0 : rng.uniform(1, cols * P - prefix[r]);
    }
    const auto cu = oracle::cumsum_lengths(ext);
    Tensor t_prefix = int32_tensor(prefix), t_cu = int32_tensor(cu), out(DType::int32, {cu.back() + 3});
    Tensor cpu = out.clone();
    pagedmha::extend_write_slots(t_table.cpu(), t_prefix.cpu(), t_cu.cpu(), P, cpu.cpu());
    for (Tensor* t : {&t_prefix, &t_cu, &out}) t->upload();
    pagedmha::extend_write_slots(t_table.gpu(), t_prefix.gpu(), t_cu.gpu(), P, out.gpu());
    pagedmha::synchronize();
    auto expect = oracle::extend_write_slots(table, cols, prefix, cu, P);
    for (int x = 0; x < 3; ++x) expect.push_back(-1);  // the tail stays poisoned
    EXPECT_EQ(as_vec(out.download(), expect.size()), expect) << "extend P=" << P;
    EXPECT_EQ(as_vec(cpu.host, expect.size()), expect) << "cpu extend P=" << P;
  }
}

// Debug validation names the first bad page id / slot; off, the same calls are silent.
TEST(GpuMetadata, DebugValidation) {
  REQUIRE_GPU();
  AttnSpec s;
  s.seq_lens = {40, 70};
  AttnCase c = build_case(s);
  c.page_table.i32(static_cast<int64_t>(1) * c.cols + 2) = static_cast<int32_t>(c.num_pages) + 5;
  pagedmha::set_debug_validation(true);
  try {
    run_gpu(c);
    ADD_FAILURE() << "bad page id not reported";
  } catch (const pagedmha::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("page_table[1, 2]"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(c.num_pages + 5)), std::string::npos) << m;
  }
  // A slot outside the pool.
  Tensor k(DType::bf16, {2, 2, 128}), v(DType::bf16, {2, 2, 128});
  for (int64_t x = 0; x < 2 * 2 * 128; ++x) {
    k.set(x, 1.0);
    v.set(x, 1.0);
  }
  Tensor loc = int32_tensor({5, static_cast<int32_t>(c.num_pages * s.page_size)});
  for (Tensor* t : {&k, &v, &loc}) t->upload();
  try {
    pagedmha::append_kv(k.gpu(), v.gpu(), c.k_cache.gpu(), c.v_cache.gpu(), loc.gpu(), s.page_size);
    ADD_FAILURE() << "bad slot not reported";
  } catch (const pagedmha::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out_cache_loc[1]"), std::string::npos) << e.what();
  }
  pagedmha::set_debug_validation(false);
  // Valid inputs pass validation.
  pagedmha::set_debug_validation(true);
  AttnCase ok = build_case(s);
  EXPECT_NO_THROW(run_gpu(ok));
  pagedmha::set_debug_validation(false);
}

}  // namespace
}  // namespace gpu_test
