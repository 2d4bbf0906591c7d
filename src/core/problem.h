// Resolved, validated descriptions of each op, handed from the validating front end
// (src/core/ops.cpp) to exactly one device implementation (src/cpu or src/cuda).
// Everything here is plain data: pointers, sizes and strides in elements, 64-bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pagedmha/tensor.h"
#include "pagedmha/variant.h"

namespace pagedmha::detail {

/// One paged K or V buffer: element (page, offset, head, dim) lives at
/// data + page * page_stride + offset * token_stride + head * head_stride + dim.
struct PagedCache {
  void* data = nullptr;
  int64_t page_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

struct KvCacheDesc {
  PagedCache k, v;
  DType dtype = DType::bf16;
  int64_t num_pages = 0;  // pages addressable through the views
  int page_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

/// batch_decode and batch_prefill share one description. Decode: q_len_per_req > 0
/// and cu_seqlens_q == nullptr (request b owns rows [b * n, (b + 1) * n)). Prefill:
/// q_len_per_req == 0 and cu_seqlens_q set (on the op's device).
struct AttentionProblem {
  // Queries [rows, Hq, D] and outputs of the same shape.
  const void* q = nullptr;
  DType q_dtype = DType::bf16;
  int64_t q_row_stride = 0, q_head_stride = 0;
  void* out = nullptr;
  DType out_dtype = DType::bf16;
  int64_t out_row_stride = 0, out_head_stride = 0;
  float* lse = nullptr;  // optional fp32 [rows, Hq]
  int64_t lse_row_stride = 0, lse_head_stride = 0;

  KvCacheDesc kv;
  const int32_t* page_table = nullptr;
  int64_t page_table_row_stride = 0;
  int page_table_cols = 0;
  const int32_t* seq_lens = nullptr;  // [batch]

  int batch = 0;
  int num_rows = 0;  // total query rows
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;

  int q_len_per_req = 0;                 // decode: uniform queries per request
  const int32_t* cu_seqlens_q = nullptr;  // prefill: [batch + 1]
  int max_q_len = 0;                      // prefill: host bound; decode: q_len_per_req

  // Math (docs/semantics.md section 1).
  float bmm1_scale = 1.0f;
  float bmm2_scale = 1.0f;
  int window_left = -1;
  float logits_soft_cap = 0.0f;
  const float* sinks = nullptr;  // optional [Hq]
  bool causal = true;
  int num_splits = 0;  // decode: 0 = chosen on the device
  int sm_margin = 0;   // persistent Hopper grids: SMs left free (ops.h AttentionParams)

  /// The mask these fields describe (include/pagedmha/variant.h).
  MaskVariant mask() const { return MaskVariant{causal, window_left}; }

  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  Device device{};
  void* stream = nullptr;
};

/// A step's K / V write that has not happened yet, for debug validation before it
/// (MhaBackend): the slots it will write, sorted, each with the token whose row lands
/// there (the last one where a slot is named twice), and those rows' source (16-bit).
/// Value checks read a written slot's key from the new row instead of the cache.
struct PendingRows {
  std::vector<int32_t> slots, tokens;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_row_stride = 0, k_head_stride = 0, v_row_stride = 0, v_head_stride = 0;
  DType dtype = DType::bf16;
  /// Index of `slot` in `slots`, -1 when absent.
  int64_t find(int64_t slot) const {
    const auto it = std::lower_bound(slots.begin(), slots.end(), slot);
    return it != slots.end() && *it == slot ? it - slots.begin() : -1;
  }
};

struct AppendKvProblem {
  const void* k = nullptr;
  const void* v = nullptr;
  DType src_dtype = DType::bf16;
  int64_t k_row_stride = 0, k_head_stride = 0;
  int64_t v_row_stride = 0, v_head_stride = 0;
  KvCacheDesc kv;
  const int32_t* out_cache_loc = nullptr;  // [num_tokens]
  int64_t num_tokens = 0;
  float k_scale = 1.0f, v_scale = 1.0f;
  Device device{};
  void* stream = nullptr;
};

/// merge_attention_states: K parts (o [K, T, Hq, D], lse [K, T, Hq]) -> out [T, Hq, D]
/// and optional out_lse [T, Hq]. out may be o[i] itself, out_lse lse[i] itself.
struct MergeProblem {
  const void* o = nullptr;
  DType dtype = DType::bf16;  // o's and out's
  int64_t o_part_stride = 0, o_row_stride = 0, o_head_stride = 0;
  const float* lse = nullptr;
  int64_t lse_part_stride = 0, lse_row_stride = 0, lse_head_stride = 0;
  void* out = nullptr;
  int64_t out_row_stride = 0, out_head_stride = 0;
  float* out_lse = nullptr;  // optional
  int64_t out_lse_row_stride = 0, out_lse_head_stride = 0;
  const float* sinks = nullptr;  // optional [Hq]
  int num_parts = 0, num_rows = 0, num_heads = 0, head_dim = 0;
  Device device{};
  void* stream = nullptr;
};

/// A 2-d int32 matrix view.
struct Int32Matrix {
  int32_t* data = nullptr;
  int64_t row_stride = 0;
  int64_t rows = 0, cols = 0;
};

struct GatherPageTableProblem {
  Int32Matrix req_to_page;  // const in effect
  const int32_t* req_pool_indices = nullptr;
  const int32_t* seq_lens = nullptr;
  Int32Matrix out;
  int bs = 0, cols = 0, page_size = 0;
  Device device{};
  void* stream = nullptr;
};

enum class MetadataOp { cumsum_lengths, clamp_seq_lens, decode_write_slots, extend_write_slots };

/// The small metadata helpers share one description; unused fields stay empty.
struct MetadataProblem {
  MetadataOp op = MetadataOp::cumsum_lengths;
  Int32Matrix page_table;
  const int32_t* in = nullptr;          // lengths / seq_lens / prefix_lens
  const int32_t* cu_seqlens_q = nullptr;  // extend_write_slots
  int32_t* out = nullptr;
  int64_t n = 0;  // elements of `in` (requests)
  int page_size = 0;
  int value = 0;  // clamp min_len, or q_len_per_req for decode_write_slots
  int max_value = 0x7fffffff;  // clamp max_len
  int repeat = 1;              // clamp: copies of each entry (out[i * repeat + j])
  Device device{};
  void* stream = nullptr;
};

}  // namespace pagedmha::detail
