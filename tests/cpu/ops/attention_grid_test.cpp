// The TESTING.md grid on the CPU path: every case is checked against the fp64 oracle.
// The grid is sampled, not a Cartesian product: each case rotates through head dims,
// GQA ratios, page sizes, dtypes, windows, sinks and layouts with co-prime periods,
// and every batch mixes lengths at tile and page edges (0, 1, 63..65, 127..129, ...).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "oracle/test_util.h"

namespace {

using pagedmha::DType;
using namespace ptest;

struct Gqa {
  int hq, hkv;
};
// Groups 1, 2, 4, 5, 6, 7 (Hkv = 1), 8, 16 (Hkv = 1), 3 and a large ratio (64).
const std::vector<Gqa> kGqa = {{4, 4}, {8, 4}, {8, 2}, {10, 2}, {12, 2}, {7, 1}, {16, 2}, {16, 1}, {6, 2}, {64, 1}};
const std::vector<int> kHeadDims = {64, 128, 256};
const std::vector<int> kPageSizes = {1, 3, 16, 32, 64, 128, 256};
const std::vector<int> kWindows = {-1, 0, 1, 127, 128, 4095};
struct DTypes {
  DType q, kv;
};
const std::vector<DTypes> kDTypes = {{DType::bf16, DType::bf16}, {DType::fp16, DType::fp16}, {DType::bf16, DType::fp8_e4m3}};
const std::vector<SinkMode> kSinks = {SinkMode::none, SinkMode::mixed, SinkMode::extreme};
const std::vector<CacheLayout> kLayouts = {CacheLayout::nhd3, CacheLayout::nhd4, CacheLayout::hnd4, CacheLayout::interleaved};
const std::vector<RowLayout> kRowLayouts = {RowLayout::contiguous, RowLayout::fused, RowLayout::transposed};

const char* dtype_tag(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    case DType::fp8_e4m3: return "fp8";
    default: return "x";
  }
}

/// The shared parameters of case i (co-prime periods spread the combinations).
AttnCase rotate(int i, const std::string& mode) {
  AttnCase c;
  const Gqa g = kGqa[i % kGqa.size()];
  c.Hq = g.hq, c.Hkv = g.hkv;
  c.D = kHeadDims[i % 3];
  c.page_size = kPageSizes[i % 7];
  const DTypes dt = kDTypes[(i / 3 + i) % 3];
  c.q_dtype = dt.q, c.kv_dtype = dt.kv;
  if (c.kv_dtype == DType::fp8_e4m3) c.k_scale = 0.37, c.v_scale = 2.5, c.outlier_gain = 20;
  if (c.kv_dtype == DType::fp8_e4m3 && i % 4 == 1) c.q_dtype = DType::fp8_e4m3, c.q_scale = 0.05;  // fp8 queries
  c.window_left = kWindows[(i / 2 + i) % 6];
  c.sinks = kSinks[(i / 4 + i) % 3];
  c.soft_cap = i % 5 == 2 ? 30.0 : 0.0;
  c.layout = kLayouts[(i / 5 + i) % 4];
  c.q_layout = kRowLayouts[i % 3 == 1 ? 1 : (i % 4 == 3 ? 2 : 0)];
  c.out_layout = kRowLayouts[(i + 1) % 3 == 1 ? 1 : (i % 7 == 2 ? 2 : 0)];
  c.with_lse = i % 11 != 4;              // lse is optional
  c.extra_cols = i % 4 == 0 ? 0 : 2;     // some tables exactly ceil(L / P) wide
  c.seed = 1000 + i;
  c.name = mode + std::to_string(i) + "_D" + std::to_string(c.D) + "_H" + std::to_string(c.Hq) + "x" +
           std::to_string(c.Hkv) + "_P" + std::to_string(c.page_size) + "_" + dtype_tag(c.q_dtype) +
           dtype_tag(c.kv_dtype) + "_W" + (c.window_left < 0 ? std::string("none") : std::to_string(c.window_left)) +
           "_" + layout_name(c.layout) + (c.sinks == SinkMode::none ? "" : (c.sinks == SinkMode::mixed ? "_sinks" : "_xsinks")) +
           (c.soft_cap > 0 ? "_cap" : "") + (c.with_lse ? "" : "_nolse");
  return c;
}

/// KV lengths of one batch: tile edges, page edges (exactly on and mid page), long,
/// and around the window (before, at, just beyond, far beyond).
std::vector<int> kv_lengths(const AttnCase& c, int min_len, std::mt19937& rng) {
  const int P = c.page_size;
  std::vector<int> l = {0, 1, 63, 64, 65, 127, 128, 129, 2 * P, 3 * P + P / 2 + 1, 1031};
  if (c.window_left == 4095) l = {1, 129, 4096, 4097, 5003};
  for (auto& x : l) x = std::max(x, min_len);
  std::shuffle(l.begin(), l.end(), rng);
  // Keep the big-ratio and D=256 cases cheap.
  if (c.Hq * c.D >= 4096) l.resize(6);
  return l;
}

