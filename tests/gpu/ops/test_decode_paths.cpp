// batch_decode's loader, split and merge paths (src/cuda/common/paged_loader.cuh,
// src/cuda/decode/policy.h) against the fp64 oracle, plus finite but huge logits in both
// ops. Each case names the path it reaches:
// - the loader's run path: one page id per warp run when page_size is a multiple of the
//   run (BN / 4 keys), or a 32-key run spans two 16-token pages (D = 64, fp8 D <= 128);
//   other page sizes (8 with 16-key runs, 48) take one page id per row;
// - runs that start mid-request: splits and sliding windows; windows at a split's size
//   (one split and no merge launch, or two);
// - more than 32 splits, merged by several passes of the merge CTA's split lanes; a
//   workspace reused across calls without refilling; the merge's two grids, bitwise;
// - batches past one 128-request chunk of the in-kernel item scan, with row chunks;
// - fp8 caches on the Hopper decode's ring (decode_sm90/: raw fp8 stages of 128 keys, 256
//   at D = 64 on the 8-row tile of one KV head, in TMA's 128-byte / 64-byte swizzle, Q in
//   the fp8 fragments' dim order), on both row tiles (8 rows, and 16 for G 4 x q_len 4);
// - 17-32 rows at D = 64 on the Hopper decode's 32-row tile;
// - fp8 at D = 64 with two KV heads per Hopper decode work item.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cuda/decode/policy.h"
#include "gpu/ops/harness.h"

