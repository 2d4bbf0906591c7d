// A tiny suite of every CUDA kernel family at small shapes, run by scripts/gpu.sh under
// compute-sanitizer (memcheck, racecheck, synccheck). Each case still checks its
// result (against the oracle and the CPU path) so it cannot pass by doing nothing.
#include <gtest/gtest.h>

#include <limits>

#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

TEST(Sanitizer, DecodeSplitsSinksWindow) {
  REQUIRE_GPU();
  AttnSpec s;
  s.num_q_heads = 8;
  s.num_kv_heads = 2;
  s.page_size = 16;
  s.q_len_per_req = 2;
  s.seq_lens = {0, 1, 33, 300};
  s.window_left = 64;
  s.sinks = {0, 1, 2, 3, -std::numeric_limits<float>::infinity(), 5, 6, 7};
  for (int splits : {0, 1, 7}) {
    s.num_splits = splits;
    s.seed = 7000 + splits;
    AttnCase c = build_case(s);
    check_case(c, describe(s));
  }
}

TEST(Sanitizer, DecodeFp8HeadDims) {
  REQUIRE_GPU();
  for (int D : {64, 256}) {
    AttnSpec s;
    s.head_dim = D;
    s.kv_dtype = DType::fp8_e4m3;
    s.k_scale = 0.37f;
    s.v_scale = 2.5f;
    s.seq_lens = {5, 130};
    s.seed = 7100 + D;
    AttnCase c = build_case(s);
    check_case(c, describe(s));
  }
}

TEST(Sanitizer, PrefillRaggedPrefixNonCausal) {
  REQUIRE_GPU();
  for (bool causal : {true, false}) {
    AttnSpec s;
    s.decode = false;
    s.causal = causal;
    s.page_size = 3;
    s.seq_lens = {0, 70, 200, 3};
    s.q_lens = {0, 70, 45, 5};
    s.row_pad = 8;
    s.seed = 7200 + causal;
    AttnCase c = build_case(s);
    check_case(c, describe(s));
  }
}

TEST(Sanitizer, AppendGatherMetadata) {
  REQUIRE_GPU();
  // append_kv bf16 and fp8 into a small pool, checked against the CPU path.
  for (DType dst : {DType::bf16, DType::fp8_e4m3}) {
    Tensor kc(dst, {6, 16, 2, 128}), vc(dst, {6, 16, 2, 128});
    Tensor k(DType::bf16, {20, 2, 128}), v(DType::bf16, {20, 2, 128});
    Rng rng(7300);
    for (int64_t x = 0; x < 20 * 2 * 128; ++x) {
      k.set(x, rng.normal());
      v.set(x, rng.normal());
    }
    std::vector<int32_t> slots;
    for (int t = 0; t < 20; ++t) slots.push_back(16 + 3 * t);
    Tensor loc = int32_tensor(slots);
    Tensor ck = kc.clone(), cv = vc.clone();
    pagedmha::append_kv(k.cpu(), v.cpu(), ck.cpu(), cv.cpu(), loc.cpu(), 16, 0.5f, 2.0f);
    for (Tensor* t : {&kc, &vc, &k, &v, &loc}) t->upload();
    pagedmha::append_kv(k.gpu(), v.gpu(), kc.gpu(), vc.gpu(), loc.gpu(), 16, 0.5f, 2.0f);
    pagedmha::synchronize();
    EXPECT_TRUE(kc.download() == ck.host);
    EXPECT_TRUE(vc.download() == cv.host);
  }
  // gather + the four metadata helpers.
  std::vector<int32_t> r2p(5 * 8);
  for (size_t x = 8; x < r2p.size(); ++x) r2p[x] = static_cast<int32_t>(x);
  Tensor t_r2p(DType::int32, {5, 8});
  std::memcpy(t_r2p.host.data(), r2p.data(), r2p.size() * 4);
  Tensor idx = int32_tensor({2, 0, 4}), lens = int32_tensor({17, 1, 128}), out(DType::int32, {3, 8});
  std::vector<int32_t> expect(24, -1);
  oracle::gather_page_table(r2p, 8, {2, 0, 4}, {17, 1, 128}, expect, 8, 3, 8, 16);
  for (Tensor* t : {&t_r2p, &idx, &lens, &out}) t->upload();
  pagedmha::gather_page_table_with_padding(t_r2p.gpu(), idx.gpu(), lens.gpu(), out.gpu(), 3, 8, 16);
  Tensor cu(DType::int32, {4}), clamped(DType::int32, {3}), dslots(DType::int32, {6}), eslots(DType::int32, {146});
  Tensor prefix = int32_tensor({0, 0, 0});
  for (Tensor* t : {&cu, &clamped, &dslots, &eslots, &prefix}) t->upload();
  pagedmha::cumsum_lengths(lens.gpu(), cu.gpu());
  pagedmha::clamp_seq_lens(lens.gpu(), 2, clamped.gpu());
  pagedmha::decode_write_slots(out.gpu(), lens.gpu(), 16, 2, dslots.gpu());
  pagedmha::extend_write_slots(out.gpu(), prefix.gpu(), cu.gpu(), 16, eslots.gpu());
  pagedmha::synchronize();
  std::vector<int32_t> got(24);
  std::memcpy(got.data(), out.download().data(), 96);
  EXPECT_EQ(got, expect);
  std::vector<int32_t> cuv(4);
  std::memcpy(cuv.data(), cu.download().data(), 16);
  EXPECT_EQ(cuv, (std::vector<int32_t>{0, 17, 18, 146}));
  std::vector<int32_t> table(expect.begin(), expect.end());
  const auto d = oracle::decode_write_slots(table, 8, {17, 1, 128}, 16, 2);
  std::vector<int32_t> dv(6);
  std::memcpy(dv.data(), dslots.download().data(), 24);
  EXPECT_EQ(dv, d);
  const auto e = oracle::extend_write_slots(table, 8, {0, 0, 0}, {0, 17, 18, 146}, 16);
  std::vector<int32_t> ev(146);
  std::memcpy(ev.data(), eslots.download().data(), 146 * 4);
  EXPECT_EQ(ev, e);
}

}  // namespace
}  // namespace gpu_test
