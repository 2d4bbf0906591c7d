// batch_prefill on CUDA (ragged queries, cached prefixes, non-causal, windows, sinks,
// soft-cap, lse) against the fp64 oracle, with poisoning.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/arch.h"
#include "cuda/prefill_sm90/policy.h"
#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// (prefix, extend) pairs: no prefix, prefix mid-page, prefix on a page edge, empty
// queries, an empty request, and more queries than keys (n > L: first queries see none;
// with 300 queries over 2 keys whole query tiles see no key, which the Hopper consumers
// meet with the previous item's last P V still pending).
AttnCase ragged(int P, uint64_t seed) {
  AttnCase c = gpu_case(/*decode=*/false);
  c.page_size = P;
  const int prefix[] = {0, 5, P, 0, 0, 130, 64};
  const int extend[] = {77, 1, 65, 0, 0, 190, 128};
  for (int i = 0; i < 7; ++i) {
    c.kv_lens.push_back(prefix[i] + extend[i]);
    c.q_lens.push_back(extend[i]);
  }
  c.kv_lens.push_back(3);  // n > L
  c.q_lens.push_back(9);
  c.kv_lens.push_back(2);  // n >> L: query tiles without keys
  c.q_lens.push_back(300);
  c.seed = seed;
  return c;
}

TEST(GpuPrefill, HeadDimsGroupsPageSizes) {
  REQUIRE_GPU();
  const int heads[][2] = {{8, 8}, {8, 2}, {10, 2}, {12, 2}, {14, 2}, {16, 1}, {64, 1}};
  const int pages[] = {1, 3, 16, 32, 64, 128, 256};
  const CacheLayout layouts[] = {CacheLayout::nhd4, CacheLayout::nhd3, CacheLayout::hnd4, CacheLayout::interleaved};
  int i = 0;
  for (int D : {64, 128, 256}) {
    for (const auto& h : heads) {
      AttnCase c = ragged(pages[i % 7], 2000 + i);
      c.Hq = h[0], c.Hkv = h[1];
      c.D = D;
      c.layout = layouts[i % 4];
      ++i;
      check_case(c);
    }
  }
}

TEST(GpuPrefill, FeaturesAndDtypes) {
  REQUIRE_GPU();
  int i = 0;
  for (int W : {-1, 0, 1, 127, 128}) {
    for (int variant = 0; variant < 4; ++variant) {
      AttnCase c = ragged(variant == 3 ? 3 : 16, 2100 + i++);
      c.window_left = W;
      c.causal = variant != 1;
      if (variant >= 1) {
        c.sinks = SinkMode::custom;
        c.custom_sinks = {-kInf, 0.0, 3.0, 20.0, -1.0, 1.0, 80.0, -80.0};
      }
      if (variant == 2) {
        c.soft_cap = 20.0;
        c.sm_scale = 0.5;
      }
      if (variant == 3) {
        c.q_dtype = c.kv_dtype = DType::fp16;
        c.q_layout = c.out_layout = RowLayout::padded;
        c.row_pad = 24;
        c.with_lse = false;
      }
      c.release_window_pages = W >= 0 && variant == 0;
      check_case(c);
    }
  }
}

// Every head dim: on Hopper D = 128 converts in place, D = 64 and 256 through staging
// slots, and a bf16 query is loaded by TMA and converted to fp16 in shared memory (with
// Hq 10 / Hkv 2 the five packed heads leave rows past the tile's tokens).
TEST(GpuPrefill, Fp8CacheAndHnd) {
  REQUIRE_GPU();
  int i = 0;
  for (int D : {64, 128, 256}) {
    for (DType q : {DType::bf16, DType::fp16}) {
      for (CacheLayout layout : {CacheLayout::nhd4, CacheLayout::hnd4}) {
        AttnCase c = ragged(layout == CacheLayout::hnd4 ? 32 : 64, 2200 + i++);
        c.D = D;
        if (D != 128) c.Hq = 10, c.Hkv = 2;
        c.q_dtype = q;
        c.kv_dtype = DType::fp8_e4m3;
        c.k_scale = 0.37, c.v_scale = 2.5;
        c.outlier_gain = 20.0;
        c.layout = layout;
        check_case(c);
      }
      // One query row with row stride 0 (legal for a dimension of size 1): Q cannot go by
      // TMA, so the producer copies it with cp.async and converts a bf16 one in place.
      AttnCase c = gpu_case(/*decode=*/false);
      c.kv_lens = {300};
      c.q_lens = {1};
      c.D = D;
      c.q_dtype = q;
      c.kv_dtype = DType::fp8_e4m3;
      c.k_scale = 0.37, c.v_scale = 2.5;
      c.q_layout = RowLayout::degenerate;
      c.seed = 2300 + i++;
      check_case(c);
    }
  }
}