namespace gpu_test {
namespace {

// fp8 KV at page 16: a 32-key run covers two pages (D = 64 and 128), split and windowed.
TEST(GpuDecodePaths, Fp8TwoPageRunsWithSplitsAndWindows) {
  REQUIRE_GPU();
  int i = 0;
  for (int D : {64, 128}) {
    for (int W : {-1, 200}) {
      AttnCase c = gpu_case();
      c.D = D;
      c.kv_dtype = DType::fp8_e4m3;
      c.k_scale = 0.05, c.v_scale = 0.03;
      c.window_left = W;
      c.release_window_pages = W >= 0;
      c.kv_lens = {4097, 1500, 33, 16, 17};
      c.seed = 1100 + i++;
      check_case(c);     // splits from the lengths
      check_case(c, 5);  // forced: splits start on tiles inside the request
    }
  }
}

// fp8 e4m3 caches through the Hopper decode's ring (on other GPUs the portable decode,
// checked the same way; that these layouts reach the ring is
// GpuDecode.Fp8KvQueriesPastFp16RangeSaturateOnHopper's): TMA layouts (page sizes 8 to
// 256, NHD / HND / interleaved),
// lengths around the 128- and 256-key stages, windows with the pages before them released,
// sinks, soft-cap, verify rows (G * q_len up to the ring's 16) and the TP-8 rank's one
// KV head; then split counts, each within an ulp of one split.
TEST(GpuDecodePaths, Fp8CacheOnTheRing) {
  REQUIRE_GPU();
  const int kPages[] = {8, 16, 64, 256};
  const CacheLayout kLayouts[] = {CacheLayout::nhd4, CacheLayout::hnd4, CacheLayout::interleaved};
  int i = 0;
  for (int D : {64, 128}) {
    for (int variant = 0; variant < 6; ++variant) {
      AttnCase c = gpu_case();
      c.D = D;
      c.kv_dtype = DType::fp8_e4m3;
      c.q_dtype = variant % 3 == 2 ? DType::fp16 : DType::bf16;
      c.k_scale = 0.05, c.v_scale = 0.03;
      c.outlier_gain = variant == 1 ? 20.0 : 0.0;
      c.page_size = kPages[i % 4];
      c.layout = kLayouts[i % 3];
      c.window_left = variant % 2 ? 127 : -1;
      c.release_window_pages = c.window_left >= 0;
      if (variant >= 2) {
        c.sinks = SinkMode::custom;
        c.custom_sinks = {-1.0, 0.0, 3.0, 20.0, -1.5, 1.0, 2.0, 5.0};
      }
      if (variant == 3) c.soft_cap = 30.0;
      if (variant == 4) c.q_len_per_req = 4;  // G 4 x 4 = 16 rows
      if (variant == 5) c.Hkv = 1;            // the TP-8 rank: G 8
      c.kv_lens = {1, 127, 128, 129, 255, 256, 257, 513, 1000, 4097, 0, 9000};
      c.seed = 1500 + i++;
      check_case(c);
    }
    AttnCase c = gpu_case();
    c.D = D;
    c.kv_dtype = DType::fp8_e4m3;
    c.k_scale = 0.05, c.v_scale = 0.03;
    c.Hkv = 1;
    c.kv_lens = {9000, 4097, 300, 129};
    c.seed = 1600 + D;
    check_split_counts(c, {0, 3, 40, 128});
  }
}

// 17-32 rows per KV head at D = 64 (gpt-oss verify: G 8 x q_len 3 or 4; G 5 x q_len 4)
// on the Hopper decode's 32-row tile (two m16 tiles sharing each K / V fragment; on other
// GPUs the portable decode): 16-bit and fp8 caches, page sizes 1 (no TMA box: portable),
// 16, 64 and 256, windows, sinks, soft-cap, lse, padded graph rows (seq_len < q_len),
// lengths around the 64-key stages; then split counts, each within an ulp of one split.
TEST(GpuDecodePaths, VerifyRowsOnThe32RowTile) {
  REQUIRE_GPU();
  const int kPages[] = {16, 64, 256, 1};
  int i = 0;
  for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
    for (int variant = 0; variant < 4; ++variant) {
      AttnCase c = gpu_case();
      c.D = 64;
      c.q_dtype = variant == 2 ? DType::fp16 : DType::bf16;
      c.kv_dtype = kv == DType::bf16 ? c.q_dtype : kv;  // a 16-bit cache has the query's dtype
      if (kv == DType::fp8_e4m3) c.k_scale = 0.05, c.v_scale = 0.03;
      c.Hq = variant == 3 ? 10 : 16, c.Hkv = 2;
      c.q_len_per_req = variant == 1 ? 3 : 4;  // 32, 24, 32, 20 rows
      c.page_size = kPages[variant];
      c.window_left = variant == 1 ? 127 : -1;
      c.release_window_pages = c.window_left >= 0;
      if (variant >= 2) {
        c.sinks = SinkMode::custom;
        c.custom_sinks.clear();
        for (int h = 0; h < c.Hq; ++h) c.custom_sinks.push_back(0.5 * (h % 7) - 1.0);
      }
      if (variant == 2) c.soft_cap = 30.0;
      c.with_lse = variant % 2 == 0;
      c.kv_lens = {1, 3, 63, 64, 65, 129, 1000, 4097, 0, 9000};
      c.seed = 1700 + i++;
      check_case(c);
    }
  }
  AttnCase c = gpu_case();
  c.D = 64;
  c.Hq = 16, c.Hkv = 2;
  c.q_len_per_req = 4;
  c.kv_lens = {9000, 4097, 300, 129};
  c.seed = 1750;
  check_split_counts(c, {0, 3, 40, 128});
}

// fp8 at D = 64 with two adjacent KV heads per work item on the Hopper decode (one
// 128-byte TMA row of both heads, an 8-row tile per head: decode_sm90/policy.h
// kItemHeads; on other GPUs the portable decode): full tiles (G 8), half-empty ones
// (G 4 and G 2 x q_len 2), 2 to 8 KV heads, sinks that differ per head (a head's rows
// finished with the other head's sink, or written to its output, would show), soft-cap,
// windows, lse, page sizes 8 to 256 and the interleaved cache; then one KV head per item
// where the pair does not apply (3 KV heads, the head-major cache, 16 rows); then split
// counts, each within an ulp of one split, and a 128k request.
TEST(GpuDecodePaths, Fp8HeadPairsOnTheRing) {
  REQUIRE_GPU();
  struct Shape {
    int hq, hkv, q_len;
    int page;
    CacheLayout layout;
  };
  const Shape kShapes[] = {
      {64, 8, 1, 16, CacheLayout::nhd4},  {16, 4, 1, 64, CacheLayout::nhd4},       {8, 2, 2, 256, CacheLayout::nhd4},
      {16, 2, 1, 8, CacheLayout::interleaved}, {12, 3, 1, 16, CacheLayout::nhd4}, {16, 2, 1, 16, CacheLayout::hnd4},
      {16, 4, 4, 16, CacheLayout::nhd4},
  };
  int i = 0;
  for (const Shape& sh : kShapes) {
    for (int variant = 0; variant < 2; ++variant) {
      AttnCase c = gpu_case();
      c.D = 64;
      c.kv_dtype = DType::fp8_e4m3;
      c.q_dtype = i % 3 == 2 ? DType::fp16 : DType::bf16;
      c.k_scale = 0.05, c.v_scale = 0.03;
      c.Hq = sh.hq, c.Hkv = sh.hkv, c.q_len_per_req = sh.q_len;
      c.page_size = sh.page;
      c.layout = sh.layout;
      c.sinks = SinkMode::custom;
      c.custom_sinks.clear();
      for (int h = 0; h < c.Hq; ++h) c.custom_sinks.push_back(0.7 * (h % 5) - 1.2);
      c.window_left = variant == 1 ? 127 : -1;
      c.release_window_pages = c.window_left >= 0;
      if (variant == 1) c.soft_cap = 30.0;
      c.with_lse = variant == 0;
      c.kv_lens = {1, 127, 128, 129, 255, 256, 257, 1000, 4097, 0, 9000};
      c.seed = 1800 + i++;
      check_case(c);
    }
  }
  AttnCase c = gpu_case();
  c.D = 64;
  c.kv_dtype = DType::fp8_e4m3;
  c.k_scale = 0.05, c.v_scale = 0.03;
  c.Hq = 32, c.Hkv = 4;
  c.kv_lens = {9000, 4097, 300, 129};
  c.seed = 1850;
  check_split_counts(c, {0, 3, 40, 128});
  // TESTING.md's long context: one 128k request, gpt-oss's geometry at TP 4.
  c.Hq = 16, c.Hkv = 2;
  c.page_size = 64;
  c.kv_lens = {131072};
  c.seed = 1851;
  check_case(c);
}

// Page sizes no other suite uses: 8 (the general path for 16-key runs; the run path for
// the 4-key runs of 64-row tiles at D = 256, q_len 5) and 48 (runs start mid-page;
// column and offset step together).
TEST(GpuDecodePaths, PageSizes8And48) {
  REQUIRE_GPU();
  int i = 0;
  for (int P : {8, 48}) {
    for (int D : {64, 128, 256}) {
      for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
        AttnCase c = gpu_case();
        c.D = D;
        c.page_size = P;
        c.kv_dtype = kv;
        if (kv == DType::fp8_e4m3) c.k_scale = 0.05, c.v_scale = 0.03;
        c.window_left = i % 3 == 2 ? 100 : -1;
        c.release_window_pages = c.window_left >= 0;
        c.q_len_per_req = i % 2 ? 5 : 1;  // G * 5 = 20 rows: 64-row tiles
        c.kv_lens = {1000, 97, 48, 8, 2 * P + 5};
        c.seed = 1200 + i++;
        check_case(c);
      }
    }
  }
}

