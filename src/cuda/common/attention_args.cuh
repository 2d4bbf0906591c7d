// Kernel-side description of one attention call (decode or prefill), built on the host
// from detail::AttentionProblem, and the per-row view the shared mainloop works with.
#pragma once

#include <cstdint>

#include "core/problem.h"

namespace pagedmha::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/// Passed by value to the kernels. Logits are kept in log2 units (scaled by log2(e)) so
/// the softmax uses exp2.
struct AttentionArgs {
  const void* q;
  int64_t q_row_stride, q_head_stride;
  void* out;
  int64_t out_row_stride, out_head_stride;
  float* lse;  // optional
  int64_t lse_row_stride, lse_head_stride;

  const void* k;
  const void* v;
  int64_t k_page_stride, k_token_stride, k_head_stride;
  int64_t v_page_stride, v_token_stride, v_head_stride;
  const int32_t* page_table;
  int64_t page_table_row_stride;
  const int32_t* seq_lens;
  const int32_t* cu_seqlens_q;  // prefill only

  int batch, num_q_heads, num_kv_heads, group;  // group = Hq / Hkv
  int q_len_per_req;                            // decode only
  int page_size;

  float logit_scale_log2;  // bmm1_scale * log2(e) (no soft-cap)
  float cap_inner;         // bmm1_scale / soft_cap (soft-cap on)
  float cap_log2;          // soft_cap * log2(e); 0: soft-cap off
  float bmm2_scale;
  const float* sinks;  // optional [Hq], natural-log units
  MaskVariant mask;    // causal, window_left (include/pagedmha/variant.h)

  // Split-KV (decode, src/cuda/decode/policy.h): forced count (0: from the live
  // length), keys per split and the cap, the tile size the key range is split in, row
  // chunks per KV head, and the partial results (in the caller's workspace).
  int forced_splits, split_keys, max_splits, split_tile, row_chunks;
  float* ws_o;    // [rows * Hq, max_splits, D], unnormalised
  float2* ws_ml;  // [rows * Hq, max_splits]: (m, l) in log2 units

  bool q_fp8;  // q is fp8 e4m3 (only with an fp8 cache): converted to T when loaded

  // Host only: no request has more keys than its page-table row covers,
  // page_table_cols * page_size (docs/semantics.md 8.1); bounds the decode's split count.
  int64_t seq_len_bound;
};

/// One query row of a CTA's tile: which (token row, head) it is and its visible keys
/// [lo, hi). Invalid rows (padding of the tile) load zeros and store nothing.
struct RowDesc {
  bool valid;
  int64_t qrow;
  int head;
  int lo, hi;
};

/// Visible keys of the query at position p (= L - n + i) of a request with L keys, in
/// 32 bits (lengths are int32; hi may be <= 0 for queries before the first key).
__device__ __forceinline__ void visible_keys(const AttentionArgs& a, int L, int p, int& lo, int& hi) {
  const KeySpan s = a.mask.row(L, p);
  lo = static_cast<int>(s.lo);
  hi = static_cast<int>(s.hi);
}

AttentionArgs make_attention_args(const detail::AttentionProblem& p);

}  // namespace pagedmha::cuda
