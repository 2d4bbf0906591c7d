// A tiny suite of every CUDA kernel family at small shapes, run by scripts/gpu.sh under
// compute-sanitizer (memcheck, racecheck, synccheck). Each case still checks its
// result against the oracle so it cannot pass by doing nothing.
#include <gtest/gtest.h>

#include <limits>

#include "gpu/ops/harness.h"
#include "oracle/merge_parts.h"

namespace gpu_test {
namespace {

TEST(Sanitizer, DecodeSplitsSinksWindow) {
  REQUIRE_GPU();
  AttnCase c = gpu_case();
  c.q_len_per_req = 2;
  c.kv_lens = {0, 1, 33, 300};
  c.window_left = 64;
  c.sinks = SinkMode::custom;
  c.custom_sinks = {0, 1, 2, 3, -std::numeric_limits<double>::infinity(), 5, 6, 7};
  for (int splits : {0, 1, 7}) {
    c.seed = 7000 + splits;
    check_case(c, splits);
  }
}

TEST(Sanitizer, DecodeFp8HeadDims) {
  REQUIRE_GPU();
  for (int D : {64, 256}) {
    AttnCase c = gpu_case();
    c.D = D;
    c.kv_dtype = DType::fp8_e4m3;
    c.k_scale = 0.37, c.v_scale = 2.5;
    c.kv_lens = {5, 130};
    c.seed = 7100 + D;
    check_case(c);
  }
}

TEST(Sanitizer, PrefillRaggedPrefixNonCausal) {
  REQUIRE_GPU();
  for (bool causal : {true, false}) {
    AttnCase c = gpu_case(/*decode=*/false);
    c.causal = causal;
    c.page_size = 3;
    c.kv_lens = {0, 70, 200, 3};
    c.q_lens = {0, 70, 45, 5};
    c.q_layout = c.out_layout = RowLayout::padded;
    c.row_pad = 8;
    c.seed = 7200 + causal;
    check_case(c);
  }
}

// The Hopper prefill's three producers: TMA (page 16, with a V tail past L and a cluster
// of two), the cp.async gather (page 3, above) and the fp8 staging (TMA and gather).
TEST(Sanitizer, PrefillProducers) {
  REQUIRE_GPU();
  int i = 0;
  for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
    for (int P : {16, 5}) {
      AttnCase c = gpu_case(/*decode=*/false);
      c.page_size = P;
      c.kv_dtype = kv;
      c.k_scale = kv == DType::fp8_e4m3 ? 0.37 : 1.0;
      c.kv_lens = {300, 129, 17};
      c.q_lens = {200, 129, 9};
      c.window_left = i == 1 ? 100 : -1;
      c.seed = 7250 + i++;
      check_case(c);
    }
  }
}

TEST(Sanitizer, AppendGatherMetadata) {
  REQUIRE_GPU();
  // append_kv bf16 and fp8 into a small pool, every byte against the oracle.
  check_append({DType::bf16, DType::bf16, 16, 128, 2, 20, CacheLayout::nhd4, false, 1.0f, 1.0f}, 7300);
  check_append({DType::bf16, DType::fp8_e4m3, 16, 128, 2, 20, CacheLayout::nhd4, false, 0.5f, 2.0f}, 7301);
  // gather + the four metadata helpers.
  std::vector<int32_t> r2p(5 * 8);
  for (size_t x = 8; x < r2p.size(); ++x) r2p[x] = static_cast<int32_t>(x);
  HostTensor t_r2p = make_tensor(DType::int32, {5, 8});
  std::copy(r2p.begin(), r2p.end(), t_r2p.typed<int32_t>());
  const HostTensor lens = make_int32({17, 1, 128}), table = make_tensor(DType::int32, {3, 8});
  const HostTensor cu = make_tensor(DType::int32, {4}), clamped = make_tensor(DType::int32, {3});
  const HostTensor dslots = make_tensor(DType::int32, {6}), eslots = make_tensor(DType::int32, {146});
  DeviceMirror dev;
  pagedmha::gather_page_table_with_padding(dev.view(t_r2p), dev.view(make_int32({2, 0, 4})), dev.view(lens),
                                           dev.view(table), 3, 8, 16);
  pagedmha::cumsum_lengths(dev.view(lens), dev.view(cu));
  pagedmha::clamp_seq_lens(dev.view(lens), 2, dev.view(clamped));
  pagedmha::decode_write_slots(dev.view(table), dev.view(lens), 16, 2, dev.view(dslots));
  pagedmha::extend_write_slots(dev.view(table), dev.view(make_int32({0, 0, 0})), dev.view(cu), 16, dev.view(eslots));
  for (const HostTensor* t : {&table, &cu, &clamped, &dslots, &eslots}) dev.download(*t);
  std::vector<int32_t> expect(24, -1);
  oracle::gather_page_table(r2p, 8, {2, 0, 4}, {17, 1, 128}, expect, 8, 3, 8, 16);
  EXPECT_EQ(int_values(table), expect);
  EXPECT_EQ(int_values(cu), (std::vector<int32_t>{0, 17, 18, 146}));
  EXPECT_EQ(int_values(clamped), oracle::clamp_seq_lens({17, 1, 128}, 2));
  EXPECT_EQ(int_values(dslots), oracle::decode_write_slots(expect, 8, {17, 1, 128}, 16, 2));
  EXPECT_EQ(int_values(eslots), oracle::extend_write_slots(expect, 8, {0, 0, 0}, {0, 17, 18, 146}, 16));
}

// merge_attention_states out of place and in place (out = o[1], out_lse = lse[1]: the
// block barrier orders every read of lse[1] before its overwrite), against the formula.
TEST(Sanitizer, MergeInPlace) {
  REQUIRE_GPU();
  const std::vector<double> sinks{0.5, -std::numeric_limits<double>::infinity()};
  HostTensor sink_t = make_tensor(DType::fp32, {2});
  sink_t.typed<float>()[0] = 0.5f;
  sink_t.typed<float>()[1] = -std::numeric_limits<float>::infinity();
  for (bool in_place : {false, true}) {
    const Parts parts = random_parts(33, 2, 128, 3, DType::bf16, 7400 + in_place);
    std::vector<double> ref_o, ref_lse;
    reference_merge(parts.o, parts.lse, &sinks, ref_o, ref_lse);
    const HostTensor out = in_place ? part_of(parts.o, 1) : make_tensor(DType::bf16, {33, 2, 128});
    const HostTensor out_lse = in_place ? part_of(parts.lse, 1) : make_tensor(DType::fp32, {33, 2});
    DeviceMirror dev;
    pagedmha::merge_attention_states(dev.view(parts.o), dev.view(parts.lse), dev.view(out), dev.view(out_lse),
                                     dev.view(sink_t));
    dev.download(out);
    dev.download(out_lse);
    EXPECT_TRUE(check_merge(out, &out_lse, ref_o, ref_lse)) << "in_place=" << in_place;
  }
}

}  // namespace
}  // namespace gpu_test
