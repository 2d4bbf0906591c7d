// batch_decode's kernel arguments (host): the call's AttentionArgs plus the split policy
// and the workspace's partial buffers. Shared by the launcher (decode.cu) and the decode
// micro-benchmark (bench/decode_sm90_variants.cu).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "core/problem.h"
#include "cuda/common/attention_args.cuh"
#include "cuda/decode/policy.h"
#include "pagedmha/error.h"
#include "pagedmha/tensor.h"

namespace pagedmha::cuda {

/// The arguments of one batch_decode call: make_attention_args, then the split policy of
/// decode/policy.h and the partials' layout in p.workspace (which the front end checked
/// against decode_workspace_size). Throws when the work items would overflow int32.
inline AttentionArgs decode_args(const detail::AttentionProblem& p) {
  AttentionArgs a = make_attention_args(p);
  const int64_t rows = static_cast<int64_t>(p.batch) * p.q_len_per_req;
  const DecodeSplitPolicy policy = DecodeSplitPolicy::make(p.head_dim, static_cast<int>(dtype_size(p.kv.dtype)), p.num_kv_heads);
  // Work items are counted in int32 (at most batch * Hkv * G * n * max_splits).
  if (static_cast<int64_t>(p.batch) * p.num_q_heads * p.q_len_per_req * policy.max_splits > INT32_MAX) {
    throw Error("batch_decode: seq_lens: at most " +
                std::to_string(INT32_MAX / (int64_t{p.num_q_heads} * p.q_len_per_req * policy.max_splits)) +
                " requests for this shape, got " + std::to_string(p.batch));
  }
  a.split_keys = policy.split_keys;
  a.max_splits = policy.max_splits;
  a.forced_splits = std::min(p.num_splits, policy.max_splits);  // 0: from each request's length

  // The front end checked workspace_bytes >= decode_workspace_size (which has the
  // alignment slack), so the layout fits.
  const DecodeWorkspaceLayout layout(rows, p.num_q_heads, p.head_dim, policy.max_splits);
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p.workspace) + DecodeWorkspaceLayout::kAlign - 1) &
                                       ~uintptr_t{DecodeWorkspaceLayout::kAlign - 1});
  a.ws_o = reinterpret_cast<float*>(base + layout.o);
  a.ws_ml = reinterpret_cast<float2*>(base + layout.ml);
  return a;
}

}  // namespace pagedmha::cuda