// More than 32 splits at every head dim (several passes of the merge's split lanes:
// 16, 8 and 4 lanes per column chunk at D = 64, 128, 256), forced and from the lengths of
// one-KV-head requests (up to 128 splits), each within an ulp of one split.
TEST(GpuDecodePaths, ManySplitsEveryHeadDim) {
  REQUIRE_GPU();
  int i = 0;
  for (int D : {64, 128, 256}) {
    AttnCase c = gpu_case();
    c.D = D;
    c.Hq = 8, c.Hkv = 1;
    c.kv_lens = {9000, 4097, 300};
    c.sinks = SinkMode::custom;
    c.custom_sinks = {0.5, 2.0, -1.0, 3.0, 0.0, 1.0, -2.0, 4.0};
    c.seed = 1300 + i++;
    check_split_counts(c, {0, 40, 100, 128});
  }
}

// A decode reads only what the call itself wrote to the workspace: one workspace filled
// once with each byte pattern, then reused without refilling by calls of other split
// counts (one split, a few, the cap, from the lengths), each against the oracle and
// within an ulp of one split. A partial or statistic of an earlier call read as this
// call's would give a stale result; the 0xFF fill reads as NaN.
TEST(GpuDecodePaths, WorkspaceReusedWithoutRefill) {
  REQUIRE_GPU();
  int i = 0;
  for (int D : {64, 128}) {
    AttnCase c = gpu_case();
    c.D = D;
    c.Hq = 8, c.Hkv = 1;  // the 8-row tile
    c.kv_lens = {5000, 1, 777, 3000};
    c.with_lse = true;
    c.sinks = SinkMode::custom;
    c.custom_sinks = {0.5, 2.0, -1.0, 3.0, 0.0, 1.0, -2.0, 4.0};
    c.seed = 1350 + i++;
    const AttnProblem one = build(c);
    const Reference ref = one.reference();
    DeviceMirror dev;
    run_gpu(one, dev, 1);
    ASSERT_TRUE(check_attention(one, ref)) << describe(c) << " num_splits=1";
    const size_t bytes = pagedmha::decode_workspace_size(gpu(), one.batch, 1, c.Hq, c.Hkv, D);
    for (int pattern : {0x00, 0x01, 0x5A, 0xFF}) {
      Buffer ws(bytes, gpu());
      pagedmha::fill_bytes(ws.data(), gpu(), pattern, bytes);
      for (int k : {5, 40, 0, 128, 2, 40}) {
        const AttnProblem p = with_new_outputs(one);
        AttnViews v = dev.views(p);
        v.workspace = ws.bytes_view();
        run_attention(p, v, k);
        dev.download(p.out);
        dev.download(p.lse);
        const std::string what = describe(c) + " fill " + std::to_string(pattern) + " num_splits=" + std::to_string(k);
        EXPECT_TRUE(check_attention(p, ref)) << what;
        const RunDiff r = diff_runs(p, one);
        EXPECT_TRUE(r.out_count == 0 && r.lse_count == 0) << what << ": " << r.out_count << " out, " << r.lse_count
                                                          << " lse values differ from num_splits=1";
      }
    }
  }
}

