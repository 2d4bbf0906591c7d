// CUDA implementations, one kernel family per folder. Plain C++ declarations so the
// front end (src/core/ops.cpp) includes no CUDA headers. Arguments are validated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/problem.h"

namespace pagedmha::cuda {

// decode/
void batch_decode(const detail::AttentionProblem& p);
std::size_t decode_workspace_size(int device_index, int64_t batch, int q_len_per_req,
                                  int num_q_heads, int num_kv_heads, int head_dim);
/// Whether batch_decode on device `device_index` computes S = Q K^T in fp16 for an fp8
/// cache, a 16-bit query and head dim `head_dim` when the call fits the Hopper decode
/// (G * q_len_per_req <= 16, a TMA layout): decided by the device and the build's
/// knobs (decode_sm90/policy.h); a bf16 query then saturates at 65504
/// (docs/semantics.md section 2). For tests.
bool decode_fp8_qk_in_fp16(int device_index, int head_dim);
// prefill/ (dispatching to prefill_sm90/ on Hopper)
void batch_prefill(const detail::AttentionProblem& p);
std::size_t prefill_workspace_size(int64_t batch, int64_t total_q);
// kvcache/
void append_kv(const detail::AppendKvProblem& p);
// metadata/
void gather_page_table(const detail::GatherPageTableProblem& p);
void metadata(const detail::MetadataProblem& p);
// merge/
void merge_attention_states(const detail::MergeProblem& p);

/// Debug validation: checks on the device that every page id the attention problem
/// would read lies in [0, num_pages); synchronises; throws Error naming the first bad
/// (row, column, value).
void validate_page_ids(const detail::AttentionProblem& p);
/// Debug validation: q and the K / V rows the problem reads are finite with |x| <= bound
/// (16-bit dtypes; fp8 is always in range), a key in a slot of `pending` (a write not made
/// yet) read from its new row; synchronises; throws Error naming the first request with a
/// value outside.
void validate_values(const detail::AttentionProblem& p, float bound, const detail::PendingRows* pending = nullptr);
/// Debug validation: every out_cache_loc in [0, num_pages * page_size).
void validate_slots(const detail::AppendKvProblem& p);

// runtime (common/runtime.cu): thin checked wrappers over the CUDA runtime.
int device_count();  // 0 when no driver / device
/// Why cuda:device_index cannot be used, as one phrase without source paths ("no CUDA
/// device is visible"); empty when it can.
std::string device_unavailable(int device_index);
void* malloc_device(std::size_t bytes, int device_index);
void free_device(void* ptr);
void memcpy_async(void* dst, const void* src, std::size_t bytes, void* stream);
void memset_async(void* dst, int value, std::size_t bytes, void* stream);
void stream_synchronize(void* stream);
int multiprocessor_count(int device_index);
/// A non-blocking stream of the greatest priority on the device and two timing-free events.
void side_stream_create(int device_index, void** stream, void** fork_event, void** join_event);
void side_stream_destroy(int device_index, void* stream, void* fork_event, void* join_event);
/// `waiter` waits for the work issued on `waited` so far (through `event`).
void stream_wait(void* waiter, void* waited, void* event);

}  // namespace pagedmha::cuda
