// merge_attention_states on CUDA: parts from the fp64 oracle over split keys merged on
// the device and checked against the oracle over the union (as tests/cpu/merge does on
// the CPU), in place, empty parts holding NaN, K = 0, and a large synthetic case (grid-
// stride loop, many parts) against the merge formula in fp64.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu/ops/harness.h"
#include "oracle/merge_parts.h"

namespace gpu_test {
namespace {

AttnCase merge_case(bool decode, uint64_t seed) {
  AttnCase c = gpu_case(decode);
  c.seed = seed;
  if (decode) {
    c.kv_lens = {0, 1, 37, 300};
  } else {
    c.q_lens = {5, 0, 40, 9};
    c.kv_lens = {5, 3, 200, 40};
  }
  return c;
}

// Merges `parts` on the GPU (sinks to the merge when sinks_in_merge) into fresh outputs
// and checks them against the oracle over all keys.
void gpu_merge_and_check(const AttnProblem& p, const Parts& parts, bool sinks_in_merge, const std::string& what) {
  AttnProblem r = with_merge_outputs(p, parts.o.dtype);
  r.c.name = what;
  DeviceMirror dev;
  const TensorView sinks = sinks_in_merge && p.c.sinks != SinkMode::none ? dev.view(p.sinks) : TensorView{};
  try {
    pagedmha::merge_attention_states(dev.view(parts.o), dev.view(parts.lse), dev.view(r.out), dev.view(r.lse), sinks);
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << e.what();
    return;
  }
  dev.download(r.out);
  dev.download(r.lse);
  EXPECT_TRUE(check_attention(r, p.reference(), merge_tolerance(parts.o.dtype)));
}

TEST(GpuMerge, OracleSplits) {
  REQUIRE_GPU();
  const SplitKind kinds[] = {SplitKind::ranges, SplitKind::pages, SplitKind::tokens, SplitKind::one_part,
                             SplitKind::random_keys};
  const DType dtypes[] = {DType::bf16, DType::fp16, DType::fp32};
  int i = 0;
  for (bool decode : {true, false})
    for (SplitKind kind : kinds)
      for (int K : {1, 2, 5}) {
        AttnCase c = merge_case(decode, 8000 + i);
        c.window_left = i % 3 == 1 ? 50 : -1;
        c.sinks = i % 2 ? SinkMode::mixed : SinkMode::none;
        c.D = i % 3 == 0 ? 64 : (i % 3 == 1 ? 128 : 256);
        const DType dtype = dtypes[i % 3];
        const AttnProblem p = build(c);
        const KeySplit split = make_split(p, kind, K, 11 * i + 3);
        const std::string what = describe(c) + " split=" + split_name(kind) + " K=" + std::to_string(K) +
                                 " parts=" + pagedmha::dtype_name(dtype);
        gpu_merge_and_check(p, oracle_parts(p, K, split, dtype, -1, i % 2 ? 8 : 0), true, what + " sinks in merge");
        if (c.sinks != SinkMode::none) {
          gpu_merge_and_check(p, oracle_parts(p, K, split, dtype, 0), false, what + " sinks in part 0");
        }
        ++i;
      }
}

TEST(GpuMerge, EmptyPartsAndNoParts) {
  REQUIRE_GPU();
  for (SinkMode mode : {SinkMode::none, SinkMode::mixed}) {
    AttnCase c = merge_case(true, 8100);
    c.sinks = mode;
    const AttnProblem p = build(c);
    Parts parts = oracle_parts(p, 4, [](int, int) { return 2; }, DType::bf16, -1);
    poison_empty_parts(parts);
    gpu_merge_and_check(p, parts, true, "3 empty parts holding NaN");
    c.kv_lens = {0, 0};
    const AttnProblem q = build(c);
    for (int K : {0, 2}) {
      Parts none = oracle_parts(q, K, [](int, int) { return 0; }, DType::fp16, -1);
      poison_empty_parts(none);
      gpu_merge_and_check(q, none, true, "no key, K=" + std::to_string(K));
    }
  }
}

TEST(GpuMerge, InPlace) {
  REQUIRE_GPU();
  AttnCase c = merge_case(false, 8200);
  c.sinks = SinkMode::mixed;
  const AttnProblem p = build(c);
  for (DType dtype : {DType::bf16, DType::fp32}) {
    for (int k : {0, 2}) {
      const Parts parts = oracle_parts(p, 3, make_split(p, SplitKind::pages, 3, 5), dtype, -1, 8);
      const HostTensor out = part_of(parts.o, k), out_lse = part_of(parts.lse, k);
      DeviceMirror dev;
      pagedmha::merge_attention_states(dev.view(parts.o), dev.view(parts.lse), dev.view(out), dev.view(out_lse),
                                       dev.view(p.sinks));
      dev.download(parts.o);
      dev.download(parts.lse);
      AttnProblem r = with_merge_outputs(p, dtype);
      r.c.name = std::string("in place into part ") + std::to_string(k) + " " + pagedmha::dtype_name(dtype);
      copy_merged(r, out, out_lse);
      EXPECT_TRUE(check_attention(r, p.reference(), merge_tolerance(dtype)));
    }
  }
}

TEST(GpuMerge, LargeSyntheticAgainstFormula) {
  REQUIRE_GPU();
  std::vector<double> sinks(16);
  HostTensor sink_t = make_tensor(DType::fp32, {16});
  for (int h = 0; h < 16; ++h) {
    sinks[h] = h % 4 == 0 ? -std::numeric_limits<double>::infinity() : h - 8.0;
    sink_t.typed<float>()[h] = static_cast<float>(sinks[h]);
  }
  struct Case {
    DType dtype;
    int K, D;
    int64_t R;
  };
  // The first: 1.1M items of 16 threads, 16 per block: more blocks than the grid cap.
  const Case cases[] = {{DType::fp32, 1, 64, 70000},
                        {DType::bf16, 2, 256, 2000},
                        {DType::fp16, 8, 128, 1000},
                        {DType::bf16, 33, 64, 300}};
  int i = 0;
  for (const Case& cs : cases) {
    const Parts parts = random_parts(cs.R, 16, cs.D, cs.K, cs.dtype, 8300 + i++, 0.25, 30.0);
    HostTensor out = make_tensor(cs.dtype, {cs.R, 16, cs.D}), out_lse = make_tensor(DType::fp32, {cs.R, 16});
    DeviceMirror dev;
    pagedmha::merge_attention_states(dev.view(parts.o), dev.view(parts.lse), dev.view(out), dev.view(out_lse),
                                     dev.view(sink_t));
    dev.download(out);
    dev.download(out_lse);
    std::vector<double> ref_o, ref_lse;
    reference_merge(parts.o, parts.lse, &sinks, ref_o, ref_lse);
    EXPECT_TRUE(check_merge(out, &out_lse, ref_o, ref_lse))
        << pagedmha::dtype_name(cs.dtype) << " K=" << cs.K << " D=" << cs.D << " R=" << cs.R;
  }
}

TEST(GpuMerge, ValidationOnDevice) {
  REQUIRE_GPU();
  // CUDA views must be 16-byte aligned (vector loads); a CPU sinks tensor is a device error.
  const Parts parts = random_parts(4, 2, 64, 2, DType::bf16, 8400);
  HostTensor out = make_tensor(DType::bf16, {4, 2, 64});
  DeviceMirror dev;
  TensorView o = dev.view(parts.o);
  o.data = static_cast<uint8_t*>(o.data) + 2;
  o.shape[0] = 1;
  try {
    pagedmha::merge_attention_states(o, dev.view(parts.lse).slice(0, 0, 1), dev.view(out));
    ADD_FAILURE() << "misaligned o accepted";
  } catch (const pagedmha::Error& e) {
    EXPECT_NE(std::string(e.what()).find("16-byte"), std::string::npos) << e.what();
  }
  HostTensor sinks = make_tensor(DType::fp32, {2});
  try {
    pagedmha::merge_attention_states(dev.view(parts.o), dev.view(parts.lse), dev.view(out), {}, sinks.view());
    ADD_FAILURE() << "CPU sinks accepted";
  } catch (const pagedmha::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sinks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gpu_test
