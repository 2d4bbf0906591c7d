// A request's split-KV decomposition, shared by the decode kernels (decode_kernel.cuh,
// decode_sm90/kernel.cuh) and the merge (merge_kernel.cuh): it depends only on the
// request's own visible key count and the problem's constants (policy.h), never on the
// batch, so a request gives bitwise the same result in any batch.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/attention_args.cuh"
#include "cuda/decode/policy.h"

namespace pagedmha::cuda {

/// A request's split-KV decomposition: its key tiles [t0, t0 + nt) (tiles of a.split_tile
/// keys covering the keys any of its queries can see) and the split count.
struct DecodeSplit {
  int t0, nt, count;
};

/// Depends only on L and the problem's constants (never the batch).
__device__ __forceinline__ DecodeSplit decode_split(const AttentionArgs& a, int L) {
  const int tile = a.split_tile;
  const int first = static_cast<int>(a.mask.first_key(L, a.q_len_per_req));
  DecodeSplit s;
  s.t0 = first / tile;
  s.nt = max((L + tile - 1) / tile - s.t0, 0);
  const int keys = max(L - first, 0);
  const int want = a.forced_splits > 0 ? a.forced_splits : (keys + a.split_keys - 1) / a.split_keys;
  s.count = max(1, min(want, a.max_splits));
  return s;
}

/// The most splits a request of the call can have (host, from the arguments alone:
/// policy.h decode_max_split_count at the most keys a request reads, the mask's bound or
/// its page-table row's, whichever is smaller). It sizes the decode grid and the merge's.
inline int decode_max_split_count(const AttentionArgs& a) {
  const int64_t window = a.mask.max_keys_read(a.q_len_per_req);
  const int64_t keys = window < 0 ? a.seq_len_bound : std::min(window, a.seq_len_bound);
  return decode_max_split_count(a.forced_splits, a.split_keys, a.max_splits, keys);
}

}  // namespace pagedmha::cuda
