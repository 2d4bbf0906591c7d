// The kernel-level API: one free function per operation, dispatched on the device
// of its tensors (CPU or CUDA). Each op validates its arguments once, then runs.
//
// Conventions shared by every op (see docs/semantics.md):
//  * Tensors are TensorViews with strides in elements; only the last dim must be
//    contiguous. All tensors of one call live on the same device.
//  * Lengths, page ids and slots are int32 on the op's device; anything else is an
//    Error. All address arithmetic is 64-bit.
//  * A paged cache (`k_cache`, `v_cache`) is either [num_slots, Hkv, D] with
//    num_slots = num_pages * page_size (token-major "NHD"), or a 4-d view
//    [num_pages, page_size, Hkv, D] with any strides (an HND buffer viewed through
//    strides, or K and V interleaved in one allocation). Token position p of a request
//    lives at page page_table[row][p / page_size], offset p % page_size.
//    Page 0 is the reserved dummy page.
//  * Every op takes an explicit stream; CUDA ops are asynchronous on it and never
//    synchronise the device, allocate or copy to the host. CPU ops ignore it and
//    return when done.
//  * Errors: pagedmha::Error whose message names the op, the argument, what was
//    expected and what was given.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pagedmha/tensor.h"

namespace pagedmha {

/// Scalars and optional inputs of one attention call (docs/semantics.md section 1).
///
/// For query position p (queries are the last n positions of the KV length L:
/// p_i = L - n + i) and query head h (KV head h / (Hq / Hkv)), key j is visible iff
/// j <= p (causal) and (window_left < 0 or j >= p - window_left). Logits
/// s_j = bmm1_scale * dot(q, k_j) in fp32, soft-capped then masked; the sink is an
/// extra unscaled logit in the softmax denominator; o = bmm2_scale * sum_j softmax_j v_j;
/// lse = m + ln Z includes the sink. An empty visible set gives o = 0 and
/// lse = -inf (or sinks[h] with a sink), never NaN.
struct AttentionParams {
  /// q_scale * k_scale * sm_scale (sm_scale is usually head_dim^-0.5). Must be finite.
  /// The default 1.0 applies no softmax scale: set it (as the upstream backend passes
  /// it). The Python ops' bmm1_scale=None and LayerSpec::scaling = 0 mean head_dim^-0.5.
  float bmm1_scale = 1.0f;
  /// v_scale (an fp8 cache stores V / v_scale). Must be finite.
  float bmm2_scale = 1.0f;
  /// A query at position p sees keys [p - window_left, p] (window_left + 1 keys);
  /// -1 disables the window. A Hugging Face sliding_window S is window_left = S - 1.
  int window_left = -1;
  /// Soft-cap c > 0 applies s = c * tanh(s / c) before masking; 0 disables.
  float logits_soft_cap = 0.0f;
  /// Optional fp32 [Hq] sink logit per query head (natural-log units, unscaled).
  TensorView sinks;
  /// batch_prefill only. false: every query sees all L keys; window_left still
  /// bounds keys from the left (j >= p - window_left). Used by block-diffusion drafts.
  bool causal = true;
  /// batch_decode on CUDA: 0 lets the kernel choose the split-KV count of each request
  /// on the device from that request's own visible key count and the problem's head
  /// dim, KV dtype and KV heads (src/cuda/decode/policy.h: ceil(keys / S) with S = 1024
  /// for bf16 D = 128 and 8 KV heads, 256 with one KV head), never from the batch: a
  /// request gives bitwise the same result in any batch (CUDA-graph padding). k >= 1
  /// forces k splits per request (tests, tuning). Both are capped at 256 / Hkv splits,
  /// within [32, 128]. Results do not depend on it beyond fp32 rounding. Ignored by the
  /// CPU path.
  int num_splits = 0;
  /// SMs the persistent Hopper kernels (sm_90a prefill and decode) leave free for work
  /// running beside them on another stream, such as a collective (FlashAttention-3's
  /// sm_margin): their grid is sized for max(1, SMs - sm_margin) SMs (prefill: whole
  /// clusters). Results are bitwise the same, except where the smaller grid changes the
  /// prefill's query tile (fp8 KV at D = 64: 128 or 192 rows, prefill_sm90/policy.h),
  /// which rounds a few elements differently. >= 0; ignored by the portable kernels and
  /// the CPU path.
  int sm_margin = 0;
};

/// Writes new tokens into a paged cache: k_cache[out_cache_loc[t]] = k[t] and
/// v_cache[out_cache_loc[t]] = v[t] for every t; touches no other slot.
///
/// k, v: [T, Hkv, D] (bf16 or fp16; T may be 0). k_cache, v_cache: paged cache of
/// dtype bf16, fp16 (equal to k's) or fp8_e4m3. out_cache_loc: int32 [T], slots in
/// [0, num_slots). For an fp8 cache each element is stored as
/// saturate_rne(x / scale) with scale = k_scale or v_scale (> 0).
/// Errors: shapes, dtypes, devices, non-positive scales; on the CPU, or on CUDA in
/// debug-validation mode, a slot outside the pool.
void append_kv(const TensorView& k, const TensorView& v, const TensorView& k_cache,
               const TensorView& v_cache, const TensorView& out_cache_loc, int page_size,
               float k_scale = 1.0f, float v_scale = 1.0f, Stream stream = {});

/// Decode (and speculative verify) attention over a paged cache, with a uniform
/// number of queries per request.
///
/// q: [batch * q_len_per_req, Hq, D], rows request-major (row b * q_len_per_req + i),
///    bf16 or fp16 (fp8_e4m3 allowed when the cache is fp8; its scale goes into bmm1_scale).
/// k_cache, v_cache: paged cache [.., Hkv, D], bf16/fp16 equal to q's dtype, or fp8_e4m3.
/// page_table: int32 [batch, cols]; entries at columns >= ceil(L / page_size) are never
///    read, nor (with a window) pages wholly before the window.
/// seq_lens: int32 [batch], the KV length L of each request *including* this step's
///    queries (already in the cache). Read at kernel time on CUDA.
/// page_size: tokens per page (>= 1). q_len_per_req: queries per request (>= 1).
/// out: same shape as q, dtype bf16 or fp16 (the query dtype; bf16 for fp8 queries).
/// lse: optional fp32 [batch * q_len_per_req, Hq] (natural log).
/// workspace: uint8 bytes, at least decode_workspace_size(...) for this call's shape;
///    may be undefined when that size is 0 (always on the CPU).
/// Head dims: 64, 128, 256. Hq % Hkv == 0.
void batch_decode(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                  const TensorView& page_table, const TensorView& seq_lens, int page_size,
                  int q_len_per_req, const TensorView& out, const AttentionParams& params,
                  const TensorView& lse = {}, const TensorView& workspace = {}, Stream stream = {});

/// Bytes of workspace batch_decode needs on `device` for up to `batch` requests of
/// `q_len_per_req` queries (0 on the CPU). Depends only on these sizes and the device,
/// so a workspace sized once serves every later call of at most that size. On CUDA it
/// is the bound for the largest split count (C = 256 / num_kv_heads within [32, 128]
/// splits per request: batch * q_len_per_req * num_q_heads * C * (head_dim + 2) * 4
/// bytes, plus 16), whatever the lengths, so that the split decision can stay on the
/// device.
std::size_t decode_workspace_size(Device device, int64_t batch, int q_len_per_req, int num_q_heads,
                                  int num_kv_heads, int head_dim);

/// Prefill / extend attention with ragged queries (optionally after a cached prefix).
///
/// q: [total_q, Hq, D] with the queries of request b at rows
///    [cu_seqlens_q[b], cu_seqlens_q[b + 1]) (bf16 or fp16).
/// cu_seqlens_q: int32 [batch + 1], exclusive prefix sums of the query lengths
///    (non-decreasing, cu_seqlens_q[0] == 0, cu_seqlens_q[batch] == total_q).
/// seq_lens: int32 [batch], KV length L per request including the new tokens; the
///    prefix length is L - n. n > L makes the first n - L queries see no key.
/// max_q_len: host upper bound of the query lengths (never read from the device). It
///    sizes the portable kernel's grid, and on Hopper at D = 256 a bound of at most 1024
///    selects 64-key tiles over 80-key ones (faster for short prompts; the results differ
///    by bf16 rounding only), so pass the step's own maximum, not a fixed budget.
/// workspace: uint8 bytes, at least prefill_workspace_size(device, batch, total_q) (the
///    longest-first plan of query-tile pairs of the Hopper kernel, written on the device); may be
///    undefined when that size is 0 (always on the CPU).
/// Other arguments as batch_decode. params.causal selects bottom-right causal masking.
void batch_prefill(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                   const TensorView& page_table, const TensorView& seq_lens,
                   const TensorView& cu_seqlens_q, int page_size, int max_q_len,
                   const TensorView& out, const AttentionParams& params, const TensorView& lse = {},
                   const TensorView& workspace = {}, Stream stream = {});

/// Bytes of workspace batch_prefill needs on `device` for up to `batch` requests and
/// `total_q` query rows in all (0 on the CPU): 16 + 16 * ceil((batch + 1) / 4) +
/// 16 * (total_q + batch) on CUDA, whatever the head geometry, so one workspace sized for
/// the largest step serves every step.
std::size_t prefill_workspace_size(Device device, int64_t batch, int64_t total_q);

/// Merges K partial attention results of the same queries, each over its own disjoint
/// set of keys (split-KV, decode context parallelism, cascade / shared-prefix attention),
/// into the attention over the union of the key sets (docs/semantics.md section 8.6).
///
/// o: [K, T, Hq, D] bf16, fp16 or fp32; o[i] is part i's output (as batch_decode /
///    batch_prefill write it, bmm2_scale included). One strided view: K buffers of one
///    layout at a constant distance, or a stacked (all-gathered) tensor. Last dim contiguous.
/// lse: fp32 [K, T, Hq], part i's lse (natural log, what the attention ops write);
///    lse[i, t, h] = -inf marks an empty part, whose o is ignored (may hold anything).
/// out: [T, Hq, D], o's dtype. out_lse: optional fp32 [T, Hq].
/// sinks: optional fp32 [Hq], natural-log units, unscaled (as AttentionParams::sinks);
///    counted once here: pass them when no part was computed with sinks, or compute
///    exactly one part with sinks and pass none here.
/// With M = max(max_i lse_i, sink), w_i = exp(lse_i - M) and Z = sum_i w_i + exp(sink - M):
/// out = sum_i (w_i / Z) o[i] and out_lse = M + ln Z, in fp32, rounded once. M = -inf
/// (no key and no sink) gives out = 0, out_lse = -inf; no NaN from empty parts.
/// In place: out may be exactly o[i] (same address and strides) and out_lse exactly
/// lse[i]; otherwise out and out_lse share no memory with o, lse, sinks or each other.
/// K = 0 gives the empty result; T = 0 is a no-op. Head dims 64, 128, 256.
/// Errors: shapes, dtypes, devices, overlaps; lse values NaN or +inf and sinks NaN or
/// +inf (checked for CPU tensors).
void merge_attention_states(const TensorView& o, const TensorView& lse, const TensorView& out,
                            const TensorView& out_lse = {}, const TensorView& sinks = {},
                            Stream stream = {});

/// Gathers per-request page tables from the engine's request-to-page table:
/// out[r, c] = req_to_page[req_pool_indices[r], c] for c < ceil(seq_lens[r] / page_size)
/// and 0 (the dummy page) for the other c < cols, for rows r < bs; rows >= bs and
/// columns >= cols untouched.
/// req_to_page: int32 [max_requests + 1, max_pages] (row 0 is the padding row);
/// req_pool_indices, seq_lens: int32 [>= bs]; out: int32 [>= bs, >= cols].
/// Errors: cols > max_pages (capacity), bs out of range, dtypes, negative lengths.
void gather_page_table_with_padding(const TensorView& req_to_page,
                                    const TensorView& req_pool_indices, const TensorView& seq_lens,
                                    const TensorView& out, int bs, int cols, int page_size,
                                    Stream stream = {});

/// Exclusive prefix sums: out[0] = 0, out[i + 1] = out[i] + lengths[i].
/// lengths: int32 [n] (>= 0); out: int32 [n + 1].
void cumsum_lengths(const TensorView& lengths, const TensorView& out, Stream stream = {});

/// Speculative-verify clamp: out[i] = max(seq_lens[i], min_len). In-place allowed.
/// seq_lens, out: int32 [n]; min_len >= 0.
void clamp_seq_lens(const TensorView& seq_lens, int min_len, const TensorView& out,
                    Stream stream = {});

/// Two-sided clamp with expansion: out[i * repeat + j] = min(max(seq_lens[i], min_len),
/// max_len) for j < repeat. Verify uses (N, C, 1); block-diffusion drafts (N, C, N): every
/// one of a request's N rows gets the clamped block-end length. seq_lens: int32 [n];
/// out: int32 [n * repeat] (in-place allowed when repeat == 1); 0 <= min_len <= max_len.
void clamp_seq_lens(const TensorView& seq_lens, int min_len, int max_len, int repeat,
                    const TensorView& out, Stream stream = {});

/// Write slots of decode (q_len_per_req == 1) and verify (N > 1) steps:
/// out[r * N + j] = slot(r, max(seq_lens[r] - N + j, 0)), with
/// slot(r, pos) = page_table[r, pos / page_size] * page_size + pos % page_size.
/// page_table: int32 [bs, cols]; seq_lens: int32 [bs] (KV length after the step);
/// out: int32 [bs * N]. Rows with seq_len 0 write page_table[r, 0]'s first slot.
void decode_write_slots(const TensorView& page_table, const TensorView& seq_lens, int page_size,
                        int q_len_per_req, const TensorView& out, Stream stream = {});

/// Write slots of an extend step: for request r the positions
/// [prefix_lens[r], prefix_lens[r] + extend_len_r), extend_len_r =
/// cu_seqlens_q[r + 1] - cu_seqlens_q[r], in order, at out[cu_seqlens_q[r] + i].
/// page_table: int32 [bs, cols]; prefix_lens: int32 [bs]; cu_seqlens_q: int32 [bs + 1];
/// out: int32 [cu_seqlens_q[bs]] (at least).
void extend_write_slots(const TensorView& page_table, const TensorView& prefix_lens,
                        const TensorView& cu_seqlens_q, int page_size, const TensorView& out,
                        Stream stream = {});

/// Debug validation (off by default; no cost when off): CUDA ops then also check on
/// the device that every page id they would read is in [0, num_pages) and every
/// write slot is inside the pool, synchronise, and throw Error on a violation.
void set_debug_validation(bool enabled);
bool debug_validation();

}  // namespace pagedmha
