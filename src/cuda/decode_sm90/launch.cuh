// Host side of the Hopper decode: the dispatch condition (policy.h, then paged_kv.cuh's
// kv_tma_ok through the tensor maps) and the launches (decode grid, then the merge when
// a request may split). Included by the per-head-dim instantiation files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/common/arch.h"
#include "cuda/common/attention_args.cuh"
#include "cuda/common/grid.h"
#include "cuda/common/launch.cuh"
#include "cuda/decode_sm90/kernel.cuh"
#include "cuda/decode_sm90/policy.h"
#include "cuda/hopper/paged_kv.cuh"

namespace pagedmha::cuda {

// The merge is instantiated once, in the portable decode's translation units
// (decode/decode_hd{64,128}.cu, built for every architecture): an instantiation here,
// built for sm_90a only, could be the copy the linker keeps for the portable decode too,
// and an A100 or L40 would then find no kernel image for its merge.
extern template void launch_decode_merge<64, __nv_bfloat16>(const AttentionArgs&, int, int, cudaStream_t);
extern template void launch_decode_merge<64, __half>(const AttentionArgs&, int, int, cudaStream_t);
extern template void launch_decode_merge<128, __nv_bfloat16>(const AttentionArgs&, int, int, cudaStream_t);
extern template void launch_decode_merge<128, __half>(const AttentionArgs&, int, int, cudaStream_t);

namespace sm90 {

/// Runs batch_decode on the Hopper kernel with kRows-row tiles and kItemHeads KV heads per
/// work item (a: the launcher's arguments, split policy set; KV: T or fp8_e4m3); false,
/// with nothing launched, when the cache's layout takes no TMA box (of kItemHeads heads).
template <int D, class T, class KV, int kRows, int kItemHeads = 1>
bool run_decode_rows(const detail::AttentionProblem& prob, const AttentionArgs& args, int sm_count,
                     cudaStream_t stream) {
  constexpr bool kFp8 = sizeof(KV) == 1;
  using Pol = DecodePolicy<D, kFp8, kRows, kItemHeads>;
  constexpr auto kernel = decode_sm90_kernel<D, T, KV, kRows, kItemHeads>;
  if (args.group * args.q_len_per_req > kRows) return false;
  DecodeSm90Params p{};
  if (!kv_tensor_maps<D, T, kFp8>(prob.kv, Pol::kTileKeys, p.tm_k, p.tm_v, p.geo, /*fp8_swizzled=*/true,
                                  kItemHeads)) {
    return false;
  }
  p.a = args;
  p.a.split_tile = Pol::kTileKeys;
  p.a.row_chunks = 1;
  // Resident CTAs per SM (at most Pol::kCtasPerSm), once per device with the shared
  // memory limit raised: a grid of more would run in two waves.
  static std::atomic<int> per_sm_cache[kMaxDevices];
  const int per_sm = once_per_device(per_sm_cache, prob.device.index, [] {
    allow_dynamic_smem(kernel, Pol::kSmemBytes);
    int n = 0;
    PAGEDMHA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, Pol::kThreads, Pol::kSmemBytes));
    return std::clamp(n, 1, Pol::kCtasPerSm);
  });
  const int max_count = decode_max_split_count(p.a);
  const int64_t max_items = static_cast<int64_t>(p.a.batch) * (p.a.num_kv_heads / kItemHeads) * max_count;
  const int grid = static_cast<int>(decode_grid_ctas(max_items, int64_t{units_left(sm_count, prob.sm_margin)} * per_sm));
  if (grid == 0) return true;  // no request
  kernel<<<grid, Pol::kThreads, Pol::kSmemBytes, stream>>>(p);
  PAGEDMHA_CUDA_CHECK_LAUNCH();
  if (max_count > 1) launch_decode_merge<D, T>(p.a, max_count, prob.device.index, stream);
  return true;
}

/// Runs batch_decode on the Hopper kernel when the call fits it, with the row tile of
/// policy.h decode_sm90_row_tile; false, with nothing launched, when it does not.
template <int D, class T, class KV>
bool run_decode(const detail::AttentionProblem& prob, const AttentionArgs& args, int sm_count, cudaStream_t stream) {
  if (!decode_sm90_rows_ok(D, args.group, args.q_len_per_req, args.q_fp8)) return false;
  switch (decode_sm90_row_tile(args.group, args.q_len_per_req)) {
    case 8:
      // Two KV heads per item where the cache allows (policy.h kItemHeads), else one.
      if constexpr (D == 64 && (sizeof(KV) == 1 || kDecodeSm90Pairs16)) {
        if (decode_sm90_pairs_ok(D, sizeof(KV) == 1, args.num_kv_heads) &&
            run_decode_rows<D, T, KV, 8, 2>(prob, args, sm_count, stream)) {
          return true;
        }
      }
      return run_decode_rows<D, T, KV, 8>(prob, args, sm_count, stream);
    case 16:
      return run_decode_rows<D, T, KV, 16>(prob, args, sm_count, stream);
    default:
      if constexpr (D == 64) return run_decode_rows<D, T, KV, 32>(prob, args, sm_count, stream);
      return false;
  }
}

}  // namespace sm90
}  // namespace pagedmha::cuda
