// What an op writes may not share memory with what it reads: an output laid over the op's
// own page table, slots or cache changed them while it ran (an adversarial review found
// out-of-bounds writes, a crash and a changed KV cache from calls that reported success).
// Each case is an error naming the op and both arguments, and nothing is written.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/error_text.h"
#include "pagedmha/error.h"
#include "pagedmha/numeric.h"
#include "pagedmha/ops.h"
#include "op_fixtures.h"

namespace {

using namespace pagedmha;
using namespace opfix;

using testutil::error_of;

void expect_has(const std::string& msg, std::initializer_list<const char*> frags) {
  for (const char* f : frags) EXPECT_NE(msg.find(f), std::string::npos) << "missing \"" << f << "\" in: " << msg;
}

// One byte arena holding every tensor of a call, so that any two can be made to overlap:
// a decode of batch 2 (Hq 4, Hkv 2, D 64, page 4, 8 pages, 3 table columns).
struct Arena {
  static constexpr int B = 2, Hq = 4, Hkv = 2, D = 64, P = 4, pages = 8, cols = 3;
  std::vector<uint8_t> bytes = std::vector<uint8_t>(1 << 20, 0);
  int64_t q_at = 0, k_at = 4096, v_at = 4096 + 65536, out_at = 4096 + 2 * 65536, lse_at = out_at + 4096,
          table_at = lse_at + 1024, lens_at = table_at + 1024, sinks_at = lens_at + 1024, ws_at = sinks_at + 1024;
  Arena() {
    auto* q = reinterpret_cast<uint16_t*>(&bytes[q_at]);
    for (int i = 0; i < B * Hq * D; ++i) q[i] = float_to_bf16(0.01f * (i % 37));
    auto* k = reinterpret_cast<uint16_t*>(&bytes[k_at]);
    auto* v = reinterpret_cast<uint16_t*>(&bytes[v_at]);
    for (int i = 0; i < pages * P * Hkv * D; ++i) k[i] = float_to_bf16(0.02f * (i % 29)), v[i] = float_to_bf16(0.5f);
    const int32_t table[] = {1, 2, 0, 3, 4, 5}, lens[] = {5, 9};
    std::copy(table, table + 6, reinterpret_cast<int32_t*>(&bytes[table_at]));
    std::copy(lens, lens + 2, reinterpret_cast<int32_t*>(&bytes[lens_at]));
  }
  TensorView at(int64_t off, DType t, std::initializer_list<int64_t> shape) {
    return TensorView(&bytes[off], t, Device::cpu(), shape);
  }
  TensorView Q() { return at(q_at, DType::bf16, {B, Hq, D}); }
  TensorView K() { return at(k_at, DType::bf16, {pages * P, Hkv, D}); }
  TensorView V() { return at(v_at, DType::bf16, {pages * P, Hkv, D}); }
  TensorView O(int64_t off) { return at(off, DType::bf16, {B, Hq, D}); }
  TensorView LSE(int64_t off) { return at(off, DType::fp32, {B, Hq}); }
  TensorView T() { return at(table_at, DType::int32, {B, cols}); }
  TensorView S() { return at(lens_at, DType::int32, {B}); }
  std::string decode(int64_t out_off, int64_t lse_off) {
    AttentionParams params;
    params.bmm1_scale = 0.125f;
    return error_of([&] { batch_decode(Q(), K(), V(), T(), S(), P, 1, O(out_off), params, LSE(lse_off)); });
  }
};

TEST(Aliasing, DecodeOutputsApartFromEveryInput) {
  Arena a;
  EXPECT_EQ(a.decode(a.out_at, a.lse_at), "");  // the valid call
  const std::vector<uint8_t> before = a.bytes;
  // out over the page table, the lengths, the V cache, q shifted by one row; lse over out.
  const std::pair<int64_t, const char*> outs[] = {
      {a.table_at - 512, "page_table"}, {a.lens_at - 512, "seq_lens"}, {a.v_at + 256, "v_cache"}, {a.q_at + 512, "q"}};
  for (const auto& [off, input] : outs) {
    Arena b;
    const std::vector<uint8_t> kept = b.bytes;
    expect_has(b.decode(off, b.lse_at), {"batch_decode", "out", input});
    EXPECT_EQ(b.bytes, kept) << "out over " << input;
  }
  expect_has(a.decode(a.out_at, a.out_at + 256), {"batch_decode", "lse", "out"});
  // A workspace (written) over the lengths.
  AttentionParams params;
  params.bmm1_scale = 0.125f;
  expect_has(error_of([&] {
               batch_decode(a.Q(), a.K(), a.V(), a.T(), a.S(), a.P, 1, a.O(a.out_at), params, a.LSE(a.lse_at),
                            a.at(a.lens_at - 8, DType::uint8, {64}));
             }),
             {"batch_decode: workspace: expected memory disjoint from seq_lens"});
  expect_has(a.decode(a.out_at, a.table_at), {"batch_decode", "lse", "page_table"});
  EXPECT_EQ(a.bytes, before);
}

TEST(Aliasing, PrefillOutputApartFromCuSeqlens) {
  Arena a;
  std::vector<int32_t> cu{0, 1, 2};
  AttentionParams params;
  params.bmm1_scale = 0.125f;
  // cu_seqlens_q inside out's rows.
  std::vector<uint16_t> o(static_cast<std::size_t>(2 * 4 * 64) + 16, 0);
  auto* cu_in_out = reinterpret_cast<int32_t*>(o.data() + 64);
  std::copy(cu.begin(), cu.end(), cu_in_out);
  const std::vector<uint16_t> kept = o;
  expect_has(error_of([&] {
               batch_prefill(a.Q(), a.K(), a.V(), a.T(), a.S(), TensorView(cu_in_out, DType::int32, Device::cpu(), {3}),
                             a.P, 1, TensorView(o.data(), DType::bf16, Device::cpu(), {2, 4, 64}), params);
             }),
             {"batch_prefill", "out", "cu_seqlens_q"});
  EXPECT_EQ(o, kept);
}

// The review's wild write: the slots lived inside the K cache, so writing token 0
// rewrote token 1's (checked) slot.
TEST(Aliasing, AppendKvSlotsAndSourcesApartFromTheCaches) {
  Append a;
  auto* loc_in_cache = reinterpret_cast<int32_t*>(a.kc.data() + 2 * 64);  // slot 1 of the K pool
  loc_in_cache[0] = 16, loc_in_cache[1] = 3, loc_in_cache[2] = 4;
  const std::vector<uint16_t> kc = a.kc, vc = a.vc;
  expect_has(error_of([&] {
               append_kv(a.K(), a.V(), a.KC(), a.VC(), TensorView(loc_in_cache, DType::int32, Device::cpu(), {3}), 4);
             }),
             {"append_kv", "k_cache", "out_cache_loc"});
  // The new V rows read from inside the V cache.
  expect_has(error_of([&] {
               append_kv(a.K(), TensorView(a.vc.data(), DType::bf16, Device::cpu(), {3, 2, 64}), a.KC(), a.VC(), a.L(), 4);
             }),
             {"append_kv: v_cache: expected memory disjoint from v (read by the op)"});
  EXPECT_EQ(a.kc, kc);
  EXPECT_EQ(a.vc, vc);
}

TEST(Aliasing, MetadataOutputsApartFromTheirInputs) {
  // extend_write_slots with out over cu_seqlens_q (the review's write 81 elements past out).
  std::vector<int32_t> buf(16, 0), table{0, 1, 2, 3};
  int32_t* cu = buf.data() + 4;
  cu[0] = 0, cu[1] = 2, cu[2] = 3;
  std::vector<int32_t> prefix{1, 0};
  const std::vector<int32_t> kept = buf;
  expect_has(error_of([&] {
               extend_write_slots(TensorView(table.data(), DType::int32, Device::cpu(), {2, 2}),
                                  TensorView(prefix.data(), DType::int32, Device::cpu(), {2}),
                                  TensorView(cu, DType::int32, Device::cpu(), {3}), 4,
                                  TensorView(buf.data() + 3, DType::int32, Device::cpu(), {3}));
             }),
             {"extend_write_slots", "out", "cu_seqlens_q"});
  EXPECT_EQ(buf, kept);
  // decode_write_slots over its page table; cumsum_lengths shifted over its input.
  std::vector<int32_t> lens{3, 5};
  expect_has(error_of([&] {
               decode_write_slots(TensorView(table.data(), DType::int32, Device::cpu(), {2, 2}),
                                  TensorView(lens.data(), DType::int32, Device::cpu(), {2}), 4, 1,
                                  TensorView(table.data() + 1, DType::int32, Device::cpu(), {2}));
             }),
             {"decode_write_slots", "out", "page_table"});
  std::vector<int32_t> sums{2, 3, 4, 0};
  expect_has(error_of([&] {
               cumsum_lengths(TensorView(sums.data(), DType::int32, Device::cpu(), {3}),
                              TensorView(sums.data(), DType::int32, Device::cpu(), {4}));
             }),
             {"cumsum_lengths", "out", "lengths"});
  EXPECT_EQ(sums, (std::vector<int32_t>{2, 3, 4, 0}));
  EXPECT_EQ(table, (std::vector<int32_t>{0, 1, 2, 3}));
  // gather_page_table_with_padding with out over req_to_page.
  Gather g;
  const std::vector<int32_t> r2p = g.r2p;
  expect_has(error_of([&] {
               gather_page_table_with_padding(view(g.r2p, DType::int32, {4, 8}), view(g.idx, DType::int32, {3}),
                                              view(g.lens, DType::int32, {3}),
                                              TensorView(g.r2p.data() + 8, DType::int32, Device::cpu(), {3, 8}), 3, 8,
                                              4);
             }),
             {"gather_page_table_with_padding", "out", "req_to_page"});
  EXPECT_EQ(g.r2p, r2p);
}

// clamp_seq_lens works in place (out starting at seq_lens; with repeat > 1 on the CPU,
// which writes backwards); a shifted overlap is an error.
TEST(Aliasing, ClampInPlaceOrApart) {
  std::vector<int32_t> r{1, 5, 0, 0, 0, 0};
  clamp_seq_lens(TensorView(r.data(), DType::int32, Device::cpu(), {2}), 2, 4, 3,
                 TensorView(r.data(), DType::int32, Device::cpu(), {6}));
  EXPECT_EQ(r, (std::vector<int32_t>{2, 2, 2, 4, 4, 4}));
  std::vector<int32_t> s{1, 7, 3, 0};
  clamp_seq_lens(TensorView(s.data(), DType::int32, Device::cpu(), {3}), 2,
                 TensorView(s.data(), DType::int32, Device::cpu(), {3}));
  EXPECT_EQ(s, (std::vector<int32_t>{2, 7, 3, 0}));
  expect_has(error_of([&] {
               clamp_seq_lens(TensorView(s.data(), DType::int32, Device::cpu(), {3}), 4,
                              TensorView(s.data() + 1, DType::int32, Device::cpu(), {3}));
             }),
             {"clamp_seq_lens", "out", "seq_lens"});
  EXPECT_EQ(s, (std::vector<int32_t>{2, 7, 3, 0}));
}

}  // namespace
