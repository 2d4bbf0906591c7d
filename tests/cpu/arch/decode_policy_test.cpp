// The decode split policy (src/cuda/decode/policy.h, plain C++): keys per split, the
// split cap and the workspace layout, against values worked out by hand from the rules
// stated there and in include/pagedmha/ops.h (batch_decode's num_splits and
// decode_workspace_size).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "cuda/decode/policy.h"
#include "pagedmha/variant.h"

namespace {

using pagedmha::cuda::DecodeSplitPolicy;
using pagedmha::cuda::DecodeWorkspaceLayout;
using pagedmha::cuda::decode_grid_ctas;

// split_keys = clamp(32768 * Hkv / 256, 128 KB / key bytes, 512 KB / key bytes) with key
// bytes = 2 * D * element size (K + V); cap = clamp(256 / Hkv, 32, 128).
TEST(DecodePolicy, SplitKeysByHeadDimDtypeAndKvHeads) {
  struct Row {
    int d, elem, hkv, keys, cap;
  };
  const Row rows[] = {
      {128, 2, 8, 1024, 32},  // llama3-8b: 1024 in [256, 1024]
      {64, 2, 8, 1024, 32},   // gpt-oss: 1024 in [512, 2048]
      {64, 1, 8, 1024, 32},   // gpt-oss fp8: 1024 in [1024, 4096]
      {256, 2, 8, 512, 32},   // gemma (Hkv 8): 1024 clamped to 512 KB / 1 KB
      {128, 2, 1, 256, 128},  // llama3-70b TP-8 rank: 128 raised to 128 KB / 512 B
      {64, 2, 1, 512, 128},   // gpt-oss TP-8 rank: 128 raised to 512
      {128, 1, 1, 512, 128},  // fp8 TP-8 rank: 128 raised to 512
      {128, 2, 4, 512, 64},   // qwen2.5-7b: 512 in [256, 1024]
      {128, 2, 2, 256, 128},  // 256 in [256, 1024]; cap 256 / 2 = 128
      {128, 2, 16, 1024, 32}, // 2048 clamped to 1024; cap 16 raised to 32
      {256, 1, 32, 1024, 32}, // 4096 clamped to 512 KB / 512 B = 1024
  };
  for (const Row& r : rows) {
    const DecodeSplitPolicy p = DecodeSplitPolicy::make(r.d, r.elem, r.hkv);
    EXPECT_EQ(p.split_keys, r.keys) << "D " << r.d << " elem " << r.elem << " Hkv " << r.hkv;
    EXPECT_EQ(p.max_splits, r.cap) << "D " << r.d << " elem " << r.elem << " Hkv " << r.hkv;
  }
}

// A 32k request alone gives at least 128 work items (one per H200 SM and more) with 8
// KV heads (256) and with one (the cap, 128): the reason for the policy.
TEST(DecodePolicy, OneLongRequestFillsTheGpu) {
  for (int hkv : {8, 1}) {
    const DecodeSplitPolicy p = DecodeSplitPolicy::make(128, 2, hkv);
    const int splits = std::min((32768 + p.split_keys - 1) / p.split_keys, p.max_splits);
    EXPECT_GE(hkv * splits, 128) << "Hkv " << hkv;
  }
}

// decode_max_split_count (the host's bound: grid size, merge launch or not) against the
// split rule of split.cuh decode_split written out here: the forced count, else
// ceil(keys / split_keys) within [1, cap], keys = the request's distinct keys
// (MaskVariant::keys_read). It must never be below a request's count (a split request
// would go unmerged) and, under a window, is reached by a long enough request.
TEST(DecodePolicy, MaxSplitCountBoundsEveryRequest) {
  using pagedmha::MaskVariant;
  const auto count = [](int forced, int split_keys, int cap, int64_t keys) {
    if (forced > 0) return forced;
    return static_cast<int>(std::min<int64_t>(std::max<int64_t>((keys + split_keys - 1) / split_keys, 1), cap));
  };
  for (int split_keys : {256, 1024}) {
    for (int cap : {32, 128}) {
      for (int forced : {0, 3}) {
        for (int n : {1, 2, 4}) {
          for (int w : {-1, 0, split_keys - n - 1, split_keys - n, split_keys - n + 1, split_keys - 1, 5000}) {
            const MaskVariant m{true, w};
            const int bound = pagedmha::cuda::decode_max_split_count(forced, split_keys, cap, m.max_keys_read(n));
            int most = 0;
            for (int64_t L = 0; L <= 3 * int64_t{cap} * split_keys; L += L < 4 * split_keys ? 1 : 97) {
              most = std::max(most, count(forced, split_keys, cap, m.keys_read(L, n)));
            }
            EXPECT_EQ(bound, most) << "split_keys " << split_keys << " cap " << cap << " forced " << forced << " n "
                                   << n << " w " << w;
          }
        }
      }
    }
  }
  // A window near INT_MAX: no overflow, the cap.
  EXPECT_EQ(pagedmha::cuda::decode_max_split_count(0, 256, 128, MaskVariant{true, 2147483647}.max_keys_read(4)), 128);
}

// The merge keeps 8 splits' loads in flight only where a request can have more than 32
// splits (one or two KV heads, cap 128); with 8 KV heads (cap 32) it keeps 4, as it
// does for any call bounded to 32 splits (a window, a forced count).
TEST(DecodePolicy, MergeUnrollFollowsTheSplitCap) {
  EXPECT_EQ(pagedmha::cuda::decode_merge_unroll(DecodeSplitPolicy::make(128, 2, 1).max_splits), 8);
  EXPECT_EQ(pagedmha::cuda::decode_merge_unroll(DecodeSplitPolicy::make(128, 2, 2).max_splits), 8);
  EXPECT_EQ(pagedmha::cuda::decode_merge_unroll(DecodeSplitPolicy::make(64, 2, 8).max_splits), 4);
  EXPECT_EQ(pagedmha::cuda::decode_merge_unroll(DecodeSplitPolicy::make(128, 2, 8).max_splits), 4);
  EXPECT_EQ(pagedmha::cuda::decode_merge_unroll(1), 4);
  EXPECT_EQ(pagedmha::cuda::decode_merge_unroll(33), 8);
}

// The merge grid reaches every row (merge_kernel.cuh: CTA i merges by warp rows
// 4i..4i+3 of few splits, and by CTA row i of more): a CTA per four rows only where no
// row can have more splits than a warp merges (D = 64: 16, 128: 8, 256: 4: the CTA's
// thread groups), else a CTA per row; and no CTA without a row.
TEST(DecodePolicy, MergeGridReachesEveryRow) {
  using namespace pagedmha::cuda;
  for (int d : {64, 128, 256}) {
    const int warp_max = decode_merge_warp_max_splits(d);
    EXPECT_EQ(warp_max, kDecodeMergeThreads / (d / 8)) << "D " << d;
    for (int max_count = 1; max_count <= DecodeSplitPolicy::kMaxCap; ++max_count) {
      const bool by_warp = decode_merge_by_warp(d, max_count);
      EXPECT_EQ(by_warp, max_count <= warp_max) << "D " << d << " max_count " << max_count;
      for (int rows = 1; rows <= 300; ++rows) {
        const int ctas = decode_merge_ctas(d, max_count, rows);
        // The last row: by warp in CTA (rows - 1) / 4 when no row can be a CTA's, else
        // by CTA rows - 1 (a CTA row) or by warp in CTA (rows - 1) / 4 (rows <= ctas).
        const int needed = by_warp ? (rows - 1) / kDecodeMergeWarps + 1 : rows;
        ASSERT_EQ(ctas, needed) << "D " << d << " max_count " << max_count << " rows " << rows;
      }
    }
  }
}

// The decode grid: no CTA without an item, at most the resident slots, and no more CTAs
// than the call's items.
TEST(DecodePolicy, GridIsItemsUpToTheResidentSlots) {
  const int64_t slots = 132 * 2;
  EXPECT_EQ(decode_grid_ctas(0, slots), 0);
  EXPECT_EQ(decode_grid_ctas(1000, slots), slots);
  EXPECT_EQ(decode_grid_ctas(slots, slots), slots);
  EXPECT_EQ(decode_grid_ctas(256, slots), 256);
  EXPECT_EQ(decode_grid_ctas(1, slots), 1);
}

// ops.h: batch * q_len_per_req * num_q_heads * C * (head_dim + 2) * 4 bytes (+ 16 of
// alignment slack, added by decode_workspace_size).
TEST(DecodePolicy, WorkspaceLayoutMatchesTheDocumentedFormula) {
  for (int hkv : {1, 2, 8}) {
    for (int d : {64, 128, 256}) {
      const int64_t batch = 37, q_len = 3, hq = 8 * hkv;
      const int cap = DecodeSplitPolicy::make(d, 2, hkv).max_splits;
      const DecodeWorkspaceLayout l(batch * q_len, static_cast<int>(hq), d, cap);
      const std::size_t slots = static_cast<std::size_t>(batch * q_len * hq * cap);
      EXPECT_EQ(l.total, slots * (d + 2) * 4) << "Hkv " << hkv << " D " << d;
      EXPECT_EQ(l.ml, slots * d * 4);
      EXPECT_EQ(l.ml % DecodeWorkspaceLayout::kAlign, 0u) << "(m, l) start 16-byte aligned";
    }
  }
}

}  // namespace