// Longer requests: a 2k prompt, and a 512-token chunk after a 3k prefix with a window.
TEST(GpuPrefill, OverflowingLogitsNeverNaN) {
  REQUIRE_GPU();
  AttnCase c = gpu_case(false);
  c.kv_lens = {1, 70, 300};
  c.q_lens = {1, 70, 200};
  c.seed = 530;
  // On Hopper references past 2^20 take the speculative softmax's recompute (fp8 KV at
  // D = 64, 16-bit KV at D = 128) and step()'s rare path in both of its forms (policy.h
  // kSoftmaxOneCopy: one copy at D = 128, its own copy at D = 64 and 256).
  for (int d : {64, 128, 256}) {
    for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
      c.causal = true, c.soft_cap = 0.0;
      check_overflowing_logits(c, 0, kv, d);
      c.causal = false;
      check_overflowing_logits(c, 0, kv, d);
      c.soft_cap = 30.0;
      check_overflowing_logits(c, 0, kv, d);
    }
  }
}

TEST(GpuPrefill, LongerPromptsAndChunks) {
  REQUIRE_GPU();
  AttnCase c = gpu_case(/*decode=*/false);
  c.Hkv = 1;
  c.page_size = 64;
  c.kv_lens = {2048, 3584};
  c.q_lens = {2048, 512};
  c.seed = 2300;
  c.name = "2k prompt + 512 after 3k";
  check_case(c);
  c.window_left = 1023;
  c.release_window_pages = true;
  c.seed = 2301;
  c.name = "same, window 1023";
  check_case(c);
}

// D = 256 with 16-bit KV by TMA: launches of max_q_len <= 1024 take 64-key tiles, longer
// ones 80 (policy.h d256_tma_block_n). The same problem through both (the second with a
// loose host bound), then prompts past 1024, causal, windowed and non-causal.
TEST(GpuPrefill, HeadDim256BothKeyTiles) {
  REQUIRE_GPU();
  AttnCase c = gpu_case(/*decode=*/false);
  c.Hq = 16, c.Hkv = 8, c.D = 256;
  c.kv_lens = {1000, 1700, 333, 81};
  c.q_lens = {1000, 600, 333, 80};
  c.seed = 2800;
  c.name = describe(c) + " 64-key tiles";
  AttnProblem p = build(c);
  ASSERT_LE(p.max_q_len, 1024);
  const Reference ref = p.reference();
  if (run_gpu_or_fail(p, c.name)) EXPECT_TRUE(check_attention(p, ref)) << c.name;
  p.max_q_len = 1025;
  fill_poison(*p.out.storage, p.out.dtype);  // the first run's results must not survive
  if (p.c.with_lse) fill_poison(*p.lse.storage, p.lse.dtype);
  c.name = describe(c) + " 80-key tiles (max_q_len 1025)";
  if (run_gpu_or_fail(p, c.name)) EXPECT_TRUE(check_attention(p, ref)) << c.name;
  c.name = AttnCase().name;  // check_case names the cases below from their fields
  // Page 48: no box of the 64-key tile fits (48 rows, not a power of two), so a short
  // launch falls back to the 80-key tile's 16-row boxes.
  c.page_size = 48;
  c.seed = 2804;
  check_case(c);
  c.page_size = 16;
  c.kv_lens = {2500, 1299, 161};
  c.q_lens = {2500, 1100, 80};
  for (int mode = 0; mode < 3; ++mode) {  // causal, non-causal, causal with a window
    c.causal = mode != 1;
    c.window_left = mode == 2 ? 700 : -1;
    c.seed = 2801 + mode;
    check_case(c);
  }
  // Other pages past 1024 queries: 64 (16-row boxes of the 80-key tile), 8 (a box per
  // page) and 3 (the gather, whose tile is 64 keys whatever max_q_len says).
  c.causal = true, c.window_left = -1;
  c.kv_lens = {1400, 300};
  c.q_lens = {1100, 300};
  for (int P : {64, 8, 3}) {
    c.page_size = P;
    c.seed = 2810 + P;
    check_case(c);
  }
}

