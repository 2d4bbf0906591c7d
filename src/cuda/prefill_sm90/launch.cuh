// Host side of one Hopper prefill instantiation: the plan launch, the TMA decisions (the
// one place they are made: policy.h's kv_tma_ok / q_tma_ok, then the driver's encoder)
// and the persistent launch. Included by the per-head-dim instantiation files.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/common/attention_args.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/hopper/tensor_map.h"
#include "cuda/prefill_sm90/kernel.cuh"
#include "cuda/prefill_sm90/policy.h"

namespace pagedmha::cuda::sm90 {

template <class T>
constexpr CUtensorMapDataType tensor_map_dtype() {
  return std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

template <int D, class T, class KV>
void run_prefill(const detail::AttentionProblem& prob, const AttentionArgs& a, int num_sms, cudaStream_t stream) {
  constexpr bool kFp8 = !std::is_same<KV, T>::value;
  using Pol = PrefillPolicy<D, kFp8>;
  Sm90Params p{};
  p.a = a;
  p.pack = gqa_pack(a.group);
  p.head_groups = a.group / p.pack;
  p.space.cu_seqlens_q = prob.cu_seqlens_q;
  p.space.seq_lens = prob.seq_lens;
  p.space.batch = prob.batch;
  p.space.tokens = tokens_per_tile(Pol::kBlockM, p.pack);
  p.space.block_n = Pol::kBlockN;
  p.space.mask = MaskVariant{prob.causal, prob.window_left};
  char* ws = static_cast<char*>(prob.workspace);
  p.count = reinterpret_cast<const int*>(ws);
  p.list = reinterpret_cast<const int2*>(ws + PlanLayout::list_offset(prob.batch));
  plan_kernel<kPlanThreads, kPlanBuckets><<<1, kPlanThreads, 0, stream>>>(p.space, ws);
  PAGEDMHA_CUDA_CHECK_LAUNCH();

  // Q: [rows][Hq][D], boxes of [tokens][pack][64].
  p.tma_q = q_tma_ok(a.q_fp8, a.q_row_stride * 2, a.q_head_stride * 2, prob.num_rows);
  if (p.tma_q) {
    const uint64_t dims[3] = {uint64_t(D), uint64_t(a.num_q_heads), uint64_t(prob.num_rows)};
    const uint64_t strides[2] = {uint64_t(a.q_head_stride) * 2, uint64_t(a.q_row_stride) * 2};
    const uint32_t box[3] = {64, uint32_t(p.pack), uint32_t(p.space.tokens)};
    p.tma_q = encode_tensor_map(&p.tm_q, tensor_map_dtype<T>(), 3, a.q, dims, strides, box);
  }
  // K / V: [pages][page_size][Hkv][D], boxes of [kv_box_rows][64] of one head.
  const detail::KvCacheDesc& kv = prob.kv;
  p.kv_box_rows = kv_box_rows(kv.page_size, Pol::kBlockN);
  p.tma_kv = kv_tma_ok(kFp8, kv.page_size, Pol::kBlockN, kv.k.data, kv.v.data, kv.k.page_stride * 2,
                       kv.k.token_stride * 2, kv.k.head_stride * 2, kv.v.page_stride * 2, kv.v.token_stride * 2,
                       kv.v.head_stride * 2, kv.num_pages);
  if (p.tma_kv) {
    const uint64_t dims[4] = {uint64_t(D), uint64_t(kv.num_kv_heads), uint64_t(kv.page_size), uint64_t(kv.num_pages)};
    const uint32_t box[4] = {64, 1, uint32_t(p.kv_box_rows), 1};
    const uint64_t ks[3] = {uint64_t(kv.k.head_stride) * 2, uint64_t(kv.k.token_stride) * 2,
                            uint64_t(kv.k.page_stride) * 2};
    const uint64_t vs[3] = {uint64_t(kv.v.head_stride) * 2, uint64_t(kv.v.token_stride) * 2,
                            uint64_t(kv.v.page_stride) * 2};
    p.tma_kv = encode_tensor_map(&p.tm_k, tensor_map_dtype<T>(), 4, kv.k.data, dims, ks, box) &&
               encode_tensor_map(&p.tm_v, tensor_map_dtype<T>(), 4, kv.v.data, dims, vs, box);
  }
  launch_prefill_kernel<Pol, T, KV>(p, num_sms, stream);
}

}  // namespace pagedmha::cuda::sm90