std::vector<AttnCase> decode_cases() {
  std::vector<AttnCase> v;
  for (int i = 0; i < 30; ++i) {
    AttnCase c = rotate(i, "decode");
    std::mt19937 rng(i);
    c.kv_lens = kv_lengths(c, 0, rng);
    v.push_back(c);
  }
  // One long request (32k) with a window and sinks, and one with 1024-token pages.
  AttnCase l = rotate(3, "decode32k");
  l.name = "decode32k_P16_W4095_sinks", l.Hq = 8, l.Hkv = 1, l.D = 128, l.page_size = 16, l.window_left = 4095;
  l.kv_lens = {32768, 32767, 1};
  l.sinks = SinkMode::mixed;
  v.push_back(l);
  AttnCase l2 = rotate(4, "decode32k_full");
  l2.name = "decode32k_P64_nowindow", l2.Hq = 4, l2.Hkv = 1, l2.D = 64, l2.page_size = 64, l2.window_left = -1;
  l2.kv_lens = {32768};
  v.push_back(l2);
  // 256 rows: short real requests mixed with padded rows (seq_len 0 or 1).
  AttnCase wide = rotate(6, "decode256");
  std::mt19937 rng(256);
  for (int b = 0; b < 256; ++b) wide.kv_lens.push_back(b % 9 == 0 ? static_cast<int>(b % 2) : 1 + rng() % 150);
  wide.name = "decode256rows_" + wide.name.substr(wide.name.find('_') + 1);
  v.push_back(wide);
  AttnCase p = rotate(5, "decode_page1024");
  p.name = "decode_page1024", p.page_size = 1024, p.kv_lens = {1023, 1024, 1025, 3000, 0}, p.window_left = 1500;
  v.push_back(p);
  return v;
}

std::vector<AttnCase> verify_cases() {
  std::vector<AttnCase> v;
  for (int i = 0; i < 14; ++i) {
    AttnCase c = rotate(i + 7, "verify");
    c.q_len_per_req = 2 + i % 7;  // 2..8
    std::mt19937 rng(100 + i);
    c.kv_lens = kv_lengths(c, 0, rng);
    c.kv_lens.push_back(c.q_len_per_req - 1);  // fewer keys than queries
    c.kv_lens.push_back(c.q_len_per_req);      // exactly the queries
    c.name = "verify" + std::to_string(c.q_len_per_req) + "_" + c.name.substr(c.name.find('_') + 1);
    v.push_back(c);
  }
  return v;
}

/// Ragged prefill: query lengths at tile edges, prefix 0 (plain prefill), a short
/// prefix or one beyond the window; one request with more queries than keys.
std::vector<AttnCase> prefill_cases(const std::string& mode, int count, int first) {
  std::vector<AttnCase> v;
  for (int i = 0; i < count; ++i) {
    AttnCase c = rotate(first + i, mode);
    c.decode = false;
    if (c.Hq * c.D >= 4096) c.Hq = c.Hkv * std::min(c.Hq / c.Hkv, 4);  // keep the oracle cheap
    std::mt19937 rng(200 + first + i);
    std::vector<int> qlens = {1, 63, 64, 65, 128, 129, 17};
    std::shuffle(qlens.begin(), qlens.end(), rng);
    qlens.resize(4);
    for (size_t b = 0; b < qlens.size(); ++b) {
      int prefix = 0;
      if (mode != "prefill") prefix = std::vector<int>{5, 300, 0, c.page_size}[(b + i) % 4];
      if (mode == "prefill" && b == 0) prefix = 0;
      c.q_lens.push_back(qlens[b]);
      c.kv_lens.push_back(prefix + qlens[b]);
    }
    if (mode == "prefix") {  // queries before the first key, and an empty request
      c.q_lens.push_back(5), c.kv_lens.push_back(3);
      c.q_lens.push_back(0), c.kv_lens.push_back(7);
    }
    if (mode == "noncausal") c.causal = false;
    c.Hq = std::max(c.Hq, c.Hkv);
    c.name = mode + "_" + c.name.substr(c.name.find('_') + 1);
    v.push_back(c);
  }
  return v;
}

std::vector<AttnCase> all_prefill_cases() {
  std::vector<AttnCase> v = prefill_cases("prefill", 16, 0);
  for (auto& c : prefill_cases("prefix", 14, 16)) v.push_back(c);
  for (auto& c : prefill_cases("noncausal", 8, 30)) v.push_back(c);
  AttnCase big = rotate(1, "prefill1k");  // one 1k causal prompt (a whole tile sweep)
  big.decode = false, big.Hq = 8, big.Hkv = 2, big.D = 128, big.page_size = 16, big.window_left = -1;
  big.q_lens = {1024}, big.kv_lens = {1024};
  big.name = "prefill1k_P16_bf16";
  big.q_dtype = big.kv_dtype = DType::bf16, big.k_scale = big.v_scale = 1, big.outlier_gain = 0;
  v.push_back(big);
  return v;
}

class AttentionGrid : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionGrid, MatchesOracle) {
  const AttnProblem p = build(GetParam());
  run_cpu(p);
  EXPECT_TRUE(check_attention(p, p.reference()));
}

// Test names are the cases' names (PrintTo in paged_problem.h).
INSTANTIATE_TEST_SUITE_P(Decode, AttentionGrid, ::testing::ValuesIn(decode_cases()),
                         ::testing::PrintToStringParamName());
INSTANTIATE_TEST_SUITE_P(Verify, AttentionGrid, ::testing::ValuesIn(verify_cases()),
                         ::testing::PrintToStringParamName());
INSTANTIATE_TEST_SUITE_P(Prefill, AttentionGrid, ::testing::ValuesIn(all_prefill_cases()),
                         ::testing::PrintToStringParamName());

}  // namespace