// AttentionParams::sm_margin (harness.h check_sm_margins): a persistent grid of fewer CTAs
// walks the same tiles, bitwise. Three launches: bf16 at D = 128 (pairs of tiles on the
// whole grid, single tiles on one CTA); D = 256 with a window and a soft-cap; gpt-oss's
// fp8 geometry with sinks, whose 192-row rule counts the grid's SMs (policy.h
// fp8_rows192_pays: 128 rows on the whole grid, 192 rows from 37 SMs left free). The
// 192-row tiles round a few elements differently (39 of 819,200 outputs and 74 of 12,800
// lse values on the H100, s31run1), so that launch is checked against the oracle only.
TEST(GpuPrefill, SmMarginKeepsResults) {
  REQUIRE_GPU();
  AttnCase c = gpu_case(/*decode=*/false);
  c.kv_lens = {1500, 700, 129};
  c.q_lens = {1500, 300, 129};
  c.with_lse = true;
  c.seed = 3101;
  check_sm_margins(c);
  c.Hq = 16, c.Hkv = 8, c.D = 256;
  c.kv_lens = {1200, 77};
  c.q_lens = {1100, 77};
  c.window_left = 500, c.soft_cap = 30.0;
  c.seed = 3103;
  check_sm_margins(c);
  c = gpu_case(/*decode=*/false);
  c.Hq = 64, c.Hkv = 8, c.D = 64;
  c.kv_dtype = DType::fp8_e4m3;
  c.sinks = SinkMode::mixed;
  c.kv_lens = {900, 400};
  c.q_lens = {100, 100};  // 112 tiles of 128 rows (16 tokens) or 80 of 192: one round on 132 SMs
  c.seed = 3102;
  check_sm_margins(c, /*bitwise=*/false);
}

// Runs problem p with a poisoned workspace, checks it against the oracle, and returns the
// Hopper plan read back from the workspace (hopper/schedule.cuh plan_kernel): its entries
// (request, first query row, rows from there, KV length), as many as its count says (none,
// with a failure, when the count does not fit the workspace).
std::vector<std::array<int32_t, 4>> run_reading_plan(AttnProblem& p, const std::string& name) {
  namespace sm90 = pagedmha::cuda::sm90;
  DeviceMirror dev;
  AttnViews v = dev.views(p);
  const Buffer ws = poisoned_workspace(p);
  v.workspace = ws.bytes_view();
  run_attention(p, v);
  pagedmha::synchronize();
  dev.download(p.out);
  dev.download(p.lse);
  EXPECT_TRUE(check_attention(p, p.reference())) << name;
  std::vector<uint8_t> bytes(ws.bytes());
  pagedmha::copy_bytes(bytes.data(), Device::cpu(), ws.data(), gpu(), ws.bytes());
  int count = 0;
  std::memcpy(&count, bytes.data(), 4);
  const int64_t list = sm90::PlanLayout::list_offset(p.batch);
  if (count < 0 || list + 16 * int64_t{count} > int64_t(bytes.size())) {
    ADD_FAILURE() << name << ": plan count " << count;
    return {};
  }
  std::vector<std::array<int32_t, 4>> entries(static_cast<size_t>(count));
  std::memcpy(entries.data(), bytes.data() + list, 16 * static_cast<size_t>(count));
  return entries;
}

