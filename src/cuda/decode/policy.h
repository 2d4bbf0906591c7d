// Decode policy: how a request's keys are split into work items, the split cap that
// bounds the workspace, and the workspace layout. Host and device share these; every
// choice depends only on the problem's constants (head dim, KV dtype, KV heads) and, on
// the device, on the request's own visible key count, never on the batch: a request
// gives bitwise the same result in any batch (docs/semantics.md section 4).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace pagedmha::cuda {

// Experiment override of kMinSplitBytes below (bench/decode_variants.sh).
#ifndef PAGEDMHA_DECODE_MIN_SPLIT_KB
#define PAGEDMHA_DECODE_MIN_SPLIT_KB 128
#endif

struct DecodeSplitPolicy {
  /// A long request (kFillKeys keys) alone should give about kFillItems work items:
  /// two resident CTAs on each of the H200's 132 SMs, so 1-2 requests fill the GPU.
  /// With 8 KV heads that is 32 splits of 1024 keys; with one KV head (a TP-8 rank of
  /// llama3-70b) 256 splits of 128 keys, which the bounds below coarsen.
  static constexpr int kFillKeys = 32768;
  static constexpr int kFillItems = 256;
  /// K + V bytes of one split: at least 128 KB, so that its partials (G * n rows of
  /// (D + 2) fp32, written once and read by the merge) stay a few % of what it reads;
  /// at most 512 KB (1024 keys of bf16 D = 128: the size that balanced 16x8k..128x32k).
  static constexpr int64_t kMinSplitBytes = int64_t{PAGEDMHA_DECODE_MIN_SPLIT_KB} << 10;
  static constexpr int64_t kMaxSplitBytes = int64_t{512} << 10;
  /// Split cap per request: kFillItems / Hkv within [32, 128]. The workspace holds
  /// max_splits partials per query row and head: rows * Hq * cap, from rows * G * 128
  /// (one KV head) to rows * G * 32 * Hkv (8 or more KV heads).
  static constexpr int kMinCap = 32, kMaxCap = 128;

  int split_keys;  // keys per split when the count follows the length
  int max_splits;  // cap on a request's splits (also forced counts)

  static constexpr DecodeSplitPolicy make(int head_dim, int kv_elem_bytes, int num_kv_heads) {
    const int64_t key_bytes = int64_t{2} * head_dim * kv_elem_bytes;  // K + V of one key
    const int64_t fill = int64_t{kFillKeys} * num_kv_heads / kFillItems;
    const int64_t keys = std::clamp(fill, kMinSplitBytes / key_bytes, kMaxSplitBytes / key_bytes);
    const int cap = std::clamp(kFillItems / std::max(num_kv_heads, 1), kMinCap, kMaxCap);
    return DecodeSplitPolicy{static_cast<int>(keys), cap};
  }
};

/// The most splits of any request of a call whose requests each see at most `max_keys`
/// keys (MaskVariant::max_keys_read; < 0: no bound), on the host: decode_split's count
/// (split.cuh: the forced count, else one split per split_keys keys, within
/// [1, max_splits]) at max_keys, as it rises with the keys. It sizes the decode grid and
/// decides whether the merge is launched: a window of 127 keys never splits.
constexpr int decode_max_split_count(int forced, int split_keys, int max_splits, int64_t max_keys) {
  if (forced > 0) return forced;
  if (max_keys < 0) return max_splits;
  return static_cast<int>(std::clamp<int64_t>((max_keys + split_keys - 1) / split_keys, 1, max_splits));
}

/// Splits per thread whose partials a merge CTA loads together for a row it merges whole
/// (merge_kernel.cuh), for a call whose requests have at most `max_count` splits: 8
/// above 32 (one or two KV heads: up to 128 splits, 16 per thread at D = 128, two round
/// trips instead of four), else 4. Eight take 94 registers against 64, so fewer merge
/// CTAs fit an SM. H200 s19run6 (one CTA per row then, 91 against 54 registers): 8
/// everywhere took llama3-70b-tp8 1 x 32k from 14.2 to 12.5 us and 32 x 2k from 17.1 to
/// 16.5, and gpt-oss 64 x 4k from 156.3 to 160.6 us, llama3-8b 256 x 2k from 517.7 to
/// 525.3.
constexpr int decode_merge_unroll(int max_count) { return max_count > 32 ? 8 : 4; }