// A window that bounds every request to one split launches no merge (policy.h
// decode_max_split_count at MaskVariant::max_keys_read: window_left + q_len_per_req
// keys). Windows just under, at and just over one split's keys, with 1, 2 and 4 queries
// per request, on both row tiles and KV dtypes: a bound one key short would leave a
// split request unmerged.
TEST(GpuDecodePaths, WindowsAtTheSplitBoundary) {
  REQUIRE_GPU();
  int i = 0;
  for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
    for (int hkv : {1, 8}) {
      const int S = pagedmha::cuda::DecodeSplitPolicy::make(128, kv == DType::fp8_e4m3 ? 1 : 2, hkv).split_keys;
      for (int n : {1, 2, 4}) {
        for (int W : {S - n - 1, S - n, S - n + 1, S - 1}) {
          AttnCase c = gpu_case();
          c.Hkv = hkv, c.Hq = hkv == 1 ? 8 : 32;
          c.kv_dtype = kv;
          if (kv == DType::fp8_e4m3) c.k_scale = 0.05, c.v_scale = 0.03;
          c.q_len_per_req = n;
          c.window_left = W;
          c.kv_lens = {1, S / 2, S + 3, 3 * S};
          c.seed = 1700 + i++;
          check_case(c);
        }
      }
    }
  }
}