// fp8 KV at D = 64 in 192-row tiles on three consumer warpgroups where the launch's
// rounds say they pay (policy.h fp8_rows192_pays, which depends on the SM count), else
// 128 rows on two. On this GPU: a long two-request launch the rule sends to 192 rows and
// a short one it does not, in gpt-oss's geometry (Hq 64, Hkv 8: 24 or 16 tokens a tile)
// and in a group of 5 (Hq 10, Hkv 2: 38 or 25 tokens, 192 rows not a multiple of the
// pack). The plan read back from the workspace shows which tile ran; both query dtypes,
// sinks, and a window with a soft-cap on the long launch.
TEST(GpuPrefill, Fp8HeadDim64BothQueryTiles) {
  REQUIRE_GPU();
  if (pagedmha::cuda::kernel_path(0) != pagedmha::cuda::KernelPath::sm90) GTEST_SKIP() << "no Hopper prefill";
  namespace sm90 = pagedmha::cuda::sm90;
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  int i = 0;
  for (const int hq : {64, 10}) {
    AttnCase c = gpu_case(/*decode=*/false);
    c.Hq = hq, c.Hkv = hq == 64 ? 8 : 2, c.D = 64;
    c.kv_dtype = DType::fp8_e4m3;
    c.k_scale = 0.37, c.v_scale = 2.5;
    c.sinks = SinkMode::mixed;
    const int pack = sm90::gqa_pack(c.Hq / c.Hkv);
    const auto takes_192 = [&](const std::vector<int>& q) {
      int rows = 0, longest = 0;
      for (int n : q) rows += n, longest = std::max(longest, n);
      const int head_units = c.Hkv * (c.Hq / c.Hkv / pack);
      return sm90::fp8_rows192_pays(rows, static_cast<int>(q.size()), longest, pack, head_units, sms);
    };
    // The first candidate the rule sends each way on this GPU (none with the knob at 0 or 2).
    std::vector<int> long_q, short_q;
    for (int n : {3000, 4000, 5000, 2000, 7000}) {  // two requests: request 1 starts at row n
      if (long_q.empty() && takes_192({n, 1000})) long_q = {n, 1000};
    }
    for (int n : {200, 100, 48, 16}) {
      if (short_q.empty() && !takes_192({n})) short_q = {n};
    }
    if (PAGEDMHA_SM90_FP8_WG3 == 1) {
      EXPECT_FALSE(long_q.empty()) << sms << " SMs, Hq " << hq;
      EXPECT_FALSE(short_q.empty()) << sms << " SMs, Hq " << hq;
    }
    for (DType q : {DType::bf16, DType::fp16}) {
      c.q_dtype = q;
      for (const bool longer : {true, false}) {
        const std::vector<int>& qs = longer ? long_q : short_q;
        if (qs.empty()) continue;
        c.q_lens = qs;
        c.kv_lens = qs;
        if (longer) c.kv_lens[1] += 500;  // a cached prefix
        c.window_left = -1, c.soft_cap = 0.0;
        c.seed = 3000 + i++;
        c.name = describe(c) + (longer ? " 192-row tiles" : " 128-row tiles");
        const int tokens = sm90::tokens_per_tile(longer ? 192 : 128, pack);
        AttnProblem p = build(c);
        std::vector<std::vector<int>> firsts(qs.size());  // each request's tiles' first rows
        for (const auto& x : run_reading_plan(p, c.name)) {
          const int b = x[0];
          if (x[2] > 0 && b >= 0 && b < static_cast<int>(qs.size())) firsts[b].push_back(x[1] - (b > 0 ? qs[0] : 0));
        }
        for (size_t b = 0; b < qs.size(); ++b) {
          std::sort(firsts[b].begin(), firsts[b].end());
          std::vector<int> want;
          for (int m = 0; m * tokens < qs[b]; ++m) want.push_back(m * tokens);
          EXPECT_EQ(firsts[b], want) << c.name << ": request " << b << "'s tiles of " << tokens << " tokens";
        }
        if (longer) {
          c.name = AttnCase().name;  // check_case names it from its fields
          c.window_left = 700, c.soft_cap = 30.0;
          c.seed = 3000 + i++;
          check_case(c);
        }
      }
    }
  }
}

