// Check-only entry points of the attention ops: every argument check the op makes before
// running (metadata values too for CPU tensors), without running it. For callers that
// write something before the op runs (MhaBackend writes the step's K/V first) and must
// leave everything unchanged when the call is rejected. `op` names the caller in errors.
#pragma once

#include <string>

#include "pagedmha/ops.h"

namespace pagedmha::detail {

/// Throws Error("<op>: <arg>: expected ..., got cuda:N (<why>)") unless `device` is the
/// CPU or a usable CUDA device of a CUDA build: no CUDA runtime error (with its source
/// location) reaches the user for a missing driver, device or CUDA support.
void check_device_usable(const std::string& op, const std::string& arg, Device device);

/// The K / V rows a caller will write with append_kv before the op runs (MhaBackend):
/// `slots` its out_cache_loc [T], `k` and `v` its [T, Hkv, D] rows. Undefined: none.
struct PendingWrite {
  TensorView slots, k, v;
};

/// With debug validation (set_debug_validation) also the op's value checks: page ids
/// and the range of q and of the K / V rows read as they will be after `write` (a
/// written slot's key from its new row). May synchronise `stream` then, as the op's own
/// checks do.
void check_batch_decode(const char* op, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                        const TensorView& page_table, const TensorView& seq_lens, int page_size, int q_len_per_req,
                        const TensorView& out, const AttentionParams& params, const TensorView& lse,
                        const TensorView& workspace, const PendingWrite& write = {}, Stream stream = {});

void check_batch_prefill(const char* op, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                         const TensorView& page_table, const TensorView& seq_lens, const TensorView& cu_seqlens_q,
                         int page_size, int max_q_len, const TensorView& out, const AttentionParams& params,
                         const TensorView& lse, const TensorView& workspace, const PendingWrite& write = {},
                         Stream stream = {});

}  // namespace pagedmha::detail