// The merge's two grids (merge_kernel.cuh) give bitwise the same out and lse: a CTA per
// four rows where the page table bounds every request to the splits a warp merges (the
// table narrowed to the columns the lengths need), a CTA per row where it does not (the
// same table at full width). Every head dim, bf16 and fp8, one and eight KV heads, sinks,
// 1 and 2 queries per request, split counts 1 to a warp's most; both runs against the
// oracle. (The grid each width takes is checked here with policy.h's bound at the table's
// keys, which split.cuh's decode_max_split_count applies on the launch path.)
TEST(GpuDecodePaths, MergeGridsAgreeToTheBit) {
  REQUIRE_GPU();
  namespace pc = pagedmha::cuda;
  int i = 0;
  for (int D : {64, 128, 256}) {
    for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
      if (kv == DType::fp8_e4m3 && D == 256) continue;
      for (int hkv : {1, 8}) {
        for (int n : {1, 2}) {
          AttnCase c = gpu_case();
          c.D = D;
          c.Hkv = hkv, c.Hq = hkv == 1 ? 8 : (D == 64 ? 64 : 32);
          c.kv_dtype = kv;
          if (kv == DType::fp8_e4m3) c.k_scale = 0.05, c.v_scale = 0.03;
          c.q_len_per_req = n;
          c.with_lse = true;
          c.sinks = SinkMode::mixed;
          const pc::DecodeSplitPolicy pol = pc::DecodeSplitPolicy::make(D, kv == DType::fp8_e4m3 ? 1 : 2, hkv);
          const int S = pol.split_keys, K = pc::decode_merge_warp_max_splits(D);
          c.kv_lens = {K * S, (K - 1) * S + 1, 0, 2 * S + 7, S + 1, S, 1};
          const int needed = K * S / c.page_size;  // columns of the longest request
          c.extra_cols = needed;                   // the full table: twice as wide
          c.seed = 1800 + i++;
          const AttnProblem cta = build(c);
          ASSERT_EQ(cta.cols, 2 * needed);
          // What each width selects (policy.h decode_max_split_count at the table's keys).
          ASSERT_FALSE(pc::decode_merge_by_warp(D, pc::decode_max_split_count(0, S, pol.max_splits, int64_t{cta.cols} * c.page_size)));
          ASSERT_TRUE(pc::decode_merge_by_warp(D, pc::decode_max_split_count(0, S, pol.max_splits, int64_t{needed} * c.page_size)));
          const Reference ref = cta.reference();
          DeviceMirror dev;
          run_gpu(cta, dev);
          EXPECT_TRUE(check_attention(cta, ref)) << describe(c) << " full table";
          const AttnProblem warp = with_new_outputs(cta);
          AttnViews v = dev.views(warp);
          v.page_table = v.page_table.slice(1, 0, needed);
          launch(warp, v);
          dev.download(warp.out);
          dev.download(warp.lse);
          EXPECT_TRUE(check_attention(warp, ref)) << describe(c) << " narrowed table";
          int64_t differ = 0;
          for (int r = 0; r < cta.rows; ++r)
            for (int h = 0; h < c.Hq; ++h) {
              differ += std::memcmp(cta.lse.at({r, h}), warp.lse.at({r, h}), 4) != 0;
              for (int d = 0; d < D; ++d)
                differ += std::memcmp(cta.out.at({r, h, d}), warp.out.at({r, h, d}), elem_size(cta.out.dtype)) != 0;
            }
          EXPECT_EQ(differ, 0) << describe(c) << ": out or lse values differ between the merge grids";
        }
      }
    }
  }
}