// The Hopper plan (hopper/schedule.cuh plan_kernel) read back from the workspace: every
// query tile of the batch in exactly one entry, as pairs (tile n - 1 - j, then j) when
// the batch has policy.h kPlanPairRounds rounds of them for the grid, else as single
// tiles with empty partners, longest first (causal, no window: KV tiles ceil(hi / BN)).
// A batch of at least three rounds of pairs for a grid of one cluster per SM pair is pairs
// on any grid; a batch of one pair is single tiles by default (a library built with
// PAGEDMHA_SM90_PLAN_PAIR_ROUNDS=0 pairs it; this file may not see the knob: the mode is
// read from the plan's entry count, and required where this file sees the knob). The
// outputs against the oracle as well.
TEST(GpuPrefill, PlanPairsOrSingleTiles) {
  REQUIRE_GPU();
  if (pagedmha::cuda::kernel_path(0) != pagedmha::cuda::KernelPath::sm90) GTEST_SKIP() << "no Hopper prefill";
  namespace sm90 = pagedmha::cuda::sm90;
  using Pol = sm90::PrefillPolicy<128, false, true>;
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  AttnCase c = gpu_case(/*decode=*/false);
  c.Hq = 32, c.Hkv = 16, c.D = 128;  // group 2: clusters of two, one head each, 16 units per entry
  const int cluster = sm90::cluster_size(c.Hq / c.Hkv, true), pack = sm90::gqa_pack(c.Hq / c.Hkv / cluster);
  const int tokens = sm90::tokens_per_tile(Pol::kBlockM, pack);
  const int per_entry = c.Hkv * (c.Hq / c.Hkv / pack) / cluster;
  const int many = (3 * (sms / cluster) + per_entry - 1) / per_entry;  // pairs on any grid of these clusters
  ASSERT_LE(2 * many, 32) << "the adjacency check below needs every pair in one warp of the plan";
  static_assert(sm90::kPlanPairRounds <= 3, "a batch of 2 * many pairs is three rounds");
  for (bool big : {false, true}) {
    c.name = AttnCase().name;
    c.kv_lens.clear(), c.q_lens.clear();
    if (!big) {
      c.kv_lens = {2 * tokens + 40};  // two tiles: one pair
      c.q_lens = {2 * tokens};
    } else {
      for (int b = 0; b < many; ++b) {  // three tiles (two pairs) each, prefixes of 0 .. 40
        c.q_lens.push_back(3 * tokens - b % 5);
        c.kv_lens.push_back(c.q_lens.back() + 10 * (b % 5));
      }
    }
    c.seed = 2900 + big;
    c.name = describe(c) + (big ? " plan of many pairs" : " plan of one pair");
    AttnProblem p = build(c);
    const std::vector<std::array<int32_t, 4>> entries = run_reading_plan(p, c.name);
    const int count = static_cast<int>(entries.size());
    std::vector<int> cu(1, 0);
    for (int n : p.q_lens) cu.push_back(cu.back() + n);
    std::vector<std::vector<int>> seen(static_cast<size_t>(p.batch));
    int tiles = 0, pair_units = 0;
    for (int b = 0; b < p.batch; ++b) {
      const int t = (p.q_lens[b] + tokens - 1) / tokens;
      seen[b].assign(static_cast<size_t>(t), 0);
      tiles += t;
      pair_units += (t + 1) / 2;
    }
    const auto tile_of = [&](int e, int& b) {  // -1: empty, -2: not a tile of the batch
      const std::array<int32_t, 4>& x = entries[static_cast<size_t>(e)];
      b = x[0];
      if (x[2] <= 0) return -1;
      if (b < 0 || b >= p.batch || x[1] < cu[b] || x[1] >= cu[b + 1]) {
        ADD_FAILURE() << c.name << " entry " << e << ": request " << b << " row " << x[1];
        return -2;
      }
      const int m = (x[1] - cu[b]) / tokens;
      EXPECT_EQ(x[1], cu[b] + m * tokens) << c.name << " entry " << e;
      EXPECT_EQ(x[2], p.q_lens[b] - m * tokens) << c.name << " entry " << e;
      EXPECT_EQ(x[3], c.kv_lens[b]) << c.name << " entry " << e;
      return m;
    };
    // Pairs: ceil(t / 2) units per request; single tiles: t (the small batch tells them apart).
    const bool pairs = count == 2 * pair_units;
    ASSERT_TRUE(pairs || count == 2 * tiles) << c.name << ": count " << count;
    if (big) EXPECT_TRUE(pairs) << c.name;
    if (!big && sm90::kPlanPairRounds > 0) EXPECT_FALSE(pairs) << c.name;
    ASSERT_EQ(count % 2, 0) << c.name;
    int last_cost = 1 << 30;
    std::vector<int> first_unit(static_cast<size_t>(p.batch), -1), units_of(static_cast<size_t>(p.batch), 0);
    for (int e = 0; e < count; e += 2) {
      int b0 = 0, b1 = 0;
      const int m0 = tile_of(e, b0), m1 = tile_of(e + 1, b1);
      ASSERT_GE(m0, 0) << c.name << " entry " << e << ": a unit's first tile is never empty";
      ASSERT_GE(m1, -1) << c.name << " entry " << e + 1;
      ++seen[b0][m0];
      if (!pairs) {
        EXPECT_EQ(m1, -1) << c.name << " entry " << e + 1 << ": single tiles have empty partners";
        const int rows = std::min(p.q_lens[b0] - m0 * tokens, tokens);
        const int cost = (c.kv_lens[b0] - p.q_lens[b0] + m0 * tokens + rows + Pol::kBlockN - 1) / Pol::kBlockN;
        EXPECT_LE(cost, last_cost) << c.name << " entry " << e << ": longest first";
        last_cost = cost;
      } else {
        const int n = static_cast<int>(seen[b0].size());
        // A request's pairs are adjacent: one bucket per request, and places in pair order
        // within a warp (here every pair of the batch is in one warp of the plan CTA).
        if (first_unit[b0] < 0) first_unit[b0] = e / 2;
        EXPECT_EQ(e / 2, first_unit[b0] + units_of[b0]) << c.name << " entry " << e << ": request " << b0
                                                        << "'s pairs apart";
        ++units_of[b0];
        if (m1 >= 0) {
          EXPECT_EQ(b1, b0) << c.name << " entry " << e + 1;
          EXPECT_EQ(m0 + m1, n - 1) << c.name << " entry " << e << ": tile n - 1 - j with tile j";
          ++seen[b1][m1];
        } else {
          EXPECT_EQ(2 * m0, n - 1) << c.name << " entry " << e << ": only the middle tile goes alone";
        }
      }
    }
    for (int b = 0; b < p.batch; ++b)
      for (size_t m = 0; m < seen[b].size(); ++m) EXPECT_EQ(seen[b][m], 1) << c.name << " request " << b << " tile " << m;
  }
}

