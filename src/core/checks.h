// Check-only entry points of the attention ops: every argument check the op makes before
// running (metadata values too for CPU tensors), without running it. For callers that
// write something before the op runs (MhaBackend writes the step's K/V first) and must
// leave everything unchanged when the call is rejected. `op` names the caller in errors.
#pragma once

#include "pagedmha/ops.h"

namespace pagedmha::detail {

void check_batch_decode(const char* op, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                        const TensorView& page_table, const TensorView& seq_lens, int page_size, int q_len_per_req,
                        const TensorView& out, const AttentionParams& params, const TensorView& lse,
                        const TensorView& workspace);

void check_batch_prefill(const char* op, const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                         const TensorView& page_table, const TensorView& seq_lens, const TensorView& cu_seqlens_q,
                         int page_size, int max_q_len, const TensorView& out, const AttentionParams& params,
                         const TensorView& lse, const TensorView& workspace);

}  // namespace pagedmha::detail