// 160 requests (two chunks of the in-kernel scan) of 96 packed rows (G 32 x q_len 3: two
// 64-row chunks per KV head), lengths from 1 to 1200 with splits from the lengths, and
// some requests of length 0.
TEST(GpuDecodePaths, BatchPastOneScanChunkWithRowChunks) {
  REQUIRE_GPU();
  AttnCase c = gpu_case();
  c.Hq = 32, c.Hkv = 1, c.D = 64;
  c.q_len_per_req = 3;
  std::mt19937_64 rng(1400);
  for (int b = 0; b < 160; ++b) c.kv_lens.push_back(b % 17 == 0 ? 0 : 3 + static_cast<int>(rng() % 1198));
  c.seed = 1400;
  check_case(c);
  check_case(c, 3);
}

// Finite logits near 2^32 (log2 units): the rounded product max(q.k) * scale may sit half
// an ulp (256) below the exact product the softmax exponentiates. Without the clamp an
// exponent of up to +256 gives exp2 = inf and NaN rows (fp16 P overflows from 2^16).
// q and K hold integers in [-2, 2], so every q.k is exact in fp32 and in the oracle and
// distinct logits are at least scale apart: the softmax is one-hot on each row's largest
// logit (shared equally on exact ties), in both. lse (~1e10) keeps the default 1e-6
// relative bound, well above the fp32 rounding of such a logit.
void check_huge_logits(AttnCase c) {
  c.sm_scale = 2e8;
  c.k_scale = 1.0;
  c.name = "huge finite logits " + describe(c);
  const AttnProblem p = build(c);
  std::mt19937_64 rng(c.seed);
  const auto pick = [&] { return static_cast<double>(static_cast<int>(rng() % 5) - 2); };
  fill_q(p, c.Hq, c.D, pick);
  const oracle::Format f = format_of(p.kv.dtype);
  for (int64_t s = 0; s < p.kv.num_pages * p.kv.page_size; ++s)
    for (int h = 0; h < c.Hkv; ++h)
      for (int d = 0; d < c.D; ++d) oracle::store(f, pick(), p.kv.kp(s, h, d));
  const Reference ref = p.reference(/*from_cache=*/true);
  if (!run_gpu_or_fail(p, c.name)) return;
  EXPECT_TRUE(check_attention(p, ref)) << c.name;
}

// AttentionParams::sm_margin on the Hopper decode (harness.h check_sm_margins): a grid of
// fewer CTAs walks the same items, split by each request's length alone. bf16 with
// splits, and the TP-8 rank's fp8 geometry (one KV head, D = 64) with a window.
TEST(GpuDecodePaths, SmMarginKeepsResults) {
  REQUIRE_GPU();
  AttnCase c = gpu_case();
  c.kv_lens = {9000, 3000, 17, 1};
  c.with_lse = true;
  c.seed = 3201;
  check_sm_margins(c);
  c.Hq = 8, c.Hkv = 1, c.D = 64;
  c.kv_dtype = DType::fp8_e4m3;
  c.kv_lens = {5000, 12000, 300};
  c.window_left = 127;
  c.seed = 3202;
  check_sm_margins(c);
}

TEST(GpuDecodePaths, HugeFiniteLogitsStayExact) {
  REQUIRE_GPU();
  int i = 0;
  for (bool decode : {false, true}) {
    for (DType q : {DType::bf16, DType::fp16}) {
      for (DType kv : {q, DType::fp8_e4m3}) {
        for (int D : {64, 128}) {
          AttnCase c = gpu_case(decode);
          c.Hq = 2, c.Hkv = 1, c.D = D;
          c.q_dtype = q, c.kv_dtype = kv;
          c.kv_lens = {300, 1000};
          if (!decode) c.q_lens = {300, 100};
          c.seed = 1500 + i++;
          check_huge_logits(c);
        }
      }
    }
  }
}

}  // namespace
}  // namespace gpu_test