// A 128k context (TESTING.md's long case): queries at the end of a 128k prefix, a tail
// page ending mid-page, one request with an exact page edge, a window reaching far back.
TEST(GpuPrefill, Context128k) {
  REQUIRE_GPU();
  AttnCase c = gpu_case(/*decode=*/false);
  c.kv_lens = {131072 + 9, 131072};
  c.q_lens = {40, 17};
  c.seed = 2350;
  c.name = "128k context";
  check_case(c);
  c.window_left = 100000;
  c.release_window_pages = true;
  c.seed = 2351;
  c.name = "128k context, window 100000";
  check_case(c);
}

// docs/semantics.md section 2: with fp8 KV the Hopper prefill runs its GEMMs in fp16, so
// bf16 query entries beyond 65504 saturate there; the portable kernels keep them
// (check_queries_past_fp16_range).
TEST(GpuPrefill, Fp8KvQueriesPastFp16RangeSaturateOnHopper) {
  REQUIRE_GPU();
  const bool hopper = pagedmha::cuda::kernel_path(0) == pagedmha::cuda::KernelPath::sm90;
  for (int D : {64, 128}) {
    AttnCase c = gpu_case(/*decode=*/false);
    c.Hq = 4, c.Hkv = 1, c.D = D;
    c.kv_lens = {300, 200};
    c.q_lens = {300, 60};
    c.seed = 2600 + D;
    check_queries_past_fp16_range(c, hopper);
  }
}

