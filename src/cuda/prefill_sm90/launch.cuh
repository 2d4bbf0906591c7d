// Host side of one Hopper prefill instantiation: the load-path decisions (the one place
// they are made: paged_kv.cuh's kv_tma_ok, policy.h's q_tma_ok / cluster_size, then the driver's
// encoder), the plan launch and the persistent launch. Included by the per-head-dim
// instantiation files.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/common/attention_args.cuh"
#include "cuda/common/grid.h"
#include "cuda/common/launch.cuh"
#include "cuda/hopper/paged_kv.cuh"
#include "cuda/hopper/tensor_map.h"
#include "cuda/prefill_sm90/kernel.cuh"
#include "cuda/prefill_sm90/policy.h"

namespace pagedmha::cuda::sm90 {

/// CTAs of the persistent grid: one per SM, or as many clusters as fit, less sm_margin
/// SMs in whole clusters (at least one cluster).
template <class Pol, class T, class KV, class Variant>
int grid_of(int cluster, int device, int num_sms, int sm_margin) {
  static int grids[2][64] = {};  // per cluster size and device, computed once
  int& grid = grids[cluster - 1][device & 63];
  if (grid == 0) grid = persistent_grid<Pol, T, KV, Variant>(cluster, num_sms);
  if (grid == 0) throw Error("batch_prefill: no cluster of " + std::to_string(cluster) + " CTAs fits this device");
  return units_left(grid / cluster, sm_margin, cluster) * cluster;
}

/// The plan and the persistent launch of one policy (the K / V load path is decided).
template <class Pol, class T, class KV>
void run_prefill_with(const detail::AttentionProblem& prob, const AttentionArgs& a, Sm90Params& p, int num_sms,
                      cudaStream_t stream) {
  constexpr int D = Pol::kHeadDim;
  constexpr bool kFp8 = Pol::kFp8Kv;
  constexpr bool tma = Pol::kKvTma;
  p.tma_kv = tma && !kFp8;
  p.tma_raw = tma && kFp8;
  p.cluster = cluster_size(a.group, p.tma_kv);
  p.pack = gqa_pack(a.group / p.cluster);
  p.head_groups = a.group / p.pack;
  p.space.cu_seqlens_q = prob.cu_seqlens_q;
  p.space.seq_lens = prob.seq_lens;
  p.space.batch = prob.batch;
  p.space.tokens = tokens_per_tile(Pol::kBlockM, p.pack);
  p.space.mask = prob.mask();
  // The soft-cap's code only where a soft-cap is set (device_variant.cuh).
  const bool cap = a.cap_log2 > 0.0f;
  const int grid =
      cap ? grid_of<Pol, T, KV, DeviceVariant<true>>(p.cluster, prob.device.index, num_sms, prob.sm_margin)
          : grid_of<Pol, T, KV, DeviceVariant<false>>(p.cluster, prob.device.index, num_sms, prob.sm_margin);
  const int per_entry = a.num_kv_heads * (p.head_groups / p.cluster), walkers = grid / p.cluster;
  p.item_div = {cutlass::FastDivmod(per_entry), cutlass::FastDivmod(p.head_groups / p.cluster)};
  p.walkers = cutlass::FastDivmod(walkers);
  p.pack_div = cutlass::FastDivmod(p.pack);
  char* ws = static_cast<char*>(prob.workspace);
  p.count = reinterpret_cast<const int*>(ws);
  p.list = reinterpret_cast<const int4*>(ws + PlanLayout::list_offset(prob.batch));
  plan_kernel<kPlanThreads, kPlanBuckets, Pol::kBlockN>
      <<<1, kPlanThreads, 0, stream>>>(p.space, plan_min_pairs(walkers, per_entry), ws);
  PAGEDMHA_CUDA_CHECK_LAUNCH();

  // Q: [rows][Hq][D], boxes of [tokens][pack][64]. A 16-bit query of another type than
  // the GEMMs' (policy.h kMmaF16: bf16 with fp8 KV) lands the same way and the producer
  // converts it in shared memory.
  p.tma_q = q_tma_ok(a.q_fp8, a.q_row_stride * 2, a.q_head_stride * 2, prob.num_rows);
  p.q_convert = !std::is_same<MmaType<Pol, T>, T>::value;
  static_assert(std::is_same<MmaType<Pol, T>, T>::value ||
                    (std::is_same<T, __nv_bfloat16>::value && std::is_same<MmaType<Pol, T>, __half>::value),
                "Producer::finish_q converts bf16 into fp16 only");
  if (p.tma_q) {
    const uint64_t dims[3] = {uint64_t(D), uint64_t(a.num_q_heads), uint64_t(prob.num_rows)};
    const uint64_t strides[2] = {uint64_t(a.q_head_stride) * 2, uint64_t(a.q_row_stride) * 2};
    const uint32_t box[3] = {64, uint32_t(p.pack), uint32_t(p.space.tokens)};
    p.tma_q = encode_tensor_map(&p.tm_q, tensor_map_dtype<T>(), 3, a.q, dims, strides, box);
  }
  if (cap) {
    launch_prefill_kernel<Pol, T, KV, DeviceVariant<true>>(p, grid, stream);
  } else {
    launch_prefill_kernel<Pol, T, KV, DeviceVariant<false>>(p, grid, stream);
  }
}

/// The TMA policy Pol when the cache allows its boxes (its tile decides them): true
/// once launched.
template <class Pol, class T, class KV>
bool try_prefill_tma(const detail::AttentionProblem& prob, const AttentionArgs& a, Sm90Params& p, int num_sms,
                     cudaStream_t stream) {
  if (PAGEDMHA_SM90_FORCE_GATHER ||
      !kv_tensor_maps<Pol::kHeadDim, T, Pol::kFp8Kv>(prob.kv, Pol::kBlockN, p.tm_k, p.tm_v, p.geo)) {
    return false;
  }
  run_prefill_with<Pol, T, KV>(prob, a, p, num_sms, stream);
  return true;
}

template <int D, class T, class KV>
void run_prefill(const detail::AttentionProblem& prob, const AttentionArgs& a, int num_sms, cudaStream_t stream) {
  constexpr bool kFp8 = !std::is_same<KV, T>::value;
  Sm90Params p{};
  p.a = a;
  if constexpr (D == 256 && !kFp8) {  // short launches: 64-key tiles (policy.h kD256ShortQ)
    if (d256_tma_block_n(prob.max_q_len) == 64 &&
        try_prefill_tma<PrefillPolicy<D, false, true, 64>, T, KV>(prob, a, p, num_sms, stream)) {
      return;
    }
  }
  if constexpr (D == 64 && kFp8 && PAGEDMHA_SM90_FP8_WG3 != 0) {  // 192-row tiles where they pay
    const int pack = gqa_pack(a.group / cluster_size(a.group, /*kv_tma=*/false));  // run_prefill_with's, fp8
    if (fp8_rows192_pays(prob.num_rows, prob.batch, prob.max_q_len, pack, int64_t{a.num_kv_heads} * (a.group / pack),
                         units_left(num_sms, prob.sm_margin)) &&
        try_prefill_tma<PrefillPolicy<D, true, true, 0, 192>, T, KV>(prob, a, p, num_sms, stream)) {
      return;
    }
  }
  if (try_prefill_tma<PrefillPolicy<D, kFp8, true>, T, KV>(prob, a, p, num_sms, stream)) return;
  // The gather's tile may differ from the TMA policy's (policy.h kBlockN).
  p.geo = PageGeometry::make(prob.kv.page_size, 0);
  run_prefill_with<PrefillPolicy<D, kFp8, false>, T, KV>(prob, a, p, num_sms, stream);
}

}  // namespace pagedmha::cuda::sm90