/// Threads of a merge CTA (merge_kernel.cuh): four warps, each merging a row (query row
/// and head) of few splits, or all of them one row of many (thread (g, c) adding the
/// splits g, g + groups, ... of 8 columns, groups = 128 / (D / 8)).
constexpr int kDecodeMergeWarps = 4;
constexpr int kDecodeMergeThreads = 32 * kDecodeMergeWarps;

/// Most splits of a row that one warp merges: the CTA's thread groups (at most two rounds
/// of 8 loads per lane, at D = 64; the warp sums in the order the CTA would). A CTA of
/// 128 threads for a row of 2-8 splits left most of them idle: one per row was 4096 CTAs
/// at gpt-oss 64 x 4k (13 us serialized, H200 s19run1).
constexpr int decode_merge_warp_max_splits(int head_dim) { return kDecodeMergeThreads / (head_dim / 8); }

// Experiment override: PAGEDMHA_DECODE_MERGE_BY_WARP=0 launches the merge grid of a CTA
// per row whatever the bound (as for a page table wider than the lengths need); rows of
// few splits are still merged by warp.
#ifndef PAGEDMHA_DECODE_MERGE_BY_WARP
#define PAGEDMHA_DECODE_MERGE_BY_WARP 1
#endif

/// Whether no row of a call whose requests have at most `max_count` splits needs a CTA
/// (then the merge grid is a CTA per four rows, else one per row).
constexpr bool decode_merge_by_warp(int head_dim, int max_count) {
  return PAGEDMHA_DECODE_MERGE_BY_WARP != 0 && max_count <= decode_merge_warp_max_splits(head_dim);
}

/// CTAs of a decode grid: the call's `max_items` (its split bound's work items) or the
/// device's resident `slots`, whichever is fewer. Items are taken grid-stride, so the
/// size changes no result. Every slot whatever the items measured no gain (H100 s30run1,
/// docs/perf-notes/decode-merge.md section 7).
constexpr int64_t decode_grid_ctas(int64_t max_items, int64_t slots) {
  if (max_items <= 0) return 0;
  return std::min(max_items, slots);
}

/// CTAs of the merge of `rows` rows (query rows x query heads).
constexpr int decode_merge_ctas(int head_dim, int max_count, int rows) {
  return decode_merge_by_warp(head_dim, max_count) ? (rows + kDecodeMergeWarps - 1) / kDecodeMergeWarps : rows;
}

/// Shared memory budget of a decode CTA in KB (Q tile + K/V stages): 72 gives 2 stages
/// of 32 KB and three CTAs per SM where the registers allow (bf16: ~167 per thread).
/// Against 110 (3 stages, two CTAs per SM) it was within 0.5% or faster on 33 of the 42
/// shapes of bench_attention.py --decode (gpt-oss +4-7% from 16x8k up, fp8 +8-19%, page 1
/// +14%; at most 3% slower, llama3-70b-tp8 32x2k: bench/decode_variants.sh).
/// PAGEDMHA_DECODE_SMEM_KB overrides it for experiments.
#ifndef PAGEDMHA_DECODE_SMEM_KB
#define PAGEDMHA_DECODE_SMEM_KB 72
#endif
constexpr int kDecodeSmemKB = PAGEDMHA_DECODE_SMEM_KB;

static_assert(DecodeSplitPolicy::make(128, 2, 8).split_keys == 1024, "llama3-8b: 32 splits of 1024 keys at 32k");
#if PAGEDMHA_DECODE_MIN_SPLIT_KB == 128
static_assert(DecodeSplitPolicy::make(128, 2, 1).split_keys == 256 &&
                  DecodeSplitPolicy::make(128, 2, 1).max_splits == 128,
              "one KV head: 128 splits of 256 keys at 32k");
#endif

/// Workspace layout of batch_decode (offsets from the 16-byte aligned base): fp32 O
/// partials [rows * Hq, max_splits, D], then float2 (m, l) [rows * Hq, max_splits].
struct DecodeWorkspaceLayout {
  static constexpr std::size_t kAlign = 16;
  std::size_t o = 0, ml = 0, total = 0;

  DecodeWorkspaceLayout(int64_t rows, int num_q_heads, int head_dim, int max_splits) {
    const std::size_t slots = static_cast<std::size_t>(rows) * num_q_heads * max_splits;
    o = 0;
    ml = o + slots * head_dim * sizeof(float);
    total = ml + slots * 2 * sizeof(float);
  }
};

}  // namespace pagedmha::cuda