// Logits that jump by 96 nats (138 in log2 units) between some 128-key tiles. The Hopper
// kernels run an item's tiles last first, so such a step moves a row's reference by more
// than 64: where the softmax speculates (prefill_sm90/policy.h kSpecSoftmax: fp8 KV at
// D = 64), the warp recomputes its S from the cache (consumer.cuh recompute_s), by TMA
// and by the gather (page 3). Dims below 16 carry the rise (k = kRise[tiles from the
// end], exact in e4m3), for even heads only (q = 1 there, 0 for odd heads): the warps
// that recompute also hold rows whose result depends on every tile. The rise steps up
// twice and stays flat between, so speculative steps follow each recompute; with a
// window the recomputed tiles are boundary tiles (masked after the recompute). The rest
// of the dims keep their random values, so the softmax within a tile is not flat.
TEST(GpuPrefill, LogitJumpsBetweenKeyTiles) {
  REQUIRE_GPU();
  constexpr double kRise[] = {0, 6, 6, 12, 12, 12};
  int i = 0;
  for (int D : {64, 128}) {
    for (DType kv : {DType::fp8_e4m3, DType::bf16}) {
      for (int P : {16, 3}) {
        for (int mode = 0; mode < 3; ++mode) {  // causal, non-causal, causal with a window
          AttnCase c = gpu_case(/*decode=*/false);
          c.Hq = 8, c.Hkv = 2, c.D = D, c.page_size = P;
          c.kv_dtype = kv;
          c.kv_lens = {700, 300};  // 6 and 3 key tiles
          c.q_lens = {700, 45};
          c.sm_scale = 1.0;
          c.causal = mode != 1;
          if (mode == 2) c.window_left = 200, c.release_window_pages = true;
          c.seed = 2700 + i++;
          c.name = describe(c) + " logit jumps";
          AttnProblem p = build(c);
          for (int64_t r = 0; r < p.q.shape[0]; ++r)
            for (int h = 0; h < c.Hq; ++h)
              for (int d = 0; d < 16; ++d) p.q.set({r, h, d}, h % 2 == 0 ? 1.0 : 0.0);
          const oracle::Format f = format_of(p.kv.dtype);
          for (int b = 0; b < p.batch; ++b) {
            const int L = c.kv_lens[b], tiles = (L + 127) / 128;
            // Pages wholly before the window went back to the pool (build): not this request's.
            const int first = c.window_left >= 0 ? std::max(0, L - p.q_lens[b] - c.window_left) / P * P : 0;
            for (int j = first; j < L; ++j)
              for (int h = 0; h < c.Hkv; ++h)
                for (int d = 0; d < 16; ++d) oracle::store(f, kRise[tiles - 1 - j / 128], p.kv.kp(p.slots[b][j], h, d));
          }
          const Reference ref = p.reference(/*from_cache=*/true);
          if (!run_gpu_or_fail(p, c.name)) continue;
          EXPECT_TRUE(check_attention(p, ref)) << c.name;
        }
      }
    }
  }
}

// Prefill of a prompt == prefill of its last 120 queries with the rest as prefix.
TEST(GpuPrefill, ChunkedEqualsWhole) {
  REQUIRE_GPU();
  AttnCase c = gpu_case(/*decode=*/false);
  const int S = 300, n = 120;
  c.kv_lens = {S};
  c.q_lens = {S};
  c.seed = 2400;
  const AttnProblem whole = build(c);
  DeviceMirror dev;
  run_gpu(whole, dev);
  ASSERT_TRUE(check_attention(whole, whole.reference()));
  AttnProblem tail = whole;  // same cache, table and lengths; queries: the last n rows
  tail.max_q_len = n;
  tail.out = make_tensor(whole.out.dtype, {n, c.Hq, c.D});
  tail.lse = make_tensor(DType::fp32, {n, c.Hq});
  const HostTensor cu = make_int32({0, n});
  AttnViews v = dev.views(whole);
  v.q = row_slice(v.q, S - n, n);
  v.cu_seqlens_q = dev.view(cu);
  v.out = dev.view(tail.out);
  v.lse = dev.view(tail.lse);
  launch(tail, v);
  dev.download(tail.out);
  EXPECT_TRUE(close_rows(tail.out, 0, whole.out, S - n, n));
}

}  // namespace
}  // namespace gpu_test
